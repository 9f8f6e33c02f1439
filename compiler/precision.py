"""Precision policies: what a sweep's `dtypes` entry does to the model and to matmul precision."""

from __future__ import annotations

import torch

PARAM_DTYPE = {"fp32": torch.float32, "tf32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def apply_precision(policy: str) -> torch.dtype:
    """Set the process-wide matmul precision for `policy` and return the dtype for weights and
    inputs. tf32 keeps fp32 tensors but lets matmuls and convolutions use TF32 tensor cores."""
    high = policy == "tf32"
    torch.set_float32_matmul_precision("high" if high else "highest")
    torch.backends.cudnn.allow_tf32 = high
    return PARAM_DTYPE[policy]
