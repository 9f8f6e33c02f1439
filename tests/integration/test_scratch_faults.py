"""The harness's faults are not results, in real sweeps: a job's scratch that fills up under the
running job is a `harness_error` row, the sweep exits 3 and prints the command that runs it
again, and that command, once there is room, records the job's real result; a Ray task that
raises is a `harness_error` whose error keeps none of Ray's colour codes. The scratch's disk is a
small tmpfs of the test's own (root only: skipped elsewhere)."""

from __future__ import annotations

import io
import os
import re
import shlex
import subprocess
import time

import pyarrow.dataset as ds
import pytest

from orchestrator.fleet.driver import SweepOptions, run_sweep
from orchestrator.spec.sweep import parse_spec
from store.schema import read_results
from tests.integration.conftest import bench_processes, orchestrate, start_sweep

pytestmark = pytest.mark.integration

SWEEP = """\
name: it-full-scratch
models:
  - {id: python:tests.faulty:held, name: held}
batch_sizes: [1]
configs:
  default: {}  # Inductor: its compile writes its code and its library into the job's scratch
measure: {warmup: 1, iterations: 3, flops: false}
"""
UNFINISHED = re.compile(
    r"1 job failed for a fault of the harness, not of the model \(harness_error; the row's error says "
    r"why\): not finished\. Run it again with:\n  (?P<resume>.+)"
)


def _stop(driver: subprocess.Popen, scratch) -> str:
    """Kill a driver that did not end, and the job processes it left (they would hold cores)."""
    driver.kill()
    for proc in bench_processes(str(scratch)):
        proc.kill()
    return driver.communicate()[1]


def test_a_scratch_that_fills_up_under_a_running_job_is_run_again_by_resume(small_disk, sweep_file, tmp_path):
    sweep = sweep_file(SWEEP)
    disk = small_disk(64 << 20)
    scratch, out, hold = disk.path / "scratch", tmp_path / "out", tmp_path / "hold"
    hold.touch()  # the job waits in its build until the disk is full
    env = {**os.environ, "CO_TEST_HOLD": str(hold), "PYTHONUNBUFFERED": "1"}
    driver = start_sweep(
        sweep, out, scratch, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
    )
    try:
        deadline = time.monotonic() + 240
        while not (jobs := list(scratch.glob("job-*"))) or not bench_processes(str(jobs[0])):
            assert driver.poll() is None, ("the sweep ended before its job started", driver.communicate())
            assert time.monotonic() < deadline, "the job did not start"
            time.sleep(0.1)
        filler = disk.fill(leave=8 << 10)
    finally:
        hold.unlink()
    try:
        _, stderr = driver.communicate(timeout=300)
    except subprocess.TimeoutExpired:
        pytest.fail(f"the sweep did not end once its scratch filled up: {_stop(driver, scratch)}")

    assert driver.returncode == 3, stderr
    assert "Traceback" not in stderr, stderr
    said = UNFINISHED.search(stderr)
    assert said, stderr
    assert said["resume"] == f"orchestrate sweep {sweep} --out {out} --scratch {scratch} --resume"
    [row] = read_results(out).to_pylist()
    assert row["status"] == "harness_error", row["error"]
    # the cause first, from the scratch's filesystem; then what the job process itself said
    assert re.match(
        rf"the job's scratch {jobs[0]} filled up \(\d+(\.\d)? (B|KiB) free of 64 MiB\) while the job ran: "
        r"(crash|compile_error|runtime_error): .+; --resume runs it again",
        row["error"],
    ), row["error"]

    filler.unlink()
    resumed = orchestrate(*shlex.split(said["resume"])[1:])
    assert "1 jobs planned, 0 already done, 1 to run" in resumed.stderr, resumed.stderr
    assert "harness" not in resumed.stderr
    [row] = read_results(out).to_pylist()  # the job's result; its harness row stays in the files
    assert row["status"] == "ok", row["error"]
    raw = ds.dataset(out / "results", partitioning="hive").to_table(columns=["status"]).to_pylist()
    assert sorted(r["status"] for r in raw) == ["harness_error", "ok"]


def _task_raises(job_dict, threads, scratch_root=None, extra_path=(), lock_clocks=False, **options):
    raise ValueError("the task's own code failed")


def test_a_ray_task_that_raises_is_a_harness_error_without_ray_s_colours(tmp_path):
    spec = parse_spec(SWEEP, "scratch.yaml")
    out = tmp_path / "out"
    summary = run_sweep(
        spec, SweepOptions(out_dir=out, cpus_per_job=1), stream=io.StringIO(), task_body=_task_raises
    )
    assert summary.harness_errors == 1
    assert summary.resume_command == f"orchestrate sweep scratch.yaml --out {out} --resume"
    assert summary.unfinished().endswith(f"Run it again with:\n  {summary.resume_command}")
    [row] = read_results(out).to_pylist()
    assert row["status"] == "harness_error"
    # Ray colours the task's name in its exception's text (ESC [36m ... ESC [39m)
    assert row["error"].startswith("the job's Ray task raised: RayTaskError(ValueError): ray::"), row["error"]
    assert "the task's own code failed" in row["error"]
    assert "\x1b" not in row["error"]
