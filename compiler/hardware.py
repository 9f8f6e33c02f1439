"""This process's hardware class and software stack, named as the orchestrator names them.

A GPU's class is the accelerator type Ray gives its node (`NVIDIA H100 80GB HBM3` -> `H100`,
`Tesla V100-SXM2-16GB` -> `V100`), computed here without Ray so that a serving process can find
its presets; a machine without a CUDA device is `cpu`. The stack is what a compile cache is only
valid for: torch (with its build tag), Triton, CUDA and the Python minor version; the driver is
recorded but does not invalidate a cache.
"""

from __future__ import annotations

import platform
import re
from typing import Any

CPU_CLASS = "cpu"

# Ray's rule (ray/_private/accelerators/nvidia_gpu.py), so a preset exported from a sweep on a
# Ray cluster names the class this process computes.
_NVIDIA_NAME = re.compile(r"\w+\s+((?:[A-Z]+\s+)*[A-Z0-9]*\d[A-Z0-9]*)")

STACK_KEYS = ("torch", "triton", "cuda", "python")
"""The stack fields a compile cache and a preset must match exactly."""


def accelerator_type(device_name: str | None) -> str | None:
    """The class Ray names an NVIDIA GPU of this name by."""
    if not device_name:
        return None
    match = _NVIDIA_NAME.match(device_name)
    found = match.group(1).replace(" ", "-") if match else None
    if found and len(found) > 1:
        return found
    cleaned = re.sub(r"^NVIDIA\s+", "", device_name).strip()
    return cleaned.replace(" ", "-") or None


def hardware_class(device: Any = None) -> str:
    """The class of `device` (a torch device or its string; default: CUDA device 0 if there is
    one, else the CPU)."""
    import torch

    dev = torch.device(device) if device is not None else None
    if dev is None:
        dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if dev.type != "cuda":
        return CPU_CLASS
    return accelerator_type(torch.cuda.get_device_name(dev)) or "GPU"


def software_stack() -> dict[str, str | None]:
    """torch, Triton, CUDA and Python versions of this process, and the GPU driver where NVML
    can tell."""
    import torch

    from compiler.env import _nvml, _version

    stack: dict[str, str | None] = {
        "torch": torch.__version__,
        "triton": _version("triton") or _version("pytorch-triton"),
        "cuda": torch.version.cuda,
        "python": ".".join(platform.python_version_tuple()[:2]),
        "driver": None,
    }
    if torch.cuda.is_available():
        stack["driver"] = _nvml(0).get("driver_version")
    return stack


def stack_mismatch(wanted: dict[str, Any], have: dict[str, Any]) -> list[str]:
    """The `STACK_KEYS` where `have` differs from `wanted`, as `key: wanted != have` lines."""
    return [f"{k} {wanted.get(k)} (here {have.get(k)})" for k in STACK_KEYS if wanted.get(k) != have.get(k)]
