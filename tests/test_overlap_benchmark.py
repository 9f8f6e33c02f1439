"""benchmarks/overlap.py's comparison of an off and an on run (the runs themselves are
`orchestrate sweep`, with and without `--no-overlap`: tests/test_ahead.py), on two outputs
written by the project's own sink: the per-model job efficiency, the wall times, and an A/A
comparison by the regression rules that flags a real slowdown and nothing else."""

from __future__ import annotations

import json
import subprocess
import sys
from contextlib import closing
from datetime import datetime, timedelta, timezone
from pathlib import Path

from store.sink import ResultSink
from tests.test_regression import run_rows

ROOT = Path(__file__).resolve().parents[1]


def _write(out: Path, rows: list[dict], *, on: bool, start_s: int = 0) -> None:
    """The rows as one run: one job after another, 100 s each, of which `work` s compile and
    time; with the overlap on, 40 s of each job's later processes' start-up hidden."""
    with closing(ResultSink(out)) as sink:
        for i, row in enumerate(rows):
            work = 90.0 if on else 60.0
            row.update(
                started_at=datetime(2026, 1, 1, tzinfo=timezone.utc) + timedelta(seconds=start_s + i * 100),
                wall_s=100.0 if on else 130.0,
                phase_compile_s=work / 2,
                phase_timing_s=work / 2,
                phase_imports_s=(100.0 if on else 130.0) - work + (30.0 if on else 0.0),
                ahead_hidden_s=30.0 if on else 0.0,
                started_ahead=[False, True, True] if on else [False, False, False],
                ahead_off=None if on else "turned off for this run (--no-overlap)",
            )
            sink.add(row)


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(ROOT / "benchmarks/overlap.py"), *args], capture_output=True, text=True, cwd=ROOT
    )


def test_the_overlap_benchmark_reports_efficiency_wall_time_and_an_a_a_check(
    tmp_path, table_jobs, make_result
):
    _write(tmp_path / "off", run_rows(table_jobs, make_result, 11), on=False)
    _write(tmp_path / "on", run_rows(table_jobs, make_result, 12), on=True)
    done = _run("--compare", str(tmp_path / "off"), str(tmp_path / "on"), "--out", str(tmp_path / "s"))
    assert done.returncode == 0, done.stderr
    summary = json.loads((tmp_path / "s/overlap-summary.json").read_text())
    assert {
        "gpu",
        "efficiency_on",
        "efficiency_off",
        "wall_s_on",
        "wall_s_off",
        "aa_flagged",
    } <= summary.keys()
    models = {j.model.name for j in table_jobs.values()}
    assert set(summary["efficiency_on"]) == set(summary["efficiency_off"]) == models
    assert all(v == 0.9 for v in summary["efficiency_on"].values())
    assert all(abs(v - 60 / 130) < 1e-3 for v in summary["efficiency_off"].values())
    n = len(table_jobs)
    assert summary["wall_s_off"] == (n - 1) * 100 + 130 and summary["wall_s_on"] == n * 100
    assert summary["aa_flagged"] == [] and summary["started_ahead_on"] == f"{2 * n} of {2 * n}"
    assert "| model | job efficiency, overlap off | overlap on |" in done.stdout
    assert "flagged: none" in done.stdout

    # the on run 20% slower on the A100 cells: the A/A check flags them, and only them
    _write(tmp_path / "slow", run_rows(table_jobs, make_result, 12, slow={"A100": 1.2}), on=True)
    done = _run("--compare", str(tmp_path / "off"), str(tmp_path / "slow"), "--out", str(tmp_path / "s2"))
    flagged = json.loads((tmp_path / "s2/overlap-summary.json").read_text())["aa_flagged"]
    assert flagged and all(f.startswith("A100/") and f.endswith(": regression") for f in flagged), flagged


def test_the_overlap_benchmark_refuses_an_output_without_rows(tmp_path):
    (tmp_path / "off").mkdir()
    done = _run("--compare", str(tmp_path / "off"), str(tmp_path / "off"), "--out", str(tmp_path / "s"))
    assert done.returncode != 0 and "error:" in done.stderr, done.stderr


def test_the_published_overlap_summary_has_the_fields_the_results_page_reads():
    """docs/results/overlap-summary.json is the benchmark's output, unedited."""
    doc = json.loads((ROOT / "docs/results/overlap-summary.json").read_text())
    assert doc["gpu"].startswith("NVIDIA H100")
    assert set(doc["efficiency_on"]) == set(doc["efficiency_off"]) and doc["efficiency_on"]
    assert all(0 < v < 1 for v in (*doc["efficiency_on"].values(), *doc["efficiency_off"].values()))
    assert doc["wall_s_on"] > 0 and doc["wall_s_off"] > 0 and isinstance(doc["aa_flagged"], list)
