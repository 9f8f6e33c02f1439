"""Ctrl-C in the middle of a sweep: running jobs are cancelled, finished rows stay readable, the
message says how to resume, the lock is released for that resume, and a job cancelled mid-autotune
keeps the kernel choices its compile had streamed, as a timed-out one does."""

from __future__ import annotations

import os
import signal
import subprocess
import time

import pytest

from compiler.kernels import read_choice_stream
from store.lock import LOCK_FILE
from store.schema import read_results, read_table
from tests.integration.conftest import bench_processes, start_sweep
from workers.bench import STALL_ENV

pytestmark = pytest.mark.integration

SWEEP = """\
name: it-interrupt
models:
  - {id: python:workers.toy:mlp, name: mlp, timeout_s: 600}
batch_sizes: [1]
configs:
  dynamo: {backend: eager}
  tuned: {options: {max_autotune: true}, freezing: true}
measure: {warmup: 1, iterations: 3, flops: false}
"""


def test_ctrl_c_cancels_running_jobs_keeps_rows_and_says_how_to_resume(sweep_file, tmp_path):
    sweep = sweep_file(SWEEP)
    out, scratch = tmp_path / "out", tmp_path / "scratch"
    scratch.mkdir()
    # The tuned job's CPU max-autotune compile (three packed_linear ops) stalls for good once one
    # op is timed and on disk (the test hook), so Ctrl-C lands mid-autotune however busy the
    # machine is; the eager job beside it (one core each) finishes.
    env = {**os.environ, STALL_ENV: "1"}
    driver = start_sweep(
        sweep,
        out,
        scratch,
        "--cpus-per-job",
        "1",
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and driver.poll() is None:
        streamed = sum(read_choice_stream(s)[0] for s in scratch.glob("job-*/*.jsonl"))
        if read_results(out, columns=["job_id"]).num_rows == 1 and streamed:
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
    assert "1 running job was cancelled" in stderr

    table = read_results(out)
    assert table.num_rows == 1 and table.column("config").to_pylist() == ["dynamo"]
    # the cancelled job: no results row (a resume runs it again), its one streamed op kept
    choices = read_table(out, "kernel_choices").to_pylist()
    assert choices and {r["op_index"] for r in choices} == {0} and all(r["partial"] for r in choices)
    assert {r["run_id"] for r in choices} == set(table.column("run_id").to_pylist())
    assert not {r["job_id"] for r in choices} & set(table.column("job_id").to_pylist())
    assert sum(r["is_winner"] for r in choices) == 1 and {r["op"] for r in choices} == {"packed_linear"}
    deadline = time.monotonic() + 30
    while bench_processes(str(scratch)) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not bench_processes(str(scratch)), "the cancelled job's process is still running"

    # The interrupted driver released its lock: a resume starts at once without a takeover.
    # (What a resume then runs, only the missing jobs, is test_output_safety's SIGKILL case.)
    assert not (out / LOCK_FILE).exists()
