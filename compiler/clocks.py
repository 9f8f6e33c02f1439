"""GPU clocks and state while a job times its calls, and opt-in clock locking, through NVML.

NVML comes from `nvidia-ml-py` (module `pynvml`), an optional dependency: without it, or on a
machine without an NVIDIA driver, every function here reports why it has no figure instead of
failing. Nothing here imports torch; the GPU is found from `CUDA_VISIBLE_DEVICES` (an index or a
`GPU-...` UUID, as Ray and schedulers set it), so the Ray task can use it too.

A clock read at the start of a job says nothing about the clocks during timing: an idle GPU sits
at its lowest clock (345 MHz on an H100) and boosts within milliseconds of work. `ClockSampler`
reads the SM and memory clocks, power, temperature and the clock-event ("throttle") reasons in a
background thread while the timed rounds run. NVML calls go through ctypes, which releases the
GIL, so the sampler costs the timed thread a few microseconds per sample.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from typing import Any

from compiler.env import cpu_numa_nodes, format_cpus, parse_cpus

SAMPLE_INTERVAL_S = 0.02

# nvmlClocksEventReason* bits (NVML's ABI, identical under the older "ThrottleReason" names).
EVENT_REASONS: dict[int, str] = {
    0x1: "gpu_idle",
    0x2: "applications_clocks_setting",
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x10: "sync_boost",
    0x20: "sw_thermal_slowdown",
    0x40: "hw_thermal_slowdown",
    0x80: "hw_power_brake_slowdown",
    0x100: "display_clock_setting",
}


def reason_names(mask: int) -> list[str]:
    """Names of the clock-event reasons set in an NVML bit mask (unknown bits as hex)."""
    names = [name for bit, name in EVENT_REASONS.items() if mask & bit]
    unknown = mask & ~sum(EVENT_REASONS)
    if unknown:
        names.append(f"0x{unknown:x}")
    return names


class NvmlUnavailable(RuntimeError):
    """NVML cannot be used here; the message says why (for a row's notes)."""


def _load_pynvml():
    try:
        import pynvml
    except ImportError as exc:
        raise NvmlUnavailable(
            "nvidia-ml-py is not installed (pip install 'compile-orchestrator[gpu]')"
        ) from exc
    try:
        pynvml.nvmlInit()
    except Exception as exc:  # NVMLError_LibraryNotFound, DriverNotLoaded, ...
        raise NvmlUnavailable(f"NVML did not initialize: {exc}") from exc
    return pynvml


def visible_device(position: int = 0, environ: dict[str, str] | None = None) -> str:
    """The NVML identity of the `position`-th visible CUDA device: an index ("3") or a UUID."""
    env = os.environ if environ is None else environ
    visible = [v.strip() for v in env.get("CUDA_VISIBLE_DEVICES", "").split(",") if v.strip()]
    if not visible:
        return str(position)
    if position >= len(visible):
        raise NvmlUnavailable(f"CUDA_VISIBLE_DEVICES={env['CUDA_VISIBLE_DEVICES']} has no device {position}")
    return visible[position]


def _handle(pynvml, device: str):
    try:
        if device.isdigit():
            return pynvml.nvmlDeviceGetHandleByIndex(int(device))
        return pynvml.nvmlDeviceGetHandleByUUID(device)
    except Exception as exc:
        raise NvmlUnavailable(f"NVML has no device {device!r}: {exc}") from exc


@contextmanager
def nvml_device(position: int = 0) -> Iterator[tuple[Any, Any]]:
    """(pynvml, handle) of the visible CUDA device; NVML shut down on exit."""
    pynvml = _load_pynvml()
    try:
        yield pynvml, _handle(pynvml, visible_device(position))
    finally:
        with suppress(Exception):
            pynvml.nvmlShutdown()


# --- sampling during timing ---------------------------------------------------------------------


@dataclass
class _Sample:
    t: float
    cpu: int | None
    """The core the timed (main) thread was on."""
    sm_mhz: int | None
    mem_mhz: int | None
    power_w: float | None
    temp_c: int | None
    reasons: int | None


def thread_cpu(tid: int) -> int | None:
    """The core a thread of this process last ran on (Linux: field 39 of its stat line)."""
    try:
        with open(f"/proc/self/task/{tid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[36])
    except (OSError, ValueError, IndexError):
        return None


def _read(pynvml, handle, t: float, tid: int | None = None) -> _Sample:
    def get(fn, *args):
        try:
            return fn(handle, *args)
        except Exception:  # a query this GPU or driver does not support: no figure for it
            return None

    reasons_fn = getattr(pynvml, "nvmlDeviceGetCurrentClocksEventReasons", None) or getattr(
        pynvml, "nvmlDeviceGetCurrentClocksThrottleReasons", None
    )
    power = get(pynvml.nvmlDeviceGetPowerUsage)
    return _Sample(
        t=t,
        cpu=thread_cpu(tid) if tid is not None else None,
        sm_mhz=get(pynvml.nvmlDeviceGetClockInfo, pynvml.NVML_CLOCK_SM),
        mem_mhz=get(pynvml.nvmlDeviceGetClockInfo, pynvml.NVML_CLOCK_MEM),
        power_w=power / 1000.0 if power is not None else None,
        temp_c=get(pynvml.nvmlDeviceGetTemperature, pynvml.NVML_TEMPERATURE_GPU),
        reasons=get(reasons_fn) if reasons_fn else None,
    )


@dataclass
class ClockSampler:
    """Samples the visible GPU's clocks in a background thread while the `with` block runs.

    `summary()` gives the results columns; `unavailable` says why there are none."""

    interval_s: float = SAMPLE_INTERVAL_S
    position: int = 0
    samples: list[_Sample] = field(default_factory=list)
    unavailable: str | None = None
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    _nvml: Any = None
    _tid: int | None = None

    def __enter__(self) -> ClockSampler:
        try:
            self._nvml = nvml_device(self.position)
            pynvml, handle = self._nvml.__enter__()
        except NvmlUnavailable as exc:
            self._nvml = None
            self.unavailable = str(exc)
            return self
        self._tid = threading.get_native_id()  # the thread that times the calls
        self.samples.append(_read(pynvml, handle, time.perf_counter(), self._tid))
        self._thread = threading.Thread(
            target=self._loop, args=(pynvml, handle), name="clock-sampler", daemon=True
        )
        self._thread.start()
        return self

    def _loop(self, pynvml, handle) -> None:
        while not self._stop.wait(self.interval_s):
            self.samples.append(_read(pynvml, handle, time.perf_counter(), self._tid))

    def __exit__(self, *exc) -> None:
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
        if self._nvml is not None:
            self._nvml.__exit__(None, None, None)

    def summary(self) -> dict[str, Any]:
        return summarize_samples(self.samples)


def summarize_samples(samples: list[_Sample]) -> dict[str, Any]:
    """The clock columns of a row from the samples taken during its timed rounds."""

    def values(attr: str) -> list:
        return [getattr(s, attr) for s in samples if getattr(s, attr) is not None]

    sm, mem, power, temp = values("sm_mhz"), values("mem_mhz"), values("power_w"), values("temp_c")
    cpus = values("cpu")
    reasons: set[str] = set()
    for mask in values("reasons"):
        reasons.update(reason_names(int(mask)))
    return {
        "clock_samples": len(samples),
        "sm_clock_mean_mhz": sum(sm) / len(sm) if sm else None,
        "sm_clock_min_mhz": min(sm) if sm else None,
        "sm_clock_max_mhz": max(sm) if sm else None,
        "mem_clock_mean_mhz": sum(mem) / len(mem) if mem else None,
        "power_mean_w": sum(power) / len(power) if power else None,
        "power_max_w": max(power) if power else None,
        "gpu_temp_max_c": max(temp) if temp else None,
        "throttle_reasons": sorted(reasons),
        "timing_cpus": format_cpus(cpus) if cpus else None,
        "timing_numa_nodes": cpu_numa_nodes(set(cpus)) if cpus else None,
    }


def combine_summaries(parts: list[dict[str, Any]]) -> dict[str, Any]:
    """One set of clock columns over several processes' timed rounds (sample-weighted means)."""
    parts = [p for p in parts if p.get("clock_samples")]
    if not parts:
        return {}
    total = sum(p["clock_samples"] for p in parts)

    def mean(key):
        got = [(p[key], p["clock_samples"]) for p in parts if p.get(key) is not None]
        weight = sum(n for _, n in got)
        return sum(v * n for v, n in got) / weight if weight else None

    def extreme(key, fn):
        got = [p[key] for p in parts if p.get(key) is not None]
        return fn(got) if got else None

    return {
        "clock_samples": total,
        "sm_clock_mean_mhz": mean("sm_clock_mean_mhz"),
        "sm_clock_min_mhz": extreme("sm_clock_min_mhz", min),
        "sm_clock_max_mhz": extreme("sm_clock_max_mhz", max),
        "mem_clock_mean_mhz": mean("mem_clock_mean_mhz"),
        "power_mean_w": mean("power_mean_w"),
        "power_max_w": extreme("power_max_w", max),
        "gpu_temp_max_c": extreme("gpu_temp_max_c", max),
        "throttle_reasons": sorted({r for p in parts for r in p.get("throttle_reasons") or []}),
        "timing_cpus": format_cpus(cpus)
        if (cpus := {c for p in parts for c in parse_cpus(p.get("timing_cpus") or "")})
        else None,
        "timing_numa_nodes": format_cpus(nodes)
        if (nodes := {n for p in parts for n in parse_cpus(p.get("timing_numa_nodes") or "")})
        else None,
    }


# --- locking ------------------------------------------------------------------------------------


@dataclass
class ClockLock:
    """The outcome of asking NVML to lock the SM clock: `locked_mhz` when it took, else `refused`."""

    device: str
    locked_mhz: int | None = None
    refused: str | None = None


@contextmanager
def locked_clocks(position: int = 0) -> Iterator[ClockLock]:
    """Lock the visible GPU's SM clock at its maximum for the block (as tritonbench does on A100
    and H100: 1410 and 1980 MHz), and reset it after. NVML allows this to root only, and some
    GPUs and virtualized hosts not at all: then the block runs unlocked and `refused` says why.

    A process killed with SIGKILL inside the block leaves the clock locked until
    `nvidia-smi -rgc` (or the next job that locks and resets it)."""
    try:
        device = visible_device(position)
    except NvmlUnavailable as exc:
        yield ClockLock(device="?", refused=str(exc))
        return
    lock = ClockLock(device=device)
    try:
        ctx = nvml_device(position)
        pynvml, handle = ctx.__enter__()
    except NvmlUnavailable as exc:
        lock.refused = str(exc)
        yield lock
        return
    try:
        try:
            mhz = int(pynvml.nvmlDeviceGetMaxClockInfo(handle, pynvml.NVML_CLOCK_SM))
            pynvml.nvmlDeviceSetGpuLockedClocks(handle, mhz, mhz)
            lock.locked_mhz = mhz
        except Exception as exc:
            lock.refused = _lock_refusal(exc, device)
        try:
            yield lock
        finally:
            if lock.locked_mhz is not None:
                with suppress(Exception):
                    pynvml.nvmlDeviceResetGpuLockedClocks(handle)
    finally:
        ctx.__exit__(None, None, None)


def _lock_refusal(exc: Exception, device: str) -> str:
    text = str(exc) or type(exc).__name__
    low = text.lower()
    if "permission" in low:
        fix = "run the Ray workers as root, or lock it yourself: sudo nvidia-smi -i {d} -lgc MHZ,MHZ"
    elif "not supported" in low:
        fix = "this GPU or host (a VM, a MIG slice) does not allow clock locking"
    else:
        fix = "see nvidia-smi -q -d CLOCK"
    return f"NVML refused to lock the SM clock of GPU {device} ({text}): {fix.format(d=device)}"


# --- GPU-local cores ----------------------------------------------------------------------------


def gpu_local_cpus(position: int = 0) -> set[int]:
    """The CPUs NVML reports as closest to the visible GPU (its NUMA node); empty if unknown."""
    try:
        with nvml_device(position) as (pynvml, handle):
            n_cpus = os.cpu_count() or 1
            words = pynvml.nvmlDeviceGetCpuAffinity(handle, (n_cpus + 63) // 64)
    except Exception:
        return set()
    cpus = set()
    for w, word in enumerate(words):
        for bit in range(64):
            if int(word) >> bit & 1:
                cpus.add(w * 64 + bit)
    return cpus
