"""Timings that cannot be trusted are marked by every reader, and never decided on.

A real sweep of the smoke file's MLP cells on the embedded local Ray while busy loops run on every
core the jobs may use (real processes, pinned one per core): every job's row must say that other
processes took its cores (`host_other_share`, `compiler.statistics.trust`), the sweep's closing
summary, `report` (text and Markdown) and the HTML page must mark every cell, and `presets` must
leave every cell undecided with the reason. Then the same cells on the host as it is: the config
`presets` picks for a cell is the report's fastest, or both leave it undecided.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from compiler import statistics as cstats
from compiler.statistics.thresholds import THRESHOLDS_ENV
from store.schema import read_results
from tests.integration.conftest import ROOT, orchestrate
from workers.affinity import LOCK_DIR_ENV, reserve_cores

pytestmark = [pytest.mark.integration, pytest.mark.slow]

SMOKE = ROOT / "sweeps" / "smoke.yaml"
ONLY = "mlp"
CELLS = {("mlp", 1), ("mlp", 4)}


def _busy_loops() -> list[subprocess.Popen]:
    """A busy loop pinned to each core this process may use (so to every core a job can pin)."""
    code = "import os, sys\nos.sched_setaffinity(0, {int(sys.argv[1])})\nwhile True:\n    pass\n"
    return [
        subprocess.Popen([sys.executable, "-c", code, str(cpu)]) for cpu in sorted(os.sched_getaffinity(0))
    ]


def _report_fastest(text: str) -> dict[tuple[str, int], str]:
    """The text report's `fastest` column per (model, batch) of the cpu class (columns are two or
    more spaces apart; a cell's own words one)."""
    lines = text.split("[cpu]")[1].strip().splitlines()
    assert re.split(r"\s{2,}", lines[0].strip())[-1] == "fastest", lines[0]
    out = {}
    for line in lines[2:]:
        if not line.strip():
            break
        parts = re.split(r"\s{2,}", line.strip())
        out[(parts[0], int(parts[1]))] = parts[-1]
    return out


def test_busy_cores_mark_every_cell_and_presets_leave_them_undecided(tmp_path: Path, monkeypatch):
    monkeypatch.delenv(THRESHOLDS_ENV)  # the project's own limits, not the suite's trusting ones
    out = tmp_path / "busy"
    loops = _busy_loops()
    try:
        sweep = orchestrate("sweep", str(SMOKE), "--out", str(out), "--only", ONLY, timeout=900)
    finally:
        for p in loops:
            p.kill()
            p.wait()
    rows = [r for r in read_results(out).to_pylist() if r["status"] == "ok"]
    assert len(rows) == 4, [(r["job_name"], r["status"]) for r in read_results(out).to_pylist()]
    for r in rows:  # the condition the test made is in every row, and read as a doubt
        assert max(r["host_other_share"]) > cstats.load_thresholds().doubt_other_share, r["host_other_share"]
        assert any("other processes took" in d for d in cstats.timing_doubts(r)), r["job_name"]

    # the sweep's closing summary names every doubted cell and the command that measures them again
    assert f"{cstats.MARK} timing doubted on 4 of 4 ok cells" in sweep.stdout, sweep.stdout
    for r in rows:
        assert f"{cstats.MARK} {r['job_name']}: other processes took" in sweep.stdout
    assert "--only 'cpu/mlp/bs1/fp32/default," in sweep.stdout

    # report: every speedup marked, every cell undecided, the reasons listed; text and Markdown
    text = orchestrate("report", str(out)).stdout
    fastest = _report_fastest(text)
    assert set(fastest) == CELLS and set(fastest.values()) == {f"undecided {cstats.MARK}"}, text
    assert "timing doubted (4 rows)" in text
    markdown = (out / "report.md").read_text()
    assert markdown.count(f" {cstats.MARK} |") >= 4 and "timing doubted (4 rows)" in markdown
    html = tmp_path / "report.html"
    orchestrate("report", str(out), "--html", str(html))
    assert "other processes took" in html.read_text()

    # presets: no cell decided on those timings, each undecided with the reason
    presets = orchestrate("presets", str(out)).stdout
    assert presets.count("undecided, timing doubted") == 2, presets
    data = json.loads((out / "presets.json").read_text())
    assert data["presets"] == []
    assert {(m["model"], m["batch_size"]) for m in data["no_preset"] if m.get("undecided")} == CELLS
    # export: nothing decided, so nothing to ship: refused, each cell named with the command that
    # measures it again, before any compile and without a --dest left behind
    dest = tmp_path / "export"
    refused = orchestrate("export", str(out), "--hardware", "cpu", "--dest", str(dest), check=False)
    assert refused.returncode == 2 and "nothing to export" in refused.stderr, refused.stderr
    assert "undecided, timing doubted" in refused.stderr and "--only 'cpu/mlp/bs1/fp32/*'" in refused.stderr
    assert not dest.exists()

    # the same cells on the host as it is: presets and the report agree on every cell
    quiet = tmp_path / "quiet"
    orchestrate("sweep", str(SMOKE), "--out", str(quiet), "--only", ONLY, timeout=900)
    fastest = _report_fastest(orchestrate("report", str(quiet)).stdout)
    orchestrate("presets", str(quiet))
    data = json.loads((quiet / "presets.json").read_text())
    picked = {(p["model"], p["batch_size"]): p["config"] for p in data["presets"]}
    undecided = {(m["model"], m["batch_size"]) for m in data["no_preset"] if m.get("undecided")}
    for cell, config in fastest.items():
        if config == f"undecided {cstats.MARK}":
            assert cell in undecided and cell not in picked, (cell, data["no_preset"])
        else:
            assert picked.get(cell) == config, (cell, picked, fastest)


def test_cores_held_by_another_sweep_are_warned_of_and_its_jobs_doubted(tmp_path: Path, monkeypatch):
    """Another sweep's jobs hold every core of this machine (their core locks, held here): the sweep
    says so before it runs anything, its job runs unpinned, and its timing is doubted for it."""
    monkeypatch.delenv(THRESHOLDS_ENV)
    locks = tmp_path / "core-locks"
    monkeypatch.setenv(LOCK_DIR_ENV, str(locks))  # this test's own node-wide lock directory
    held = reserve_cores(len(os.sched_getaffinity(0)), directory=locks)
    assert held.pinned
    try:
        out = tmp_path / "held"
        sweep = orchestrate("sweep", str(SMOKE), "--out", str(out), "--only", "*/mlp/bs1/fp32/default")
    finally:
        held.release()
    cores = len(os.sched_getaffinity(0))
    assert f"warning: {cores} of this machine's {cores} cores are held by other jobs" in sweep.stderr, (
        sweep.stderr
    )
    assert "all 1 jobs will run unpinned" in sweep.stderr
    (row,) = read_results(out).to_pylist()
    assert row["status"] == "ok" and row["cpu_pinned"] is False and "were free" in row["notes"]
    assert any(d.startswith("ran unpinned: only 0 of the") for d in cstats.timing_doubts(row)), row["notes"]
    assert f"{cstats.MARK} cpu/mlp/bs1/fp32/default: " in sweep.stdout and "ran unpinned" in sweep.stdout
