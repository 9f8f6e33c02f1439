"""workers.repeats: one row from the results of a job's processes (hand-built results)."""

from __future__ import annotations

import pytest

from compiler.statistics import ratio_interval, split_groups
from workers.repeats import latency_fields, merge


def process(k: int, eager: list[float], compiled: list[float], **extra) -> dict:
    result = {
        "status": "ok",
        "compile_s": 20.0 if k == 1 else 3.0 + k,
        "subprocess_s": 30.0 if k == 1 else 12.0,
        "phase_start_s": 0.1,
        "phase_imports_s": 2.0,
        "phase_build_s": 1.0,
        "phase_eager_s": 1.5,
        "phase_compile_s": 20.0 if k == 1 else 3.0 + k,
        "phase_compiled_warmup_s": 0.5,
        "phase_timing_s": 2.0,
        "fxgraph_cache_hits": None if k == 1 else 1,
        "fxgraph_cache_misses": None if k == 1 else 0,
        "eager_b2b_ms": 4.0 + k,
        "compiled_b2b_ms": 2.0,
        "clock_samples": 10,
        "sm_clock_mean_mhz": 1900.0 + k * 10,
        "sm_clock_min_mhz": 1800 + k,
        "sm_clock_max_mhz": 1980,
        "throttle_reasons": ["gpu_idle"] if k == 2 else [],
        **latency_fields([eager], [compiled]),
        **extra,
    }
    if k == 1:
        result.update(phase_flops_s=0.3, phase_accuracy_s=1.2, flops=10**9, max_rel_err=0.0)
    return result


E1, C1 = [5.0, 5.1, 4.9, 5.2], [2.5, 2.6, 2.4, 2.5]
E2, C2 = [6.0, 6.1, 5.9], [3.0, 3.1, 2.9]
E3, C3 = [5.5, 5.4, 5.6, 5.5], [2.7, 2.8, 2.6, 2.7]


def test_one_process_row_says_its_interval_covers_one_process():
    row = merge(process(1, E1, C1), [])
    assert row["repeats"] == 1 and row["ci_scope"] == "one process"
    assert row["samples_per_repeat"] == [4] and row["job_processes"] == 1
    assert row["repeat_compile_s"] == [20.0] and row.get("warm_compile_s") is None
    assert row["phase_compile_s"] == 20.0 and row["phase_flops_s"] == 0.3


def test_three_processes_pool_samples_and_widen_the_interval():
    row = merge(process(1, E1, C1), [process(2, E2, C2), process(3, E3, C3)])
    assert row["status"] == "ok" and row["repeats"] == 3 and row["ci_scope"] == "processes"
    assert row["eager_samples_ms"] == E1 + E2 + E3 and row["compiled_samples_ms"] == C1 + C2 + C3
    assert row["samples_per_repeat"] == [4, 3, 4]
    assert split_groups(row["eager_samples_ms"], row["samples_per_repeat"]) == [E1, E2, E3]
    assert row["eager_repeat_ms"] == [pytest.approx(5.05), 6.0, 5.5]
    iv = ratio_interval([E1, E2, E3], [C1, C2, C3], paired=True)
    assert (row["speedup_ci_low"], row["speedup_ci_high"]) == (iv.low, iv.high)
    assert row["speedup_ci_between_share"] == iv.between_share
    assert row["eager_ci_low"] < 5.5 < row["eager_ci_high"]  # the processes' eager medians disagree
    # warm compile: the later processes' compiles; their cache counters from the first of them
    assert row["repeat_compile_s"] == [20.0, 5.0, 6.0] and row["warm_compile_s"] == 5.5
    assert (row["warm_cache_hits"], row["warm_cache_misses"]) == (1, 0)
    # phases summed over processes; FLOPs and accuracy ran once; TFLOP/s follow the pooled median
    assert row["phase_compile_s"] == 31.0 and row["phase_imports_s"] == 6.0 and row["phase_flops_s"] == 0.3
    assert row["subprocess_s"] == 54.0 and row["job_processes"] == 3
    assert row["eager_tflops"] == pytest.approx(1e9 / (row["eager_ms"] * 1e-3) / 1e12)
    assert row["eager_b2b_ms"] == 6.0  # median over processes of 5, 6, 7
    # clocks over all timed rounds
    assert row["clock_samples"] == 30 and row["sm_clock_min_mhz"] == 1801
    assert row["sm_clock_mean_mhz"] == pytest.approx(1920.0) and row["throttle_reasons"] == ["gpu_idle"]


def test_a_failed_repeat_fails_the_row_and_keeps_what_was_measured():
    crashed = {
        "status": "crash",
        "error": "job process killed by SIGSEGV in phase 'timing'",
        "subprocess_s": 4.0,
    }
    row = merge(process(1, E1, C1), [process(2, E2, C2), crashed])
    assert row["status"] == "crash"
    assert row["error"].startswith("repeat 3 of 3 (a fresh process compiling warm): job process killed")
    assert row["repeats"] == 2 and row["samples_per_repeat"] == [4, 3]  # the crashed one timed nothing
    assert row["job_processes"] == 3


def test_separate_warm_compile_process_with_one_repeat():
    warm = {
        "status": "ok",
        "compile_s": 2.5,
        "fxgraph_cache_hits": 2,
        "fxgraph_cache_misses": 0,
        "subprocess_s": 8,
    }
    row = merge(process(1, E1, C1), [], warm)
    assert row["warm_compile_s"] == 2.5 and row["warm_cache_hits"] == 2 and row["job_processes"] == 2
    assert row["repeats"] == 1 and row["repeat_compile_s"] == [20.0]
    failed = merge(process(1, E1, C1), [], {"status": "timeout", "error": "slow", "subprocess_s": 1.0})
    assert failed["status"] == "ok" and "warm compile timeout: slow" in failed["notes"]


def test_accuracy_columns_are_the_worst_process_s():
    """Every process checks its compiled output by the fp64 rule; the row shows the worst one."""
    first = process(1, E1, C1, max_abs_err=1e-6, rmse_eager=2e-7, rmse_compiled=1e-7)
    second = process(2, E2, C2, max_abs_err=4e-6, max_rel_err=3e-6, rmse_eager=2e-7, rmse_compiled=3e-7)
    row = merge(first, [second, process(3, E3, C3)])
    assert row["max_abs_err"] == 4e-6 and row["max_rel_err"] == 3e-6 and row["rmse_compiled"] == 3e-7
    assert row["rmse_eager"] == 2e-7
    assert merge(first, [])["max_abs_err"] == 1e-6
