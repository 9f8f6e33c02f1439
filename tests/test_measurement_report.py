"""reports.measurement on hand-built rows: the sweep-to-sweep verdict, rounds, phases, clocks."""

from __future__ import annotations

import json

import pytest

from reports import measurement
from workers.repeats import latency_fields


def sweep(eager: list[list[float]], compiled: list[list[float]], probes: list[float] | None = None) -> dict:
    row = {"status": "ok", "compile_s": 15.0, "warm_compile_s": 3.0, "wall_s": 80.0}
    row.update(latency_fields(eager, compiled))
    row["host_probe_us"] = probes or []
    return row


def steady(level: float, n: int = 20, step: float = 0.01) -> list[float]:
    return [level * (1 + step * ((i % 5) - 2)) for i in range(n)]


def test_sweeps_that_agree_meet_the_target():
    rows = [sweep([steady(5.0 + 0.01 * k)] * 3, [steady(2.5)] * 3) for k in range(5)]
    text, met = measurement.spread_table(rows)
    assert met and "| speedup |" in text and "**met**" in text


def test_a_sweep_whose_interval_misses_the_median_and_a_wide_spread_miss_the_target():
    rows = [sweep([steady(5.0)] * 3, [steady(2.5)] * 3) for _ in range(4)]
    rows.append(sweep([steady(6.0)] * 3, [steady(2.5)] * 3))  # 20% off, with a tight interval
    text, met = measurement.spread_table(rows)
    assert not met and "**missed**" in text
    assert "| speedup | 20.00% | 2.000 | 4 of 5 |" in text


def test_failed_sweeps_are_listed_and_left_out_of_the_spread():
    rows = [sweep([steady(5.0)], [steady(2.5)]), {"status": "timeout", "error": "slow"}]
    assert "| 2 | timeout | slow |" in measurement.sweep_table(rows)
    assert measurement.spread_table(rows) == ("fewer than two ok sweeps: no spread", False)


def test_rounds_pair_each_probe_with_its_round():
    # 2 processes x 10 calls in 5 rounds of 2 calls; round k of process p runs at level 1 + k + 10p
    eager = [[float(1 + k + 10 * p) for k in range(5) for _ in range(2)] for p in range(2)]
    compiled = [[x / 2 for x in g] for g in eager]
    probes = [float(100 * p + k) for p in range(2) for k in range(5)]
    got = measurement.rounds_of(sweep(eager, compiled, probes), rounds=5)
    assert got == [
        (100.0 * p + k, 1.0 + k + 10 * p, (1.0 + k + 10 * p) / 2) for p in range(2) for k in range(5)
    ]
    assert measurement.rounds_of(sweep(eager, compiled, probes[:3]), rounds=5) == []  # probes missing


def test_host_speed_table_splits_rounds_into_thirds():
    eager = [[float(1 + k) for k in range(9) for _ in range(2)]]
    probes = [float(k) for k in range(9)]
    text = measurement.host_speed_table(
        {"cell": [sweep(eager, [[x / 2 for x in eager[0]]], probes)]}, rounds=9
    )
    assert "| cell | fastest third | 3 | 1.0 | 2.000 | 1.000 | 2.000 | 1.00 / 1.00 |" in text
    assert "| cell | slowest third | 3 | 7.0 | 8.000 | 4.000 | 2.000 |  |" in text


def test_phase_table_shares_of_the_wall_time():
    row = {"model": "m", "batch_size": 1, "config": "default", "wall_s": 100.0, "job_processes": 3}
    row.update({f"phase_{p}_s": 10.0 for p in measurement.PHASES})
    row["job_efficiency"] = 0.2
    text = measurement.phase_table([row])
    assert (
        f"| m bs1 default | 3 | 100.0 |{' 10.0 (10%) |' * len(measurement.PHASES)} 0.0 (0%) | 20% |" in text
    )


def test_render_from_saved_files(tmp_path):
    rows = [sweep([steady(5.0)] * 3, [steady(2.5)] * 3) for _ in range(3)]
    path = tmp_path / "noise.json"
    path.write_text(json.dumps({"args": {"repeats": 3, "rounds": 10}, "cells": {"c/bs1": rows}}))
    text = measurement.render(
        gpu="H100", noise=[measurement.load_noise(path)], phases=[], notes="## Notes\nx"
    )
    assert text.startswith("# Numbers that hold from process to process: H100\n\n## Notes\nx\n")
    assert "## c/bs1: 3 separate sweeps of 3 processes" in text and "**met**" in text


@pytest.mark.parametrize("missing", ["sm_clock_mean_mhz", "power_mean_w"])
def test_clock_table_tolerates_missing_columns(missing):
    row = {
        "model": "m",
        "batch_size": 1,
        "config": "d",
        "sm_clock_mhz": 345,
        "sm_clock_mean_mhz": 1980.0,
        "sm_clock_min_mhz": 1980,
        "sm_clock_max_mhz": 1980,
        "power_mean_w": 150.0,
        "power_max_w": 200.0,
    }
    row.pop(missing)
    assert "| m bs1 d | 345 |" in measurement.clock_table([row])
