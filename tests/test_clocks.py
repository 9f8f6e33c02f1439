"""compiler.clocks: sampling, summaries, clock locking and GPU lookup.

This machine has no NVIDIA driver, so the NVML library is stood in for by a small module with
pynvml's function names (NVML is not torch, Ray or pyarrow; the real one is exercised by
`tests/gpu`). Without any pynvml, the functions must say why they have no figure."""

from __future__ import annotations

import itertools
import sys
import time
import types

import pytest

from compiler import clocks


class FakeNVMLError(Exception):
    pass


def fake_pynvml(sm=(1980, 1980, 1410, 1980), reasons=(0, 0x1, 0x4, 0), lock_error: str | None = None):
    """A pynvml stand-in whose GPU 0 and GPU-abc report the given clock sequence."""
    mod = types.ModuleType("pynvml")
    mod.NVML_CLOCK_SM, mod.NVML_CLOCK_MEM, mod.NVML_TEMPERATURE_GPU = 1, 2, 0
    sm_values, reason_values = itertools.cycle(sm), itertools.cycle(reasons)
    mod.calls = []
    mod.nvmlInit = lambda: mod.calls.append("init")
    mod.nvmlShutdown = lambda: mod.calls.append("shutdown")

    def by_index(i):
        if i != 0:
            raise FakeNVMLError("Not Found")
        return "h0"

    mod.nvmlDeviceGetHandleByIndex = by_index
    mod.nvmlDeviceGetHandleByUUID = lambda u: "h0" if u == "GPU-abc" else by_index(99)
    mod.nvmlDeviceGetClockInfo = lambda h, kind: next(sm_values) if kind == 1 else 2619
    mod.nvmlDeviceGetMaxClockInfo = lambda h, kind: 1980
    mod.nvmlDeviceGetPowerUsage = lambda h: 350_000
    mod.nvmlDeviceGetTemperature = lambda h, kind: 41

    def no_temperature_query(h, kind):
        raise FakeNVMLError("Not Supported")

    mod.no_temperature_query = no_temperature_query
    mod.nvmlDeviceGetCurrentClocksEventReasons = lambda h: next(reason_values)

    def lock(h, lo, hi):
        if lock_error:
            raise FakeNVMLError(lock_error)
        mod.calls.append(("lock", lo, hi))

    mod.nvmlDeviceSetGpuLockedClocks = lock
    mod.nvmlDeviceResetGpuLockedClocks = lambda h: mod.calls.append("reset")
    mod.nvmlDeviceGetCpuAffinity = lambda h, n: [0b1010] + [0] * (n - 1)
    return mod


@pytest.fixture
def nvml(monkeypatch):
    def install(**kwargs):
        mod = fake_pynvml(**kwargs)
        monkeypatch.setitem(sys.modules, "pynvml", mod)
        return mod

    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    return install


@pytest.fixture
def no_nvml(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import pynvml raises ImportError


def test_reason_names():
    assert clocks.reason_names(0) == []
    assert clocks.reason_names(0x1 | 0x4) == ["gpu_idle", "sw_power_cap"]
    assert clocks.reason_names(0x40 | 0x10000) == ["hw_thermal_slowdown", "0x10000"]


@pytest.mark.parametrize(
    ("visible", "position", "expected"),
    [(None, 0, "0"), ("3", 0, "3"), ("2,5", 1, "5"), ("GPU-abc,GPU-def", 0, "GPU-abc"), (" 4 ", 0, "4")],
)
def test_visible_device(visible, position, expected):
    env = {} if visible is None else {"CUDA_VISIBLE_DEVICES": visible}
    assert clocks.visible_device(position, env) == expected


def test_visible_device_out_of_range():
    with pytest.raises(clocks.NvmlUnavailable, match="has no device 2"):
        clocks.visible_device(2, {"CUDA_VISIBLE_DEVICES": "0,1"})


def test_sampler_summarizes_what_it_read(nvml):
    mod = nvml()
    with clocks.ClockSampler(interval_s=0.001) as sampler:
        deadline = time.monotonic() + 10
        while len(sampler.samples) < 8 and time.monotonic() < deadline:
            time.sleep(0.001)
    s = sampler.summary()
    assert sampler.unavailable is None and s["clock_samples"] == len(sampler.samples) >= 8
    assert s["sm_clock_min_mhz"] == 1410 and s["sm_clock_max_mhz"] == 1980
    assert 1410 < s["sm_clock_mean_mhz"] < 1980
    assert s["mem_clock_mean_mhz"] == 2619 and s["power_mean_w"] == 350.0 and s["gpu_temp_max_c"] == 41
    assert s["throttle_reasons"] == ["gpu_idle", "sw_power_cap"]
    assert mod.calls[0] == "init" and mod.calls[-1] == "shutdown"


def test_sampler_finds_the_gpu_by_uuid(nvml, monkeypatch):
    nvml()
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-abc")
    with clocks.ClockSampler(interval_s=0.001) as sampler:
        pass
    assert sampler.unavailable is None and sampler.summary()["clock_samples"] >= 1


def test_sampler_tolerates_a_query_the_gpu_lacks(nvml):
    mod = nvml()
    mod.nvmlDeviceGetTemperature = mod.no_temperature_query
    with clocks.ClockSampler(interval_s=0.001) as sampler:
        pass
    s = sampler.summary()
    assert s["gpu_temp_max_c"] is None and s["sm_clock_max_mhz"] == 1980


def test_sampler_without_nvml_says_why(no_nvml):
    with clocks.ClockSampler() as sampler:
        pass
    assert "nvidia-ml-py is not installed" in sampler.unavailable
    assert sampler.summary()["clock_samples"] == 0


def test_sampler_on_a_gpu_nvml_does_not_know(nvml, monkeypatch):
    nvml()
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "7")
    with clocks.ClockSampler() as sampler:
        pass
    assert "NVML has no device '7'" in sampler.unavailable


def test_combine_summaries_weights_by_samples():
    a = {"clock_samples": 10, "sm_clock_mean_mhz": 1900.0, "sm_clock_min_mhz": 1800, "throttle_reasons": []}
    b = {
        "clock_samples": 30,
        "sm_clock_mean_mhz": 1500.0,
        "sm_clock_min_mhz": 345,
        "throttle_reasons": ["gpu_idle"],
    }
    c = clocks.combine_summaries([a, b, {"clock_samples": 0}])
    assert c["clock_samples"] == 40 and c["sm_clock_mean_mhz"] == pytest.approx(1600.0)
    assert c["sm_clock_min_mhz"] == 345 and c["throttle_reasons"] == ["gpu_idle"]
    assert clocks.combine_summaries([{"clock_samples": 0}]) == {}


def test_lock_sets_the_max_clock_and_resets_it(nvml):
    mod = nvml()
    with clocks.locked_clocks() as lock:
        assert lock.locked_mhz == 1980 and lock.refused is None
        assert ("lock", 1980, 1980) in mod.calls and "reset" not in mod.calls
    assert mod.calls[-2:] == ["reset", "shutdown"]


def test_lock_refused_for_permission_says_how_to_fix_it(nvml):
    mod = nvml(lock_error="Insufficient Permissions")
    with clocks.locked_clocks() as lock:
        assert lock.locked_mhz is None
    assert "NVML refused to lock the SM clock of GPU 0 (Insufficient Permissions)" in lock.refused
    assert "sudo nvidia-smi -i 0 -lgc" in lock.refused
    assert "reset" not in mod.calls  # nothing was locked, nothing to reset


def test_lock_without_nvml(no_nvml):
    with clocks.locked_clocks() as lock:
        assert lock.locked_mhz is None and "nvidia-ml-py" in lock.refused


def test_gpu_local_cpus(nvml):
    nvml()
    assert clocks.gpu_local_cpus() == {1, 3}


def test_gpu_local_cpus_without_nvml(no_nvml):
    assert clocks.gpu_local_cpus() == set()
