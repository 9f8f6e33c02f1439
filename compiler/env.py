"""The environment a job measured in: device, driver, CUDA, torch and Triton, clocks."""

from __future__ import annotations

import os
import platform
from collections.abc import Iterable
from importlib import metadata
from pathlib import Path
from typing import Any


def die_with_parent() -> bool:
    """Ask Linux to SIGKILL this process when its parent dies (PR_SET_PDEATHSIG), so a killed
    driver or Ray task never leaves a child behind; False where the call is not available."""
    import ctypes
    import signal

    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return False
    return True


def project_pythonpath(current: str | None, extra: Iterable[str] = ()) -> str:
    """PYTHONPATH for a subprocess that imports this project's packages: this checkout's root
    first (so it finds them the way this process did), then `extra`, then `current`'s entries
    (empty ones and repeats dropped)."""
    root = str(Path(__file__).resolve().parents[1])
    paths = [p for p in (current or "").split(os.pathsep) if p]
    return os.pathsep.join(dict.fromkeys([root, *extra, *paths]))


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _nvml(index: int) -> dict[str, Any]:
    """Driver version and current SM clock from NVML (nvidia-ml-py), where it is installed."""
    try:
        import pynvml
    except ImportError:
        return {}
    try:
        pynvml.nvmlInit()
        try:
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            driver = pynvml.nvmlSystemGetDriverVersion()
            return {
                "driver_version": driver.decode() if isinstance(driver, bytes) else driver,
                "sm_clock_mhz": int(pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_SM)),
                "sm_clock_max_mhz": int(pynvml.nvmlDeviceGetMaxClockInfo(handle, pynvml.NVML_CLOCK_SM)),
            }
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # NVML present but not usable (container without the library): no figure
        return {}


def describe(device: str) -> dict[str, Any]:
    """Environment columns of a result row, measured at the start of the job."""
    import torch

    env: dict[str, Any] = {
        "torch_version": torch.__version__,
        "triton_version": _version("triton") or _version("pytorch-triton"),
        "python_version": platform.python_version(),
        "cuda_version": torch.version.cuda,
    }
    if device == "cuda":
        env["device_name"] = torch.cuda.get_device_name(0)
        # CUDA_VISIBLE_DEVICES (set by Ray) maps our device 0 to a physical index NVML uses.
        import os

        visible = os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0].strip()
        env.update(_nvml(int(visible) if visible.isdigit() else 0))
    else:
        env["device_name"] = _cpu_name()
    return env


def format_cpus(cpus: Iterable[int]) -> str:
    """0,1,2,3,8 -> "0-3,8"."""
    ordered = sorted(set(cpus))
    parts: list[str] = []
    i = 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] == ordered[j] + 1:
            j += 1
        parts.append(str(ordered[i]) if i == j else f"{ordered[i]}-{ordered[j]}")
        i = j + 1
    return ",".join(parts)


def parse_cpus(text: str) -> set[int]:
    """ "0-3,8" -> {0, 1, 2, 3, 8}; raises ValueError on anything else."""
    cpus: set[int] = set()
    for part in filter(None, (p.strip() for p in text.split(","))):
        lo, _, hi = part.partition("-")
        first, last = int(lo), int(hi or lo)
        if first < 0 or last < first:
            raise ValueError(f"bad CPU range {part!r}")
        cpus.update(range(first, last + 1))
    return cpus
