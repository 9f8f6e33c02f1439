"""benchmarks/overlap.py's comparison of an off and an on run (the runs themselves are
`orchestrate sweep`, with and without `--no-overlap`: tests/test_ahead.py), on two outputs
written by the project's own sink: the per-model job efficiency, the wall times, and an A/A
comparison by the regression rules that flags a real slowdown and nothing else."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from contextlib import closing
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from store.sink import ResultSink
from tests.benchmark_scripts import load_benchmark
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
    # one decimal: a share just under a target must not print as meeting it (84.5% as 85%)
    assert all(f"| {m} | 46.2% | 90.0% |" in done.stdout for m in models), done.stdout
    assert "flagged: none" in done.stdout

    # one cold compile 50% slower: one value a run cannot decide it, a watch, listed apart
    rows = run_rows(table_jobs, make_result, 12)
    rows[0]["compile_s"] = rows[0]["compile_s"] * 1.5
    _write(tmp_path / "compile", rows, on=True)
    done = _run("--compare", str(tmp_path / "off"), str(tmp_path / "compile"), "--out", str(tmp_path / "s3"))
    summary = json.loads((tmp_path / "s3/overlap-summary.json").read_text())
    assert summary["aa_flagged"] == [] and len(summary["aa_watch"]) == 1, summary["aa_watch"]
    assert "cold compile" in summary["aa_watch"][0] and "undecided (watch)" in done.stdout

    # the on run 20% slower on the A100 cells: the A/A check flags them, and only them
    _write(tmp_path / "slow", run_rows(table_jobs, make_result, 12, slow={"A100": 1.2}), on=True)
    done = _run("--compare", str(tmp_path / "off"), str(tmp_path / "slow"), "--out", str(tmp_path / "s2"))
    flagged = json.loads((tmp_path / "s2/overlap-summary.json").read_text())["aa_flagged"]
    assert flagged and all(f.startswith("A100/") and f.endswith(": regression") for f in flagged), flagged


def test_the_sweep_wall_time_is_the_sweeps_own_makespan_summed_over_its_parts(
    tmp_path, table_jobs, make_result
):
    """Where the sweep recorded its makespan (`dispatch_s` in run.json: first dispatch to last
    row), that is the run's wall time, summed over the invocations of a sweep run in parts: a job
    that waited for its GPU began before its first process, which the rows' span cannot see."""
    from types import SimpleNamespace

    from store.runlog import finish_run, start_run

    _write(tmp_path / "off", run_rows(table_jobs, make_result, 11), on=False)
    _write(tmp_path / "on", run_rows(table_jobs, make_result, 12), on=True)
    spec = SimpleNamespace(name="t", source="t.yaml", raw={})
    for part, makespan in (("a", 400.0), ("b", 250.5)):
        start_run(tmp_path / "on", part, spec, ["sweep"], {}, planned=4, skipped=0)
        finish_run(tmp_path / "on", part, {"ok": 4}, dispatch_s=makespan)
    start_run(tmp_path / "on", "c", spec, ["sweep", "--resume"], {}, planned=4, skipped=4)  # nothing left
    done = _run("--compare", str(tmp_path / "off"), str(tmp_path / "on"), "--out", str(tmp_path / "s"))
    assert done.returncode == 0, done.stderr
    summary = json.loads((tmp_path / "s/overlap-summary.json").read_text())
    assert summary["wall_s_on"] == 650.5 and summary["wall_from"] == {"on": "dispatch_s", "off": "rows"}
    # a part killed before it recorded its makespan: the rows' span, not a sum missing that part
    start_run(tmp_path / "on", "d", spec, ["sweep", "--resume"], {}, planned=4, skipped=2)
    done = _run("--compare", str(tmp_path / "off"), str(tmp_path / "on"), "--out", str(tmp_path / "s"))
    summary = json.loads((tmp_path / "s/overlap-summary.json").read_text())
    assert summary["wall_from"]["on"] == "rows" and summary["wall_s_on"] == len(table_jobs) * 100


def test_a_suite_run_in_parts_is_summed_over_its_parts(tmp_path, table_jobs, make_result):
    """Each part is a whole off/on pair over some of the suite's jobs: the summary has every
    part's models, and each run's wall time is the sum of its parts'."""
    rows_off, rows_on = run_rows(table_jobs, make_result, 11), run_rows(table_jobs, make_result, 12)
    models = sorted({r["model"] for r in rows_off})
    first = set(models[: len(models) // 2])
    for part, keep in (("a", lambda r: r["model"] in first), ("b", lambda r: r["model"] not in first)):
        _write(tmp_path / part / "off", [r for r in rows_off if keep(r)], on=False)
        _write(tmp_path / part / "on", [r for r in rows_on if keep(r)], on=True)
    dirs = [str(tmp_path / part / side) for part in "ab" for side in ("off", "on")]
    done = _run("--compare", *dirs, "--out", str(tmp_path / "s"))
    assert done.returncode == 0, done.stderr
    summary = json.loads((tmp_path / "s/overlap-summary.json").read_text())
    assert sorted(summary["efficiency_on"]) == sorted(summary["efficiency_off"]) == models
    assert summary["parts"] == 2 and summary["aa_flagged"] == []
    n_a = sum(r["model"] in first for r in rows_on)
    n_b = len(rows_on) - n_a
    assert summary["wall_s_on"] == n_a * 100 + n_b * 100  # each part's span, one job after another
    assert summary["wall_s_off"] == (n_a - 1) * 100 + 130 + (n_b - 1) * 100 + 130
    odd = _run("--compare", *dirs[:3], "--out", str(tmp_path / "s"))
    assert odd.returncode == 2 and "pairs" in odd.stderr


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


def test_side_by_side_splits_the_gpus_and_cores_in_halves_or_says_why_not():
    halves = load_benchmark("overlap").halves
    got = halves(["0", "1", "2", "3"], list(range(64)))
    assert got == {
        "off": {"gpus": ["0", "1"], "cpus": list(range(32))},
        "on": {"gpus": ["2", "3"], "cpus": list(range(32, 64))},
    }
    assert halves(["0", "1", "2", "3"], list(range(64)), first="on") == {
        "on": {"gpus": ["0", "1"], "cpus": list(range(32))},
        "off": {"gpus": ["2", "3"], "cpus": list(range(32, 64))},
    }
    assert halves([], [0, 1]) == {"off": {"gpus": [], "cpus": [0]}, "on": {"gpus": [], "cpus": [1]}}
    with pytest.raises(SystemExit, match="3 are visible .*0,1,2.*CUDA_VISIBLE_DEVICES"):
        halves(["0", "1", "2"], list(range(48)))
    with pytest.raises(SystemExit, match="needs a core for each run"):
        halves(["0", "1"], [0])


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="two runs side by side need a core each")
def test_side_by_side_runs_both_at_once_each_on_its_own_gpus_and_cores(capfd):
    """Real processes: each sees only its half's GPUs and cores, both run at the same time, and
    each line of their output reaches the terminal marked with its run."""
    module = load_benchmark("overlap")
    cpus = sorted(os.sched_getaffinity(0))
    shares = module.halves(["0", "1"], cpus)
    code = (
        "import json, os, sys, time; start = time.time(); time.sleep(1.5); "
        "print(json.dumps({'cpus': sorted(os.sched_getaffinity(0)), "
        "'gpus': os.environ.get('CUDA_VISIBLE_DEVICES'), 'span': [start, time.time()]}))"
    )
    codes = module.run_side_by_side({w: [sys.executable, "-c", code] for w in ("off", "on")}, shares)
    assert codes == {"off": 0, "on": 0}
    seen = {}
    for line in capfd.readouterr().out.splitlines():
        for which in ("off", "on"):
            if line.startswith(f"[{which}] {{"):
                seen[which] = json.loads(line[len(which) + 3 :])
    assert seen["off"]["cpus"] == shares["off"]["cpus"] and seen["off"]["gpus"] == "0"
    assert seen["on"]["cpus"] == shares["on"]["cpus"] and seen["on"]["gpus"] == "1"
    (a0, a1), (b0, b1) = seen["off"]["span"], seen["on"]["span"]
    assert max(a0, b0) < min(a1, b1)  # they overlapped in time
