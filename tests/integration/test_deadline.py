"""`--deadline`: a run that must end within a window (a batch job's walltime, a spot instance's
notice) stops as on Ctrl-C when its time is up, keeps every finished row, prints the command
that resumes it, and `--resume` finishes the work."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from store.schema import read_results
from tests.integration.conftest import ROOT, orchestrate

pytestmark = pytest.mark.integration

SWEEP = """\
name: it-deadline
models:
  - {id: python:workers.toy:mlp, name: mlp}
  - {id: python:tests.faulty:held, name: held}
batch_sizes: [2]
configs:
  aot: {backend: aot_eager}
measure: {warmup: 1, iterations: 3, flops: false}
"""


def test_a_sweep_stops_at_its_deadline_keeps_its_rows_and_resume_finishes(sweep_file, tmp_path):
    sweep = sweep_file(SWEEP)
    out = tmp_path / "out"
    hold = tmp_path / "hold"
    hold.touch()  # the held job runs until the test lets it go: surely running at the deadline
    proc = subprocess.run(
        [sys.executable, "-m", "orchestrator", "sweep", str(sweep), "--out", str(out), "--deadline", "15"]
        + ["--max-attempts", "1"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "CO_TEST_HOLD": str(hold), "PYTHONUNBUFFERED": "1"},
    )
    assert proc.returncode == 130, proc.stderr[-3000:]
    said = proc.stdout + proc.stderr
    assert "the deadline (--deadline) passed: " in said, said[-3000:]
    [command] = re.findall(r"Resume with:\n  (.+)", said)
    # the resume keeps the run's own flags (they choose the work), not the deadline
    assert command == f"orchestrate sweep {sweep} --out {out} --max-attempts 1 --resume"
    # every row finished before the deadline is kept: those the progress reported, the held one not
    finished = re.findall(r"^\s*ok (\S+) in ", said, re.M)
    rows = read_results(out).to_pylist()
    assert sorted(r["job_name"] for r in rows) == sorted(finished)
    assert "cpu/held/bs2/fp32/aot" not in finished and all(r["status"] == "ok" for r in rows)

    hold.unlink()
    resumed = orchestrate("sweep", str(sweep), "--out", str(out), "--resume")
    assert f"{len(rows)} already done, {2 - len(rows)} to run" in resumed.stderr + resumed.stdout
    table = read_results(out)
    assert sorted(table.column("model").to_pylist()) == ["held", "mlp"]
    assert set(table.column("status").to_pylist()) == {"ok"}
