"""The environment a job measured in: device, driver, CUDA, torch and Triton, clocks."""

from __future__ import annotations

import contextlib
import os
import platform
from collections.abc import Iterable
from importlib import metadata
from pathlib import Path
from typing import Any


def die_with_parent(signum: int | None = None) -> bool:
    """Ask Linux to send this process `signum` (default SIGKILL) when its parent dies
    (PR_SET_PDEATHSIG), so a killed driver or Ray task never leaves a child behind; False where
    the call is not available. Linux clears it in a forked child: it protects one process, not
    its descendants (see `guard_process_group`)."""
    import ctypes
    import signal

    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        return libc.prctl(1, signal.SIGKILL if signum is None else signum) == 0  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return False


GUARD_NAME = b"co-job-guard"
"""The guard's process name (`ps -o comm`, /proc/PID/comm); its command line is its leader's."""


def guard_process_group() -> int | None:
    """Fork a guard that SIGKILLs this process's whole process group as soon as this process is
    gone, however it ended (SIGKILL included: the kernel tells the guard through
    PR_SET_PDEATHSIG), so that nothing it started outlives it: Inductor's compile workers, the
    `g++` they run, a model's own helpers. Every descendant is in the group unless it left it.

    Only for a process that leads a group of its own (started with `start_new_session=True`),
    since a group shared with the parent must not be killed; call it early, before any thread
    starts. Returns the guard's pid; None where this process leads no group or the platform has
    no parent-death signal. The guard also ends the group when it is itself sent SIGTERM (as the
    runner's `kill_tree` does), SIGHUP or SIGINT."""
    import ctypes
    import signal

    leader = os.getpid()
    if os.getpgrp() != leader or not hasattr(os, "fork"):
        return None
    wake = {signal.SIGTERM, signal.SIGHUP, signal.SIGINT}
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, wake)  # pending until sigwait, none lost
    pid = os.fork()
    if pid:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        return pid
    try:  # the guard: only this block runs in it, and it never returns to the caller's code
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL("libc.so.6").prctl(15, GUARD_NAME)  # PR_SET_NAME
        if not die_with_parent(signal.SIGTERM):
            os._exit(0)  # no parent-death signal here: a guard could never wake, so none
        if os.getppid() == leader:  # else the leader died before the prctl: end the group now
            signal.sigwait(wake)
        os.killpg(leader, signal.SIGKILL)  # the group outlives its leader while the guard is in it
    finally:
        os._exit(0)


def project_pythonpath(current: str | None, extra: Iterable[str] = ()) -> str:
    """PYTHONPATH for a subprocess that imports this project's packages: this checkout's root
    first (so it finds them the way this process did), then `extra`, then `current`'s entries
    (empty ones and repeats dropped)."""
    root = str(Path(__file__).resolve().parents[1])
    paths = [p for p in (current or "").split(os.pathsep) if p]
    return os.pathsep.join(dict.fromkeys([root, *extra, *paths]))


def cold_caches(folder: str | Path) -> dict[str, str]:
    """Environment settings under which a process starts with a fresh node's caches, empty, in
    `folder`: Inductor's (Triton's under it) and the CUDA driver's JIT cache (`CUDA_CACHE_PATH`:
    PTX compiled for this GPU at run time, kept across processes in `~/.nv/ComputeCache` by
    default), so a prepare timed there is what a new node's first start pays."""
    return {"TORCHINDUCTOR_CACHE_DIR": f"{folder}/inductor", "CUDA_CACHE_PATH": f"{folder}/cuda-jit"}


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


def pci_numa_node(bus_id: str | None, sys_root: str = "/sys") -> int | None:
    """The host NUMA node a PCI device hangs off, from sysfs (`bus_id` as NVML writes it,
    ``00000000:1B:00.0``, or as sysfs does, ``0000:1b:00.0``); None where the host reports none
    (-1: one node, or a VM that hides them) or the device is not found."""
    if not bus_id or ":" not in bus_id:
        return None
    domain, _, rest = bus_id.strip().partition(":")
    try:
        name = f"{int(domain, 16):04x}:{rest.lower()}"
        with open(f"{sys_root}/bus/pci/devices/{name}/numa_node") as f:
            node = int(f.read().strip())
    except (OSError, ValueError):
        return None
    return node if node >= 0 else None


def cpu_numa_nodes(cpus: Iterable[int], sys_root: str = "/sys") -> str | None:
    """The NUMA nodes of `cpus` (sysfs `cpuN/nodeK`), as `format_cpus` writes a set ("0" or
    "0-1"); None where sysfs shows no node for any of them."""
    nodes: set[int] = set()
    for cpu in cpus:
        try:
            names = os.listdir(f"{sys_root}/devices/system/cpu/cpu{cpu}")
        except OSError:
            continue
        nodes.update(int(n[4:]) for n in names if n.startswith("node") and n[4:].isdigit())
    return format_cpus(nodes) if nodes else None


def _nvml(index: int) -> dict[str, Any]:
    """Driver version, current SM clock and which GPU of the host this is (its NVML index, UUID,
    PCI bus id and NUMA node) from NVML (nvidia-ml-py), where it is installed."""
    try:
        import pynvml
    except ImportError:
        return {}
    try:
        pynvml.nvmlInit()
        try:
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            driver = pynvml.nvmlSystemGetDriverVersion()
            found: dict[str, Any] = {
                "driver_version": driver.decode() if isinstance(driver, bytes) else driver,
                "sm_clock_mhz": int(pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_SM)),
                "sm_clock_max_mhz": int(pynvml.nvmlDeviceGetMaxClockInfo(handle, pynvml.NVML_CLOCK_SM)),
                "gpu_index": index,
            }
            with contextlib.suppress(Exception):  # which card: never at the cost of the figures above
                uuid = pynvml.nvmlDeviceGetUUID(handle)
                found["gpu_uuid"] = uuid.decode() if isinstance(uuid, bytes) else uuid
                bus = pynvml.nvmlDeviceGetPciInfo(handle).busId
                found["gpu_pci_bus_id"] = bus = bus.decode() if isinstance(bus, bytes) else bus
                found["gpu_numa_node"] = pci_numa_node(bus)
            return found
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


def process_facts() -> dict[str, Any]:
    """What of this process can change how fast it prepares and serves a model, beside the GPU:
    the cores it may run on (`cpus`, as `format_cpus` writes them), their NUMA nodes and
    torch's intra-op threads."""
    import os

    import torch

    cpus = os.sched_getaffinity(0)
    return {
        "cpus": format_cpus(cpus),
        "cpu_numa_nodes": cpu_numa_nodes(cpus),
        "threads": torch.get_num_threads(),
    }


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
