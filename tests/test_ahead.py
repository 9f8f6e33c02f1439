"""A job's next process started ahead (workers.ahead, workers.bench.gate): it starts while the one
before it still runs, on spare cores, and makes its first compute call only after that one ended.

The core locks live in a directory of each test's own, so the tests do not depend on what other
tests (or sweeps) on this machine hold; the overlap being off where cores are short is also
shown on a real two-process job in tests/test_measure_method.py."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import textwrap
import time
from datetime import datetime
from pathlib import Path

import pytest

from compiler.config import CompileConfig
from compiler.env import format_cpus, parse_cpus
from compiler.job import Job, MeasureSpec, ModelSpec
from tests.ahead_model import LOG_ENV
from workers import affinity
from workers.ahead import OFF_BY_RUN, Overlap, Step, gpu_job_cores, reserve_ahead, spare_cores
from workers.bench.gate import GATE_FD_ENV
from workers.runner import kill_tree, run_job

CORES = sorted(os.sched_getaffinity(0))
two_cores = pytest.mark.skipif(len(CORES) < 2, reason="a process started ahead needs a core beside the job's")


def _job(repeats: int = 2) -> Job:
    return Job(
        sweep="ahead",
        hardware="cpu",
        device="cpu",
        model=ModelSpec(id="python:tests.ahead_model:slow_logged", name="slow"),
        batch_size=2,
        dtype="fp32",
        config=CompileConfig(name="c", backend="eager"),
        measure=MeasureSpec(warmup=2, iterations=10, rounds=2, flops=False, repeats=repeats),
        timeout_s=300,
    )


def _spawned(result: dict) -> float:
    """When the runner started the process (its clock): the record's start less its start phase."""
    return datetime.fromisoformat(result["started_at"]).timestamp() - result["phase_start_s"]


@two_cores
def test_the_next_process_starts_ahead_and_computes_only_after_the_one_before_ended(
    lock_dir, tmp_path, monkeypatch
):
    log = tmp_path / "calls.jsonl"
    monkeypatch.setenv(LOG_ENV, str(log))
    row = run_job(_job(), threads=1, node_jobs=1, scratch_root=str(tmp_path), keep_scratch=True)
    assert row["status"] == "ok", row.get("error")
    assert row["started_ahead"] == [False, True] and row["ahead_off"] is None
    assert row["gate_wait_s"][0] == 0.0 and row["gate_wait_s"][1] >= 0.0
    assert row["ahead_hidden_s"] > 0
    job_cores, ahead_cores = parse_cpus(row["cpu_affinity"]), parse_cpus(row["ahead_cpus"])
    assert len(job_cores) == 1 and ahead_cores and not job_cores & ahead_cores

    (scratch,) = tmp_path.glob("job-*")
    first = json.loads((scratch / "result.json").read_text())
    second = json.loads((scratch / "repeat2.json").read_text())
    calls = [json.loads(line) for line in log.read_text().splitlines()]
    pids = list(dict.fromkeys(c["pid"] for c in calls if c["event"] == "build"))
    assert len(pids) == 2
    event = {(pids.index(c["pid"]), c["event"]): c for c in calls}
    # started before the first process ended; its first compute call after it
    assert _spawned(second) < first["finished_at_unix"] < event[1, "first_call"]["t"]
    # built on its own cores, every thread of it (the model's own thread too) on the job's after the gate
    assert set(event[1, "build"]["threads"].values()) == {row["ahead_cpus"]}
    assert set(event[1, "first_call"]["threads"].values()) == {format_cpus(job_cores)}
    assert set(event[0, "first_call"]["threads"].values()) == {format_cpus(job_cores)}
    # the wait at the gate counts in no phase: a process's phases and its wait make its life
    for process in (first, second):
        phases = sum(v for k, v in process.items() if k.startswith("phase_") and k.endswith("_s"))
        life = process["finished_at_unix"] - _spawned(process)
        assert phases + process.get("gate_wait_s", 0.0) == pytest.approx(life, abs=0.5)


def _gated_script(record: Path, job_file: Path) -> str:
    """A job process reduced to its gate: a thread started first, then `JobRecord.pass_gate`."""
    return textwrap.dedent(
        f"""
        import os, threading, time
        from pathlib import Path
        from workers.affinity import pin_from_environment
        from workers.bench.record import JobRecord
        pin_from_environment()
        threading.Thread(target=time.sleep, args=(60,), daemon=True).start()
        run = JobRecord(Path({str(job_file)!r}), Path({str(record)!r}))
        run.pass_gate()  # its first save: the record appears as it reaches the gate
        cores = {{os.sched_getaffinity(int(t)) == os.sched_getaffinity(0) for t in os.listdir("/proc/self/task")}}
        run.result["threads_on_one_set"] = cores == {{True}}
        run.result["gate_var"] = os.environ.get("CO_TEST_GATE_VAR")
        run.save(final=True)
        """
    )


def _start_gated(tmp_path: Path, job_cpu: int, ahead_cpu: int) -> tuple[subprocess.Popen, int, Path]:
    job_file = tmp_path / "job.json"
    job_file.write_text(json.dumps(_job().to_dict()))
    record = tmp_path / "record.json"
    read, write = os.pipe()
    env = {
        **os.environ,
        "PYTHONPATH": str(Path(__file__).resolve().parents[1]),
        GATE_FD_ENV: str(read),
        affinity.AFFINITY_ENV: str(job_cpu),
        affinity.AHEAD_AFFINITY_ENV: str(ahead_cpu),
    }
    code = _gated_script(record, job_file)
    proc = subprocess.Popen([sys.executable, "-c", code], env=env, pass_fds=(read,))
    os.close(read)
    deadline = time.monotonic() + 60
    while not record.exists():  # it saves its record as it reaches the gate
        assert proc.poll() is None and time.monotonic() < deadline, "the process never reached its gate"
        time.sleep(0.05)
    return proc, write, record


@two_cores
def test_the_gate_holds_the_process_until_opened_and_moves_every_thread(tmp_path):
    proc, gate, record = _start_gated(tmp_path, job_cpu=CORES[0], ahead_cpu=CORES[1])
    time.sleep(0.5)
    assert proc.poll() is None  # still at the gate, and its record says so (its core is free)
    assert json.loads(record.read_text())["at_gate"] is True
    os.write(gate, (json.dumps({"at": time.time()}) + "\n").encode())
    os.close(gate)
    assert proc.wait(timeout=60) == 0
    got = json.loads(record.read_text())
    assert got["started_ahead"] is True and got["gate_wait_s"] >= 0.5
    assert got["ahead_cpus"] == str(CORES[1]) and got["cpu_affinity"] == str(CORES[0]) and got["cpu_pinned"]
    assert got["threads_on_one_set"] is True and "at_gate" not in got


@two_cores
def test_the_gate_gives_the_job_its_cores_and_variables(tmp_path):
    """A job that waited for its GPU learns its cores and its GPU at the gate (`workers.lanes`):
    the message's cores win over those it was started with, its variables are set before it goes on."""
    proc, gate, record = _start_gated(tmp_path, job_cpu=CORES[1], ahead_cpu=CORES[1])
    message = {"at": time.time(), "cpus": str(CORES[0]), "env": {"CO_TEST_GATE_VAR": "7"}}
    os.write(gate, (json.dumps(message) + "\n").encode())
    os.close(gate)
    assert proc.wait(timeout=60) == 0
    got = json.loads(record.read_text())
    assert got["cpu_affinity"] == str(CORES[0]) and got["threads_on_one_set"] is True
    assert got["gate_var"] == "7"


@two_cores
def test_a_gate_closed_unopened_ends_the_process(tmp_path):
    proc, gate, record = _start_gated(tmp_path, job_cpu=CORES[0], ahead_cpu=CORES[1])
    os.close(gate)
    assert proc.wait(timeout=60) == 0
    assert "started_ahead" not in json.loads(record.read_text())


def test_a_run_without_the_overlap_starts_each_process_after_the_one_before(lock_dir, tmp_path):
    """`--no-overlap` (an A/A check of the overlap): the option reaches every job's task, and the
    job's processes run one after another, its row saying why."""
    import inspect

    from orchestrator.fleet.options import SweepOptions
    from orchestrator.fleet.ray_tasks import task_kwargs
    from workers.task import execute_job

    assert task_kwargs(SweepOptions(out_dir="o", overlap=False)) == {"overlap": False}
    assert task_kwargs(SweepOptions(out_dir="o")) == {}
    assert inspect.signature(execute_job).parameters["overlap"].default is True
    row = run_job(_job(), threads=1, node_jobs=1, scratch_root=str(tmp_path), overlap=False)
    assert row["status"] == "ok", row.get("error")
    assert row["started_ahead"] == [False, False] and row["ahead_off"] == OFF_BY_RUN
    assert row["gate_wait_s"] == [0.0, 0.0] and row["ahead_hidden_s"] == 0.0


def test_a_gpu_job_leaves_three_cores_of_its_share_for_the_processes_started_ahead():
    """A GPU node's cores go to its GPUs' jobs less 3 each (`orchestrator.fleet.inventory`), or
    fewer where the job would keep fewer than 4: the spare cores a job's two later processes and
    the next job's first import and build on while the job's process times."""
    assert [gpu_job_cores(n) for n in (16, 8, 7, 6, 5, 4, 2, 1)] == [13, 5, 4, 4, 4, 4, 2, 1]
    # a 64-core host with 4 GPUs: jobs of 13 cores leave 12 spare; the worker sees the same layout
    assert 64 - 4 * gpu_job_cores(64 // 4) == 12


def test_spare_cores_are_the_nodes_cores_beyond_its_jobs():
    n = len(CORES)
    assert spare_cores("cpu", 1, node_jobs=1)[0] == n - 1
    spare, layout = spare_cores("cpu", 1)  # as many one-core jobs as cores
    assert spare == 0 and f"this node's {n} cores go to its {n} job" in layout
    assert spare_cores("cpu", n)[0] == 0


@two_cores
def test_processes_started_ahead_share_the_spare_cores_and_say_why_not(lock_dir):
    first = reserve_ahead(1)
    assert not isinstance(first, str) and len(first.lease.cpus) == 1
    assert "held by other processes started ahead" in reserve_ahead(1)  # one spare core: taken
    first.release()
    held = affinity.reserve_cores(len(CORES))  # every core held by jobs
    try:
        assert "no spare core was free" in reserve_ahead(1)
    finally:
        held.release()
    again = reserve_ahead(1)
    assert not isinstance(again, str)
    again.release()


def test_no_process_starts_ahead_for_a_job_not_pinned(tmp_path):
    steps = [Step((), tmp_path / f"r{i}.json", tmp_path / "log") for i in range(2)]
    unpinned = affinity.CoreLease((), note="only 0 of the 1 cores this job wants were free")
    with Overlap(steps, "cpu", 1, spawn=None, kill=kill_tree, node_jobs=1) as overlap:
        overlap.use_cores(unpinned)
        assert overlap.take(0) is None and overlap.take(1) is None
        assert overlap.off_reason() == f"the job's processes are not pinned to cores ({unpinned.note})"
    single = Overlap(steps[:1], "cpu", 1, spawn=None, kill=kill_tree)
    single.use_cores(unpinned)
    assert single.take(0) is None and single.off_reason() is None  # one process: nothing to overlap


@contextlib.contextmanager
def _running_its_first_process(tmp_path: Path, spawn, job_cores: affinity.CoreLease):
    """A two-process job on `job_cores` whose first process runs (not started ahead): its steps,
    its `Overlap` and the runner's check while that process runs."""
    steps = [Step((), tmp_path / f"r{i}.json", tmp_path / "log") for i in range(2)]
    with Overlap(steps, "cpu", 1, spawn=spawn, kill=kill_tree, node_jobs=1) as overlap:
        overlap.use_cores(job_cores)
        assert overlap.take(0) is None
        yield steps, overlap, overlap.watch(0)


@two_cores
def test_a_process_started_ahead_and_never_run_is_ended(lock_dir, tmp_path, gated_spawn):
    """The step before it is past its gate, on the device: the next one starts (here a bare
    interpreter at its gate); the job then stops there (that step failed, or the job was cancelled): it is ended, its
    cores freed."""
    spawn, started = gated_spawn
    job_cores = affinity.reserve_cores(1)
    with _running_its_first_process(tmp_path, spawn, job_cores) as (steps, overlap, watch):
        steps[0].result_file.write_text(json.dumps({"phase": "build"}))
        watch()
        assert not started  # still building, before its gate: nothing starts
        time.sleep(0.01)
        steps[0].result_file.write_text(json.dumps({"phase": "eager"}))
        os.utime(steps[0].result_file, ns=(time.time_ns(), time.time_ns() + 1))
        watch()
        assert len(started) == 1 and started[0].poll() is None
    assert started[0].poll() is not None  # ended, its gate never opened
    job_cores.release()
    free = reserve_ahead(1)  # its spare core is free again
    assert not isinstance(free, str)
    free.release()


@two_cores
def test_a_later_process_starts_ahead_as_soon_as_a_spare_core_comes_free(lock_dir, tmp_path, gated_spawn):
    """The step before it is on the device but every spare core is busy with another job's
    start-up: the later step starts at the first check after one comes free, with no new word from
    the running step."""
    spawn, started = gated_spawn
    job_cores = affinity.reserve_cores(1)
    other = reserve_ahead(len(CORES) - 1)  # another job's process, starting up on the one spare core
    assert not isinstance(other, str)
    try:
        with _running_its_first_process(tmp_path, spawn, job_cores) as (steps, overlap, watch):
            steps[0].result_file.write_text(json.dumps({"phase": "timing"}))
            watch()
            assert not started and "held by other processes started ahead" in overlap.reasons[1]
            other.release()  # it reached its gate, or its job went on
            watch()
            assert len(started) == 1 and 1 not in overlap.reasons
    finally:
        other.release()
        job_cores.release()
