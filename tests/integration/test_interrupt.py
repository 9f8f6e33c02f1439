"""Ctrl-C in the middle of a sweep: running jobs are cancelled, finished rows stay readable, and
the message says how to resume, and the lock is released for that resume."""

from __future__ import annotations

import signal
import subprocess
import time

import pytest

from orchestrator.store.lock import LOCK_FILE
from orchestrator.store.schema import read_results
from tests.integration.conftest import bench_processes, start_sweep

pytestmark = pytest.mark.integration

SWEEP = """\
name: it-interrupt
models:
  - {id: python:workers.toy:mlp, name: mlp}
  - {id: python:tests.faulty:hang, name: hang, timeout_s: 600}
batch_sizes: [1]
configs:
  dynamo: {backend: eager}
measure: {warmup: 1, iterations: 3, flops: false}
"""


def test_ctrl_c_cancels_running_jobs_keeps_rows_and_says_how_to_resume(sweep_file, tmp_path):
    sweep = sweep_file(SWEEP)
    out, scratch = tmp_path / "out", tmp_path / "scratch"
    scratch.mkdir()
    driver = start_sweep(sweep, out, scratch, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    # Longest-expected-first puts both jobs level; wait until the MLP's row is on disk and the
    # hanging job is running, then press Ctrl-C.
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and driver.poll() is None:
        if read_results(out, columns=["job_id"]).num_rows == 1 and bench_processes(str(scratch)):
            break
        time.sleep(0.5)
    assert driver.poll() is None, driver.communicate()
    driver.send_signal(signal.SIGINT)
    try:
        stdout, stderr = driver.communicate(timeout=90)
    except subprocess.TimeoutExpired:  # say where the driver waits: SIGUSR1 dumps its threads' stacks
        driver.send_signal(signal.SIGUSR1)
        time.sleep(2)
        driver.kill()
        stdout, stderr = driver.communicate()
        for proc in bench_processes(str(scratch)):  # a job left behind would hold its cores for later tests
            proc.kill()
        pytest.fail(f"the driver did not exit within 90 s of Ctrl-C; its stacks:\n{stderr}")
    assert driver.returncode == 130, stderr
    assert "interrupted" in stderr and "--resume" in stderr and str(out) in stderr
    assert "1 running jobs were cancelled" in stderr

    table = read_results(out)
    assert table.num_rows == 1 and table.column("model").to_pylist() == ["mlp"]
    deadline = time.monotonic() + 30
    while bench_processes(str(scratch)) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not bench_processes(str(scratch)), "the cancelled job's process is still running"

    # The interrupted driver released its lock: a resume starts at once without a takeover.
    # (What a resume then runs, only the missing jobs, is test_output_safety's SIGKILL case.)
    assert not (out / LOCK_FILE).exists()
