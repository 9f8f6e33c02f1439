"""GPU lanes (workers.lanes): the next job on a GPU starts its first process while the job before
it runs, and that process makes its first compute call only after that job has ended.

On this CPU machine the lane's "GPU" is a name and its lock a file, the jobs are CPU jobs and
the processes real ones (tests/ahead_model.py logs each process's build and first call). The
locks live in a directory of each test's own, so nothing here depends on what other tests or
sweeps on the machine hold."""

from __future__ import annotations

import dataclasses
import itertools
import json
import os
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from pathlib import Path

import pytest

from compiler.config import CompileConfig
from compiler.env import format_cpus, parse_cpus
from compiler.job import Job, MeasureSpec, ModelSpec
from orchestrator.fleet import scheduler as scheduler_module
from orchestrator.fleet.inventory import HardwareClass
from orchestrator.fleet.options import SweepOptions
from orchestrator.fleet.ray_tasks import remote_for, task_kwargs, uses_lanes
from orchestrator.fleet.scheduler import Scheduler
from tests.ahead_model import LOG_ENV
from workers.ahead import Overlap, Step
from workers.lanes import LANE_DEPTH, Lane, LaneStopped, node_gpus
from workers.runner import JobCancelled, kill_tree, run_job, stopping_when

CORES = sorted(os.sched_getaffinity(0))
two_cores = pytest.mark.skipif(len(CORES) < 2, reason="a process started ahead needs a core beside the job's")


def _job(batch_size: int) -> Job:
    return Job(
        sweep="lanes",
        hardware="cpu",
        device="cpu",
        model=ModelSpec(id="python:tests.ahead_model:slow_logged", name="slow"),
        batch_size=batch_size,
        dtype="fp32",
        config=CompileConfig(name="c", backend="eager"),
        measure=MeasureSpec(warmup=2, iterations=10, rounds=4, flops=False, repeats=1),
        timeout_s=300,
    )


def _spawned(result: dict) -> float:
    return datetime.fromisoformat(result["started_at"]).timestamp() - result["phase_start_s"]


def _past_gate(scratch_root: Path) -> bool:
    for record in scratch_root.glob("job-*/result.json"):
        try:
            if json.loads(record.read_text()).get("started_ahead"):
                return True
        except ValueError:  # being rewritten
            pass
    return False


@two_cores
def test_the_next_job_starts_its_first_process_while_the_job_before_it_runs(lock_dir, tmp_path, monkeypatch):
    log = tmp_path / "calls.jsonl"
    monkeypatch.setenv(LOG_ENV, str(log))
    lane = Lane(("0",), directory=lock_dir)
    first_root, next_root = tmp_path / "a", tmp_path / "b"

    def run(job: Job, root: Path) -> dict:
        return run_job(job, threads=1, node_jobs=1, scratch_root=str(root), keep_scratch=True, lane=lane)

    with ThreadPoolExecutor(max_workers=2) as pool:
        first = pool.submit(run, _job(2), first_root)
        deadline = time.monotonic() + 120
        while not _past_gate(first_root):  # on the device: its start-up core is spare again
            assert not first.done() and time.monotonic() < deadline, first.result() if first.done() else ""
            time.sleep(0.05)
        following = pool.submit(run, _job(3), next_root)
        a, b = first.result(timeout=300), following.result(timeout=300)
    assert a["status"] == "ok" and b["status"] == "ok", (a.get("error"), b.get("error"))
    assert a["lane_wait_s"] < 5 and b["lane_wait_s"] > 0.5
    assert a["started_ahead"] == b["started_ahead"] == [True] and b["ahead_off"] is None
    assert b["ahead_hidden_s"] > 0  # its start-up ran while the job before it held the lane
    # only what ran while no GPU was free for the job is hidden: the first job found the lane
    # free, so its start-up ran while the GPU waited for it, and hid nothing
    assert a["ahead_hidden_s"] <= a["lane_wait_s"] < 5 and b["ahead_hidden_s"] <= b["lane_wait_s"]

    (a_scratch,), (b_scratch,) = first_root.glob("job-*"), next_root.glob("job-*")
    a_record = json.loads((a_scratch / "result.json").read_text())
    b_record = json.loads((b_scratch / "result.json").read_text())
    calls = [json.loads(line) for line in log.read_text().splitlines()]
    by_pid = {(c["pid"], c["event"]): c for c in calls}
    builds = [c["pid"] for c in calls if c["event"] == "build"]
    assert len(builds) == 2  # the job ahead's process, then the next job's
    b_pid = builds[1]
    # started before the job ahead of it ended; its first compute call after that
    assert _spawned(b_record) < a_record["finished_at_unix"] < by_pid[b_pid, "first_call"]["t"]
    # built on a spare core, then on the job's cores, which it took only once the lane was free
    job_cores = parse_cpus(b["cpu_affinity"])
    assert set(by_pid[b_pid, "build"]["threads"].values()) == {b["ahead_cpus"]}
    assert set(by_pid[b_pid, "first_call"]["threads"].values()) == {format_cpus(job_cores)}
    # the spare core was none of the running job's; once the process waited at its gate it gave
    # that core back, so the job may take it when its turn comes (which core depends on what
    # other work on the machine holds)
    assert not parse_cpus(a["cpu_affinity"]) & parse_cpus(b["ahead_cpus"])


def test_a_lane_takes_whichever_gpu_is_free_its_own_first_and_waits_when_none_is(tmp_path):
    lane = Lane(("1", "0"), directory=tmp_path)
    with lane.hold() as mine:
        assert mine.gpu == "1" and mine.waited_s < 1  # Ray's pick first, where it is free
        with lane.hold() as other:
            assert other.gpu == "0"  # another job holds "1": the other GPU of the node

            def release_soon() -> None:
                time.sleep(0.5)
                os.close(other.fd)  # that job ends (its context's own close then finds it closed)

            threading.Thread(target=release_soon).start()
            with lane.hold() as third:
                assert third.gpu == "0" and third.waited_s >= 0.4
    with pytest.raises(LaneStopped), lane.hold(), lane.hold(), lane.hold(stopped=lambda: True):
        pass


def test_jobs_waiting_for_a_gpu_take_it_in_the_order_they_began_to_wait(tmp_path):
    """The driver sends the longest jobs first; a GPU that comes free goes to the job that has
    waited longest, not to whichever job's poll lands first. A job that died waiting keeps no
    place in the queue (a real process, killed)."""
    # two GPUs, and jobs whose tasks Ray placed on either: each lists Ray's pick first, one queue
    lanes = [Lane(("0", "1"), directory=tmp_path), Lane(("1", "0"), directory=tmp_path)]
    order: list[int] = []

    def wait(i: int) -> None:
        with lanes[i % 2].hold():
            order.append(i)
            time.sleep(0.02)

    with lanes[0].hold() as running, lanes[1].hold() as other, ThreadPoolExecutor(max_workers=6) as pool:
        # a job that begins to wait first, and dies waiting
        code = (
            "import sys, time; from pathlib import Path; from workers.lanes import Ticket; "
            "Ticket.take(Path(sys.argv[1]), ('1', '0')); print('queued', flush=True); time.sleep(600)"
        )
        env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
        dead = subprocess.Popen(
            [sys.executable, "-c", code, str(tmp_path)], stdout=subprocess.PIPE, text=True, env=env
        )
        try:
            assert dead.stdout.readline().strip() == "queued"
            waiters = []
            for i in range(6):
                waiters.append(pool.submit(wait, i))
                time.sleep(0.15)  # each has begun to wait before the next
        finally:
            dead.kill()
            dead.wait()
        os.close(running.fd)  # the job on GPU 0 ends; GPU 1's job runs on, so one waiter runs at a time
        for w in waiters:
            w.result(timeout=60)
        assert other.gpu == "1"
    assert order == list(range(6))
    assert not list(tmp_path.glob("queue-*"))  # no ticket left behind, the dead job's neither


def test_jobs_take_a_free_gpu_in_the_order_they_were_sent_whatever_order_they_arrive_in(tmp_path):
    """Ray starts the tasks of one dispatch seconds apart in no set order: a job that finds the
    GPU free holds back (`settle_s`) for jobs sent before it, so the first job sent runs first
    though it arrived last. Holding back with the GPU free is not counted as waiting for it."""
    order: list[int] = []
    held: dict[int, float] = {}
    arrived = threading.Barrier(4)

    def job(sent: int) -> None:
        time.sleep(0.15 * (4 - sent))  # the last sent arrives first
        lane = Lane(("0",), directory=tmp_path, sent_ns=sent, settle_s=1.5)
        with lane.hold(ready=lambda: False) as mine:
            order.append(sent)
            held[sent] = mine.waited_s
            time.sleep(0.05)
        arrived.wait(timeout=30)

    with ThreadPoolExecutor(max_workers=4) as pool:
        for f in [pool.submit(job, sent) for sent in (1, 2, 3, 4)]:
            f.result(timeout=60)
    assert order == [1, 2, 3, 4]
    assert held[1] < 0.5  # the GPU was free for it all along: its hold-back is its own time
    assert held[4] > 1.0  # behind the three sent before it, after its first 0.45 s held back

    with Lane(("0",), directory=tmp_path, sent_ns=5, settle_s=60).hold(ready=lambda: True) as ready:
        assert ready.waited_s < 1  # its first process is at its gate: nothing to hold back for


def test_with_several_gpus_free_a_job_need_not_wait_while_one_sent_before_it_holds_back(tmp_path):
    """Two GPUs free and three jobs sent at once: the first two sent each take one, holding back
    side by side (their own time, not a wait for a GPU); the third waits for a GPU and that is
    its wait. When only the first in the queue could take a GPU, the second waited out the
    first's hold-back with a GPU free, and that counted as waiting for one."""
    took: dict[int, tuple[str, float, float]] = {}
    release = threading.Event()

    def job(sent: int) -> None:
        lane = Lane(("0", "1"), directory=tmp_path, sent_ns=sent, settle_s=1.5)
        with lane.hold(ready=lambda: False) as mine:
            took[sent] = (mine.gpu, mine.waited_s, time.monotonic())
            if sent < 3:
                release.wait(timeout=30)

    with ThreadPoolExecutor(max_workers=3) as pool:
        futures = [pool.submit(job, sent) for sent in (1, 2, 3)]
        deadline = time.monotonic() + 30
        while len(took) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.5)
        assert set(took) == {1, 2}  # the third waits: both GPUs are held
        release.set()
        for f in futures:
            f.result(timeout=60)
    assert {took[1][0], took[2][0]} == {"0", "1"}
    assert took[1][1] < 0.5 and took[2][1] < 0.5  # a GPU was free for each all along
    assert abs(took[1][2] - took[2][2]) < 1.0  # they held back side by side, not one after another
    assert took[3][1] > 1.0  # no GPU was free for the third until one of them ended


@two_cores
def test_a_waiting_job_starts_its_processes_ahead_within_its_gpus_share_of_the_spare_cores(
    lock_dir, tmp_path
):
    """While a job waits for its GPU it starts its processes ahead in order, each waiting at its
    gate, as far as its GPU's share of the node's spare cores goes; a process at its gate runs
    nothing and gives its core back, so the next one starts on it. The jobs of another GPU draw on
    that GPU's share, so they never take the cores a GPU's own jobs need. Here the node's 2 spare
    cores are shared by 2 GPUs, one each; the processes are job processes reduced to their gate
    (`JobRecord.pass_gate`, which says in its record that it waits there)."""
    job_file = tmp_path / "job.json"
    job_file.write_text(json.dumps(_job(2).to_dict()))
    started: list[subprocess.Popen] = []
    code = (
        "import sys; from pathlib import Path; from workers.affinity import pin_from_environment; "
        "from workers.bench.record import JobRecord; pin_from_environment(); "
        "JobRecord(Path(sys.argv[1]), Path(sys.argv[2])).pass_gate()"
    )

    def spawn(step: Step, extra: dict, fds: tuple) -> subprocess.Popen:
        env = {**os.environ, **extra, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
        argv = [sys.executable, "-c", code, str(job_file), str(step.result_file)]
        started.append(subprocess.Popen(argv, env=env, pass_fds=fds))
        return started[-1]

    def steps(name: str) -> list[Step]:
        return [Step((), tmp_path / f"{name}{i}.json", tmp_path / "log") for i in range(3)]

    try:
        with (
            Overlap(steps("a"), "cpu", 1, spawn=spawn, kill=kill_tree, node_jobs=0) as first,
            Overlap(steps("b"), "cpu", 1, spawn=spawn, kill=kill_tree, node_jobs=0) as other,
        ):
            assert first.spare == len(CORES)  # no job holds cores on this node: all are spare
            first.use_pool("0", len(CORES))
            first.start_waiting()
            assert list(first.started) == [0] and "GPU 0's share" in first.reasons[1]
            other.use_pool("1", len(CORES))  # the other GPU's share is its own
            other.start_waiting()
            assert list(other.started) == [0]
            deadline = time.monotonic() + 120
            while len(first.started) < 3:  # the runner's poll while the job waits for its GPU
                assert time.monotonic() < deadline, f"only {sorted(first.started)} started"
                assert all(p.poll() is None for p in started)
                first.start_waiting()
                busy = [i for i, s in first.started.items() if s.cores.held]
                assert len(busy) <= 1, f"processes {busy} hold GPU 0's one spare core at once"
                time.sleep(0.05)
            # each started only once the one before it waited at its gate, which it still does
            for i in (0, 1):
                assert json.loads(steps("a")[i].result_file.read_text())["at_gate"] is True
            assert list(other.started) == [0] and all(p.poll() is None for p in started)
        assert all(p.wait(timeout=30) is not None for p in started)  # never taken: ended with their jobs
    finally:
        for proc in started:
            if proc.poll() is None:
                proc.kill()


def test_a_job_stopped_while_it_waits_for_a_gpu_ends_its_first_process(lock_dir, tmp_path):
    lane = Lane(("0",), directory=lock_dir)
    stop = threading.Event()
    with lane.hold():  # another job has the GPU
        threading.Timer(3.0, stop.set).start()
        with stopping_when(stop.is_set), pytest.raises(JobCancelled):
            run_job(_job(2), threads=1, node_jobs=1, scratch_root=str(tmp_path), keep_scratch=True, lane=lane)
    (scratch,) = tmp_path.glob("job-*")
    record = json.loads((scratch / "result.json").read_text())
    assert record["phase"] in ("imports", "build") and "started_ahead" not in record  # never past its gate
    assert not [p for p in _children() if "workers.bench" in " ".join(p.cmdline())]  # and was ended


def _children():
    import psutil

    return psutil.Process().children(recursive=True)


def test_gpu_tasks_are_admitted_two_to_a_gpu_where_lanes_are_on(monkeypatch):
    """The driver's side: with the overlap on, a GPU class's tasks ask Ray for half a GPU and half
    a job's cores, twice as many run at once, and each task is told to go through its lane."""
    hw = HardwareClass("H100", "cuda", ["n1"], slots=4, cpus_per_job=13)
    laned = remote_for(hw, ["H100"], lanes=True)._default_options
    plain = remote_for(hw, ["H100"])._default_options
    assert laned["num_gpus"] == 1 / LANE_DEPTH and laned["num_cpus"] == 13 / LANE_DEPTH
    assert plain["num_gpus"] == 1 and plain["num_cpus"] == 13
    assert uses_lanes(SweepOptions(out_dir="o")) and not uses_lanes(SweepOptions(out_dir="o", overlap=False))
    assert task_kwargs(SweepOptions(out_dir="o"), lanes=True) == {"lanes": True}
    assert task_kwargs(SweepOptions(out_dir="o", overlap=False), lanes=True) == {"overlap": False}
    assert node_gpus("2", count=0) == ("2",)  # outside Ray, without NVML: the task's own GPU

    submitted, waits = [], iter([7.0, 0.0] * 8)
    clock = itertools.count(0, 10)  # every reading of the clock 10 s after the one before

    class Lanes:
        class exceptions:  # noqa: N801 - mirrors ray.exceptions
            RayTaskError = RuntimeError

        def remote(self, job_dict, threads, *args, **kwargs):
            submitted.append(kwargs)
            return len(submitted)

        def wait(self, refs, num_returns, timeout):
            return list(refs)[: max(num_returns, 0) or len(refs)], []

        def get(self, ref):
            return {"status": "ok", "eager_ms": 1.0, "compiled_ms": 1.0, "lane_wait_s": next(waits)}

    ray, walls = Lanes(), []
    monkeypatch.setattr(scheduler_module.time, "sleep", lambda s: None)
    monkeypatch.setattr(scheduler_module.time, "monotonic", lambda: float(next(clock)))
    classes = {"H100": HardwareClass("H100", "cuda", ["n1"], slots=2)}
    sched = Scheduler(
        classes=classes,
        remotes={"H100": ray},
        task_args=(),
        run_id="r",
        emit=lambda row, job, wall, tables=None: walls.append(wall),
        inventory=lambda: classes,
        task_kwargs={"lanes": True},
        depth={"H100": LANE_DEPTH},
    )
    sched.add([dataclasses.replace(_job(i + 1), hardware="H100", device="cuda") for i in range(6)])
    sched.fill(lambda: None)
    assert len(sched.running) == 2 * LANE_DEPTH and all(k["lanes"] is True for k in submitted)
    sent = [k["sent_ns"] for k in submitted]  # their places in a node's queue for a GPU
    assert sent == sorted(set(sent))
    sched.run(ray, started=lambda: None, tick=lambda: None)
    # whole tens of seconds from dispatch to result; the 7 s a job waited behind another left out
    assert sorted(w % 10 for w in walls) == [0, 0, 0, 3, 3, 3]
