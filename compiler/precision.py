"""Precision policies: what a sweep's `dtypes` entry (a job's `dtype`) does to the model and to the
process's float32 settings.

A policy is the dtype the weights and inputs are cast to, and the two process-wide float32
switches torch has: whether cuDNN may run float32 convolutions on TF32 tensor cores
(`torch.backends.cudnn.allow_tf32`, on by default) and the float32 matmul precision
(`torch.set_float32_matmul_precision`, "highest" by default: no TF32).

- `fp32`, the stock policy: float32 weights and **torch's defaults as they are** (cuDNN TF32 on,
  matmuls in float32). What a stock PyTorch user runs, and what sweeps default to. On a GPU with
  TF32 tensor cores (sm80+) its convolutions round their inputs to TF32.
- `fp32-strict`: float32 with TF32 off everywhere (IEEE float32 convolutions and matmuls), for
  users who need it. Before schema version 9 this was what `fp32` meant
  (`store.schema`: older rows read as `fp32-strict`).
- `tf32`: float32 weights, TF32 for matmuls too (`high`) and for convolutions.
- `bf16`, `fp16`: weights and inputs cast; the float32 switches at torch's defaults.

`apply_precision` (the job process) sets both switches to the policy's values, torch's defaults
where the policy says nothing, so a job measures the policy whatever the environment left set;
`explicit` is what a policy changes from torch's defaults, and all that `compiler.serving` sets in a
serving process. Every row records the values it ran under (`settings`).

Nothing here imports torch at module level: sweep validation reads the names.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

TORCH_DEFAULTS: dict[str, Any] = {"cudnn_allow_tf32": True, "matmul_precision": "highest"}
"""torch's own values of the process-wide float32 switches (torch 2.8-2.13)."""

UNIT_ROUNDOFF = {"fp32": 2.0**-24, "tf32": 2.0**-11, "fp16": 2.0**-11, "bf16": 2.0**-8}
"""Relative rounding error of one value in each format (half an ulp at 1): float32 keeps 23
mantissa bits, TF32 and float16 10, bfloat16 7."""


SENSITIVITY_STEPS = (1e-6, UNIT_ROUNDOFF["tf32"], UNIT_ROUNDOFF["bf16"])
"""Relative input changes a job's output sensitivity is measured at, in fp64
(`compiler.measure.sensitivity`, judged by `compiler.accuracy`): a tiny one (do the outputs depend
on the inputs at all?), and the rounding of TF32 and fp16 and of bf16 (does a change of that size
move the outputs smoothly, or does a saturated or discontinuous head jump?)."""


@dataclass(frozen=True)
class Policy:
    name: str
    weights: str
    """The dtype weights and floating-point inputs are cast to (a `torch` attribute name)."""
    cudnn_allow_tf32: bool
    matmul_precision: str
    rank: int
    """Nominal error order (`policies_within`): strict fp32, stock fp32, tf32, fp16, bf16. Each
    rounds more of the computation, or rounds it more coarsely, than the one before."""
    needs: str | None
    """The `compiler.capabilities.Capabilities` flag a class must have to run it natively."""
    help: str

    def settings(self) -> dict[str, Any]:
        """The process-wide float32 switches the policy runs under (every one of them)."""
        return {"cudnn_allow_tf32": self.cudnn_allow_tf32, "matmul_precision": self.matmul_precision}

    def explicit(self) -> dict[str, Any]:
        """The switches it sets to other than torch's defaults (all a serving process changes)."""
        return {k: v for k, v in self.settings().items() if TORCH_DEFAULTS[k] != v}

    def unit_roundoff(self, tf32_cores: bool) -> float:
        """The coarsest rounding the policy applies to any op, on a class with or without TF32
        tensor cores (without them TF32 runs as float32)."""
        if self.weights == "bfloat16":
            return UNIT_ROUNDOFF["bf16"]
        if self.weights == "float16":
            return UNIT_ROUNDOFF["fp16"]
        tf32 = self.cudnn_allow_tf32 or self.matmul_precision != "highest"
        return UNIT_ROUNDOFF["tf32" if tf32 and tf32_cores else "fp32"]


STOCK = "fp32"
"""The policy a stock PyTorch user runs an fp32 model under, and the sweeps' default."""
STRICT = "fp32-strict"

POLICIES: dict[str, Policy] = {
    p.name: p
    for p in (
        Policy(
            "fp32-strict",
            "float32",
            False,
            "highest",
            0,
            None,
            "float32 with TF32 off for convolutions and matmuls (IEEE float32 throughout)",
        ),
        Policy(
            "fp32",
            "float32",
            True,
            "highest",
            1,
            None,
            "float32 under torch's defaults: cuDNN may use TF32 for convolutions, matmuls stay float32",
        ),
        Policy(
            "tf32",
            "float32",
            True,
            "high",
            2,
            "tf32",
            "float32 weights, TF32 tensor cores for matmuls and convolutions",
        ),
        Policy("fp16", "float16", True, "highest", 3, "fp16", "float16 weights and inputs"),
        Policy("bf16", "bfloat16", True, "highest", 4, "bf16", "bfloat16 weights and inputs"),
    )
}
PRECISIONS: tuple[str, ...] = tuple(POLICIES)
PRECISION_ALIASES = {
    "float32": "fp32",
    "float": "fp32",
    "stock": "fp32",
    "strict": "fp32-strict",
    "ieee-fp32": "fp32-strict",
    "fp32_strict": "fp32-strict",
    "tfloat32": "tf32",
    "bfloat16": "bf16",
    "float16": "fp16",
    "half": "fp16",
}


def canonical_precision(name: str) -> str | None:
    """The canonical policy name for `name` (aliases such as float32 accepted), None if unknown."""
    name = PRECISION_ALIASES.get(name, name)
    return name if name in POLICIES else None


def policy(name: str) -> Policy:
    found = POLICIES.get(canonical_precision(name) or name)
    if found is None:
        raise ValueError(f"unknown precision policy {name!r}; valid: {', '.join(PRECISIONS)}")
    return found


def identity(name: str) -> str:
    """What a job id hashes for its policy. Before schema version 9 `fp32` meant what `fp32-strict`
    means now: the strict policy hashes as `fp32` did, so an output written then resumes as its
    jobs, and the stock `fp32` hashes apart, so those rows never pass for its own."""
    if name == STRICT:
        return STOCK
    return "fp32+torch-defaults" if name == STOCK else name


def weights_dtype(name: str):
    """The torch dtype of the policy's weights and inputs."""
    import torch

    return getattr(torch, policy(name).weights)


def current() -> dict[str, Any]:
    """The float32 switches this process runs under now."""
    import torch

    return {
        "cudnn_allow_tf32": bool(torch.backends.cudnn.allow_tf32),
        "matmul_precision": torch.get_float32_matmul_precision(),
    }


def write(settings: Mapping[str, Any]) -> None:
    """Set the float32 switches named in `settings` that this process does not have already. Never
    written again to the value it holds: torch keeps a second record of how a switch was set
    (`torch.backends.cuda.matmul.fp32_precision`: `none` untouched, `ieee` once "highest" was set),
    and Inductor's FX-graph cache key holds it, so a job that wrote the default would compile
    entries a serving process that never touched it cannot load (torch 2.13)."""
    import torch

    now = current()
    if "cudnn_allow_tf32" in settings and now["cudnn_allow_tf32"] != bool(settings["cudnn_allow_tf32"]):
        torch.backends.cudnn.allow_tf32 = bool(settings["cudnn_allow_tf32"])
    if "matmul_precision" in settings and now["matmul_precision"] != settings["matmul_precision"]:
        torch.set_float32_matmul_precision(settings["matmul_precision"])


def apply_precision(name: str):
    """Set both float32 switches to policy `name`'s values (torch's defaults where it says nothing)
    and return the dtype for weights and inputs."""
    write(policy(name).settings())
    return weights_dtype(name)
