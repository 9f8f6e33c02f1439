"""SIGKILL the driver mid-sweep, then --resume: exactly the planned rows, no duplicate job ids."""

from __future__ import annotations

import os
import signal
import subprocess
import time

import pytest

from orchestrator.store.schema import read_results
from tests.integration.conftest import bench_processes, orchestrate, planned_count, start_sweep

pytestmark = pytest.mark.integration

SWEEP = """\
name: it-resume
models:
  - {id: python:workers.toy:mlp, name: mlp}
batch_sizes: [1, 2]
configs:
  inductor: {}
  aot: {backend: aot_eager}
measure: {warmup: 1, iterations: 3, flops: false}
"""


def test_sigkill_then_resume_gives_exactly_the_planned_rows(sweep_file, tmp_path):
    sweep = sweep_file(SWEEP)
    out = tmp_path / "out"
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    planned = planned_count(sweep)
    assert planned == 4

    driver = start_sweep(sweep, out, scratch, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and driver.poll() is None:
        if read_results(out, columns=["job_id"]).num_rows >= 2:
            break
        time.sleep(0.5)
    assert driver.poll() is None, "the sweep finished before it could be killed; make it longer"
    first = read_results(out, columns=["job_id"]).num_rows
    assert 2 <= first < planned
    os.kill(driver.pid, signal.SIGKILL)
    driver.wait()

    # The job that was running dies with its Ray worker instead of running on as an orphan.
    deadline = time.monotonic() + 30
    while bench_processes(str(scratch)) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not bench_processes(str(scratch)), "a job process outlived the killed driver"

    proc = orchestrate("sweep", str(sweep), "--out", str(out), "--resume", "--scratch", str(scratch))
    assert f"{planned} jobs planned" in proc.stderr

    table = read_results(out)
    ids = table.column("job_id").to_pylist()
    assert len(ids) == planned
    assert len(set(ids)) == planned
    assert set(table.column("status").to_pylist()) == {"ok"}
    assert len(set(table.column("run_id").to_pylist())) == 2  # rows from before and after the kill
