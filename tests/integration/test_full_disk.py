"""The output's disk fills up (or turns read-only) in the middle of a real sweep: the driver stops
as on Ctrl-C, running jobs cancelled, and says in one line what it saved, what it did not, and
the command that resumes; the rows on disk stay as they were, no temporary part file is left, the
lock is released; once there is room again, that command finishes the sweep with exactly one row
per planned job. The disk is a small tmpfs of the test's own (root only: skipped elsewhere)."""

from __future__ import annotations

import re
import shlex
import subprocess
import time

import pytest

from store.lock import LOCK_FILE
from store.schema import read_results
from tests.integration.conftest import bench_processes, orchestrate, planned_count, start_sweep
from tests.store.test_full_disk import leftovers

pytestmark = pytest.mark.integration

SWEEP = """\
name: it-full-disk
models:
  - {id: python:workers.toy:mlp, name: mlp}
batch_sizes: [1, 2, 3]
configs:
  dynamo: {backend: eager}  # what is tested is the output's disk, not Inductor: no C++ compile
measure: {warmup: 1, iterations: 3, flops: false}
"""
# one job at a time (each takes every core): the first row lands and the disk is taken away while
# the jobs after it run; three are enough to leave at least one unrecorded for the resume (a
# fourth only added a job process to the sweep and to its resume)
PLANNED = 3
STOP = re.compile(
    r"error: (?P<reason>no space left on device|read-only file system) writing (?P<where>\S+): "
    r"(?P<saved>\d+) rows of this run saved, (?P<lost>\d+) of its jobs not recorded"
    r"(?: \(\d+ running jobs cancelled\))?(?P<space>; .*)?\. "
    r"(?:Free space|Make it writable) and resume with: (?P<resume>.+)"
)


def rows_by_job(out) -> dict[str, dict]:
    rows = read_results(out).to_pylist()
    assert len(rows) == len({r["job_id"] for r in rows}), "a job_id has two rows"
    return {r["job_id"]: r for r in rows}


@pytest.mark.slow  # a tier of its own, after the default one (docs/testing.md)
@pytest.mark.parametrize("refusal", ["full", "read-only"])
def test_a_disk_that_fills_up_mid_sweep_is_a_clean_stop_and_resume_finishes(
    refusal, small_disk, sweep_file, tmp_path
):
    sweep = sweep_file(SWEEP)
    assert planned_count(sweep) == PLANNED
    disk = small_disk(16 << 20)
    out, scratch = disk.path / "out", tmp_path / "scratch"
    scratch.mkdir()
    driver = start_sweep(sweep, out, scratch, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    # the first row on disk, and the sweep still running: take the disk away
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and driver.poll() is None:
        if list(out.glob("results/hardware=*/part-*.parquet")):
            break
        time.sleep(0.2)
    assert driver.poll() is None, ("the sweep ended before its disk filled up", driver.communicate())
    filler = disk.fill() if refusal == "full" else None
    if refusal == "read-only":
        disk.read_only()
    try:
        _, stderr = driver.communicate(timeout=300)
    except subprocess.TimeoutExpired:
        driver.kill()
        for proc in bench_processes(str(scratch)):  # a job left behind would hold its cores for later tests
            proc.kill()
        pytest.fail(f"the driver did not stop on a {refusal} disk: {driver.communicate()[1]}")

    assert driver.returncode == 2, stderr
    assert "Traceback" not in stderr, stderr
    [line] = [x for x in stderr.splitlines() if x.startswith("error:")]
    stop = STOP.fullmatch(line)
    assert stop, line
    assert stop["reason"] == ("no space left on device" if refusal == "full" else "read-only file system")
    assert stop["where"].startswith(f"{out}/results/hardware=cpu/part-")
    if refusal == "full":
        assert re.fullmatch(
            r"; the part being written needed about \d+(\.\d)? KiB, \d+(\.\d)? [KM]?i?B free", stop["space"]
        )
    else:
        assert stop["space"] is None
    # the resume repeats the sweep's own flags (here --scratch), not only --out
    assert stop["resume"] == f"orchestrate sweep {sweep} --out {out} --scratch {scratch} --resume"
    # what the line says was saved is on disk, whole; what it says was not, is not
    saved = rows_by_job(out)
    assert len(saved) == int(stop["saved"]) >= 1
    assert int(stop["saved"]) + int(stop["lost"]) == PLANNED and int(stop["lost"]) >= 1
    assert not leftovers(out), "a temporary file is left"
    deadline = time.monotonic() + 30
    while bench_processes(str(scratch)) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not bench_processes(str(scratch)), "a cancelled job's process is still running"
    if refusal == "full":
        assert not (out / LOCK_FILE).exists(), "the lock was not released"
        filler.unlink()
    else:  # a read-only disk cannot lose the lock file: the resume takes it over (its pid is gone)
        disk.read_only(False)

    resumed = orchestrate(*shlex.split(stop["resume"])[1:])
    assert (
        f"{PLANNED} jobs planned, {len(saved)} already done, {PLANNED - len(saved)} to run" in resumed.stderr
    )
    assert ("took over the lock" in resumed.stderr) == (refusal == "read-only"), resumed.stderr
    after = rows_by_job(out)
    assert len(after) == PLANNED
    assert all(repr(after[job_id]) == repr(row) for job_id, row in saved.items())  # untouched
    assert not leftovers(out) and not (out / LOCK_FILE).exists()


def test_tune_on_a_full_disk_stops_in_one_line_with_the_tune_command_to_resume(small_disk, sweep_file):
    sweep = sweep_file(SWEEP)
    disk = small_disk(1 << 20)
    out = disk.path / "tune"
    disk.fill()
    tune = orchestrate("tune", str(sweep), "--out", str(out), "--no-shared-cache", check=False, timeout=300)
    assert tune.returncode == 2 and "Traceback" not in tune.stderr, tune.stderr
    [line] = [x for x in tune.stderr.splitlines() if x.startswith("error:")]
    # the tune's own lock on OUT is its first write: refused there, before Ray starts
    assert line.startswith(f"error: no space left on device writing {out}: nothing of this tune was written")
    assert line.endswith(
        f"Free space and resume with: orchestrate tune {sweep} --out {out} --no-shared-cache --resume"
    ), line
    assert not leftovers(disk.path) and not (out / "rung0" / LOCK_FILE).exists()
