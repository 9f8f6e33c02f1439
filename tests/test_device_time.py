"""Device time beside wall time, and the two rules the regression report judges a cell by, on
hand-built tables: a host-bound cell is judged on its device time (a 10% kernel slowdown shows
through process-to-process wall noise that hides it), a device-bound one on its wall time, a
host-overhead change counts when the wall time shows it; and no confident verdict from one
process per cell, unless history mode pools enough runs to estimate the process noise."""

from __future__ import annotations

import json
from contextlib import closing

import numpy as np
import pytest

from compiler import statistics as cstats
from compiler.measure import split_busy
from compiler.statistics.thresholds import _ADDED_IN_V2, _ADDED_IN_V3, _ADDED_IN_V4
from orchestrator.cli import main
from reports.regression import compare, compare_history, to_markdown
from store.rows import make_row
from store.schema import rows_to_table
from store.sink import ResultSink
from workers.repeats import device_fields, merge

CALLS, DEVICE_CALLS = 30, 20


def gpu_cell(
    rng: np.random.Generator,
    processes: int,
    wall_ms: float,
    device_ms: float,
    host_noise: float,
    kernel_slow: float = 1.0,
    host_slow: float = 1.0,
) -> dict:
    """A GPU row's latency and device-time columns: `processes` processes, each with its host
    `host_noise` off (it moves the wall time only: the launch gaps), calls 1% apart. A kernel
    slowdown multiplies device and wall time alike (the test hook's way); a host slowdown adds
    to the wall time only."""
    wall, device = [], []
    for _ in range(processes):
        host = 1 + host_noise * rng.standard_normal()
        gap = max(0.0, (wall_ms - device_ms) * host) * host_slow
        d = device_ms * kernel_slow
        wall += [
            float(x)
            for x in (d + gap + (wall_ms - device_ms) * (kernel_slow - 1))
            * (1 + 0.01 * rng.standard_normal(CALLS))
        ]
        device += [float(x) for x in d * (1 + 0.005 * rng.standard_normal(DEVICE_CALLS))]
    row = {
        "compiled_samples_ms": wall,
        "samples_per_repeat": [CALLS] * processes,
        "compiled_ms": float(np.median(wall)),
        "repeats": processes,
    }
    return row | device_fields(
        [device[i * DEVICE_CALLS : (i + 1) * DEVICE_CALLS] for i in range(processes)],
        [device[i * DEVICE_CALLS : (i + 1) * DEVICE_CALLS] for i in range(processes)],
        float(np.median(wall)),
        float(np.median(wall)),
    )


def rows(table_jobs, make_result, seed: int, processes: int = 3, only: str = "A100", **cell) -> list[dict]:
    """One row per A100 job of the conftest sweep: a host-bound cell shape by default (device busy
    40% of the wall time, each process's host 20% off)."""
    rng = np.random.default_rng(seed)
    out = []
    for _, job in sorted(table_jobs.items()):
        if job.hardware != only:
            continue
        params = {"wall_ms": 5.0, "device_ms": 2.0, "host_noise": 0.2} | cell
        extra = gpu_cell(rng, processes, **params)
        result = make_result("ok", 10.0, extra.pop("compiled_ms"), **extra)
        out.append(make_row(job, result, run_id=f"run-{seed}"))
    return out


def compared(table_jobs, make_result, current: dict, baseline: dict, seed: int, processes: int = 3):
    return compare(
        rows_to_table(rows(table_jobs, make_result, seed, processes, **current)),
        rows_to_table(rows(table_jobs, make_result, seed + 1000, processes, **baseline)),
    )


# --- the statistics module ------------------------------------------------------------------------


def test_host_bound_share_and_the_figure_it_picks():
    t = cstats.load_thresholds()
    assert cstats.host_bound_share(2.0, 5.0) == pytest.approx(0.6)
    assert cstats.host_bound_share(5.2, 5.0) == 0.0  # device longer than wall (separate calls): clipped
    assert cstats.host_bound_share(None, 5.0) is None
    assert cstats.judged_figure(0.6, t) == (
        "device",
        "device time: host-bound, the device idle 60% of the wall time",
    )
    assert cstats.judged_figure(0.05, t)[0] == "wall"
    assert cstats.judged_figure(None, t) == ("wall", "wall time (no device time measured)")


def test_one_process_is_undecided_unless_history_pools_enough():
    t = cstats.load_thresholds()
    assert cstats.undecided_reason(3, 3, t) is None
    reason = cstats.undecided_reason(1, 3, t)
    assert "this run (1 process)" in reason and "measure.repeats: 3" in reason
    assert "the baseline (1 process)" in cstats.undecided_reason(3, 1, t)
    assert cstats.undecided_reason(1, 1, t, history=True) is not None  # nothing to borrow from
    assert cstats.undecided_reason(1, 5, t, history=True) is None
    assert cstats.undecided_reason(1, 2, t, history=True) is not None  # 2 < noise_processes


def test_a_borrowed_process_spread_widens_a_one_process_interval():
    rng = np.random.default_rng(0)
    window = [list(c * (1 + 0.002 * rng.standard_normal(30))) for c in (1.0, 1.2, 0.9, 1.1, 0.95)]
    one = [list(1.0 * (1 + 0.002 * rng.standard_normal(30)))]
    plain = cstats.ratio_interval(one, window, paired=False)
    lent = cstats.ratio_interval(one, window, paired=False, borrow_between=True)
    assert lent.low < plain.low and lent.high > plain.high
    assert lent.processes == 5 and lent.scope == "processes" and plain.scope == "one process"


def test_a_version_1_thresholds_file_reads_with_the_new_keys_defaulted(tmp_path):
    old = tmp_path / "t.json"
    added = {**_ADDED_IN_V2, **_ADDED_IN_V3, **_ADDED_IN_V4}
    data = {k: v for k, v in vars(cstats.load_thresholds()).items() if k not in added}
    old.write_text(json.dumps({**data, "version": 1}))
    t = cstats.load_thresholds(old)
    assert (t.version, t.host_bound_share, t.min_processes, t.accuracy_bf16) == (4, 0.25, 2, 5e-2)
    assert (t.doubt_other_share, t.doubt_interval_ratio) == (0.25, 4.0)
    old.write_text(json.dumps({**vars(cstats.load_thresholds()), "host_bound_share": 1.5}))
    with pytest.raises(ValueError, match="host_bound_share must be between 0 and 1"):
        cstats.load_thresholds(old)
    old.write_text("null")
    with pytest.raises(ValueError, match="expected a JSON object"):
        cstats.load_thresholds(old)


# --- measurement bookkeeping ----------------------------------------------------------------------


def test_device_busy_time_is_the_union_of_each_calls_activities():
    marks = [(0.0, 0), (100.0, 1), (200.0, 0)]  # eager call, compiled call, eager call (us)
    busy = [(10, 30), (20, 40), (50, 60), (110, 115), (205, 215), (-5, -1)]  # overlap counts once
    assert split_busy(marks, busy, 2) == [[pytest.approx(0.04), pytest.approx(0.01)], [pytest.approx(0.005)]]
    assert split_busy([(0.0, 0), (10.0, 1)], [(1, 2)], 2) == [[pytest.approx(0.001)], []]


def test_device_columns_merge_over_processes_and_are_dropped_when_a_process_lacks_them():
    first = {"status": "ok", "eager_samples_ms": [5.0] * 4, "compiled_samples_ms": [4.0] * 4}
    first |= {"eager_device_samples_ms": [2.0] * 3, "compiled_device_samples_ms": [1.0] * 3}
    first |= {"host_cpu_mhz": [2400.0], "host_load_1m": [0.5], "timing_gc_collections": [3]}
    second = dict(first, compiled_device_samples_ms=[1.2] * 3, host_cpu_mhz=[None], timing_gc_collections=[0])
    row = merge(first, [second])
    assert row["host_cpu_mhz"] == [2400.0, None] and row["timing_gc_collections"] == [3, 0]
    assert row["device_samples_per_repeat"] == [3, 3]
    assert row["compiled_device_ms"] == pytest.approx(1.1)
    assert row["compiled_host_bound_share"] == pytest.approx(1 - 1.1 / 4.0)
    assert row["eager_host_bound_share"] == pytest.approx(0.6)
    lacking = merge(first, [{k: v for k, v in second.items() if "device" not in k}])
    assert lacking["compiled_device_ms"] is None and "device time measured in 1 of 2" in lacking["notes"]


# --- the report's rules ---------------------------------------------------------------------------


def test_host_bound_cells_a_a_is_quiet_and_a_kernel_slowdown_shows_through_host_noise(
    table_jobs, make_result
):
    for seed in range(5):
        aa = compared(table_jobs, make_result, {}, {}, seed)
        assert aa.counts()["regression"] == 0 and aa.counts()["improvement"] == 0, [
            c.reasons for c in aa.cells
        ]
        assert {c.judged_on for c in aa.cells} == {"device"}
    flagged = 0
    for seed in range(10):
        got = compared(table_jobs, make_result, {"kernel_slow": 1.10}, {}, 50 + seed)
        for c in got.cells:
            flagged += c.verdict == "regression"
            assert c.device_ratio == pytest.approx(1.10, abs=0.02)
        # the wall time alone could not tell: its interval spans the hosts' 20% spread
        assert any(c.latency_ci[0] < 1.03 for c in got.cells)
    assert flagged >= 0.9 * 10 * len(got.cells)
    cell = got.cells[0]
    assert cell.judged_on == "device" and any("judged on device time: host-bound" in r for r in cell.reasons)
    assert "device ms" in to_markdown(got)


def test_device_bound_cells_are_judged_on_wall_time(table_jobs, make_result):
    quiet = {"wall_ms": 5.0, "device_ms": 4.9, "host_noise": 0.02}
    got = compared(table_jobs, make_result, quiet | {"kernel_slow": 1.10}, quiet, 7)
    assert {c.judged_on for c in got.cells} == {"wall"}
    assert all(c.verdict == "regression" for c in got.cells)
    assert all("judged on wall time: device-bound" in c.reasons[-1] for c in got.cells)


def test_a_host_overhead_regression_counts_when_the_wall_time_shows_it(table_jobs, make_result):
    steady = {"host_noise": 0.01}  # a host-bound cell on a quiet host: 50% more Python per call
    got = compared(table_jobs, make_result, steady | {"host_slow": 1.5}, steady, 11)
    assert all(c.verdict == "regression" for c in got.cells)
    assert all(c.device_ratio == pytest.approx(1.0, abs=0.02) for c in got.cells)
    assert all("shown by the wall time" in c.reasons[-1] for c in got.cells)


def test_one_process_per_cell_is_watch_never_a_regression(table_jobs, make_result):
    got = compared(table_jobs, make_result, {"kernel_slow": 1.3}, {}, 21, processes=1)
    assert got.counts()["regression"] == 0 and got.counts()["watch"] == len(got.cells)
    assert got.undecided() == len(got.cells)
    assert all(c.reasons[0].startswith("undecided: one process per cell") for c in got.cells)
    assert all("(regression if decided:" in c.reasons[0] for c in got.cells)
    md = to_markdown(got)
    assert f"{len(got.cells)} cells left undecided (watch)" in md and "measure.repeats: 3" in md


def test_fail_on_regression_does_not_fail_on_undecided_cells(tmp_path, table_jobs, make_result, capsys):
    for name, slow in (("before", 1.0), ("after", 1.3)):
        with closing(ResultSink(tmp_path / name)) as sink:
            for row in rows(table_jobs, make_result, 31 if name == "after" else 32, 1, kernel_slow=slow):
                sink.add(row)
    args = [
        "report",
        str(tmp_path / "after"),
        "--baseline",
        str(tmp_path / "before"),
        "--fail-on",
        "regression",
    ]
    assert main(args) == 0
    assert "left undecided (watch)" in capsys.readouterr().out


def test_history_mode_decides_one_process_runs_from_the_windows_spread(table_jobs, make_result):
    def nights(slow_from: int | None) -> list:
        return [
            rows_to_table(
                rows(
                    table_jobs,
                    make_result,
                    600 + n,
                    1,
                    host_noise=0.05,
                    kernel_slow=1.2 if slow_from is not None and n >= slow_from else 1.0,
                )
            )
            for n in range(6)
        ]

    quiet = compare_history(nights(None))
    assert quiet.counts()["regression"] == 0 and quiet.undecided() == 0
    step = compare_history(nights(4))  # one process a night, the last two nights 20% slower
    assert step.counts()["regression"] == len(step.cells)
    assert all(
        "against 4 processes of the window" in r for c in step.cells for r in c.reasons if "compiled" in r
    )


def test_the_calibration_script_slows_wall_and_device_time_alike(tmp_path, capsys):
    """benchmarks/regression_aa.py on noise.py-shaped rows of a host-bound cell: every A/A pair
    unchanged, every slowed pair flagged, judged on device time."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "benchmarks" / "regression_aa.py"
    spec = importlib.util.spec_from_file_location("regression_aa", path)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    rng = np.random.default_rng(5)
    runs = [
        {"status": "ok", "device_name": "H100"} | gpu_cell(rng, 3, wall_ms=5.0, device_ms=2.0, host_noise=0.2)
        for _ in range(4)
    ]
    saved = tmp_path / "noise.json"
    saved.write_text(json.dumps({"cells": {"resnet-50/bs1/tf32/default": runs}}))
    assert script.main([str(saved), "--slowdown", "1.2"]) == 0
    out = capsys.readouterr().out
    assert "slowdown x1: {'unchanged': 6}" in out and "slowdown x1.2: {'regression': 6}" in out
    assert out.count("| device (idle") == 12


def test_a_cold_compile_time_is_decided_only_against_a_window_of_runs():
    t = cstats.load_thresholds()
    # two runs: 10.9 -> 17.6 s is what five A/A sweeps of one cell gave on an H100: a watch
    verdict, why = cstats.once_per_run_verdict(17.6, [10.9], t.compile_time_change, t.compile_time_floor_s, t)
    assert verdict == "watch" and "(regression if decided)" in why and "--history" in why
    assert cstats.once_per_run_verdict(11.5, [10.9], 0.25, 2.0, t) == ("unchanged", "")
    window = [10.9, 12.0, 11.2, 11.7, 12.3]
    verdict, why = cstats.once_per_run_verdict(24.0, window, 0.25, 2.0, t)
    assert verdict == "regression" and "5 reference runs" in why
    assert cstats.once_per_run_verdict(17.6, [10.9, 17.0, 11.2, 16.5, 12.3], 0.25, 2.0, t)[0] == "unchanged"
    assert cstats.once_per_run_verdict(5.0, window, 0.25, 2.0, t)[0] == "improvement"


def test_compile_time_in_the_report_watch_between_two_runs_decided_in_history(table_jobs, make_result):
    def run(seed: int, compile_s: float):
        out = rows(table_jobs, make_result, seed)
        for r in out:
            r["compile_s"] = compile_s
        return rows_to_table(out)

    two = compare(run(1, 30.0), run(2, 12.5))
    assert all(c.verdict == "watch" and c.by_figure == {"compile_time": "watch"} for c in two.cells)
    assert all(r.startswith("undecided: cold compile 12.5 -> 30.0 s") for c in two.cells for r in c.reasons)
    nights = [run(10 + n, 12.5 + 0.3 * (n % 3)) for n in range(6)] + [run(20, 30.0), run(21, 30.0)]
    got = compare_history(nights)
    assert all(c.verdict == "regression" and "compile_time" in c.regressed_on for c in got.cells)
