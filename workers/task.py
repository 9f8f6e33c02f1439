"""The Ray task that owns one device slot and runs one job in a subprocess.

Ray sets CUDA_VISIBLE_DEVICES for a task that reserves a GPU; the job subprocess inherits it.
This module reads its own node id from the runtime context and nothing else from Ray.

A Ray worker is a child of its node's raylet, not of the driver. Where the driver started a
private Ray, the raylet dies with the driver (SIGKILL included), and Ray's own check ends the
worker about 2 s later; the worker ends itself within `RAYLET_POLL_S` of its raylet's death
instead (`_exit_with_raylet`), and its job process and that process's group follow at once
(`workers.runner`). On a cluster, Ray ends the workers of a dead driver's job itself.
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

from compiler.cache_access import CacheAccess
from compiler.job import Job
from workers.lanes import VISIBLE, Lane, node_gpus
from workers.runner import JobCancelled, reporting_phases, run_job, stopping_when

RAYLET_POLL_S = 0.2
STOP_POLL_S = 0.5
"""How often a running job looks for its driver's stop (`stop_key`) in Ray's key-value store."""
STOP_NAMESPACE = "compile-orchestrator"
_watching: list[int] = []
"""The raylet's pid, once this worker process watches it."""


def _exit_with_raylet() -> None:
    """From the first task on, end this worker process (and so its job process, which dies with
    its parent) as soon as its parent raylet is gone. Nothing is watched where the parent is not a
    raylet (a task run outside Ray, as in tests)."""
    import psutil

    if _watching:
        return
    try:
        parent = psutil.Process().parent()
        if parent is None or parent.name() != "raylet":
            return
    except psutil.Error:
        return
    _watching.append(parent.pid)

    def watch() -> None:
        while os.getppid() == parent.pid:
            time.sleep(RAYLET_POLL_S)
        os._exit(1)  # reparented: the raylet is dead, and with it this worker's purpose

    threading.Thread(target=watch, name="exit-with-raylet", daemon=True).start()


def stop_key(ray_job_id: str) -> bytes:
    """The key (in `STOP_NAMESPACE` of Ray's internal key-value store) whose presence tells the tasks of
    one driver, a Ray job, to stop their jobs. A stopping driver (Ctrl-C, SIGTERM, a full disk)
    sets it instead of `ray.cancel`-ing running tasks: Ray 2.60 can abort the driver ("Check
    failed: ... Tried to complete task that was not pending") when a cancel meets the reply of a
    task that is just ending, and a cancelled task replies by design. The tasks end as they would
    on a cancel, and Ray sees them return."""
    return f"stop:{ray_job_id}".encode()


PHASE_NAMESPACE = "compile-orchestrator-phase"
"""Namespace of Ray's internal key-value store where a running task says what its job does."""


def phase_key(ray_job_id: str, job_id: str) -> bytes:
    """The key (in `PHASE_NAMESPACE`) under which a task of driver `ray_job_id` says what its job
    `job_id` does now (its process's phase, or what it waits for); the driver's live view reads it."""
    return f"phase:{ray_job_id}:{job_id}".encode()


def _phase_reporter(job_id: str) -> tuple[Callable[[str], None], Callable[[], None]]:
    """(report, forget): put what the job does under its `phase_key`; delete the key at its end."""
    import ray
    from ray.experimental import internal_kv

    key = phase_key(ray.get_runtime_context().get_job_id(), job_id)

    def report(text: str) -> None:
        internal_kv._internal_kv_put(key, text.encode(), overwrite=True, namespace=PHASE_NAMESPACE)

    def forget() -> None:
        with contextlib.suppress(Exception):
            internal_kv._internal_kv_del(key, namespace=PHASE_NAMESPACE)

    return report, forget


def _stop_requested() -> Callable[[], bool]:
    """A check, at most every `STOP_POLL_S`, of this task's driver's `stop_key` (false where it
    cannot be read)."""
    import ray
    from ray.experimental import internal_kv

    key = stop_key(ray.get_runtime_context().get_job_id())
    state = {"at": 0.0, "stop": False}

    def check() -> bool:
        now = time.monotonic()
        if not state["stop"] and now - state["at"] >= STOP_POLL_S:
            state["at"] = now
            with contextlib.suppress(Exception):  # the GCS is busy or gone: a forced cancel still comes
                state["stop"] = bool(internal_kv._internal_kv_exists(key, namespace=STOP_NAMESPACE))
        return state["stop"]

    return check


def _node_gpu_count() -> int | None:
    """The GPUs this task's node offers Ray (`ray.nodes()`), or None where that cannot be read."""
    import ray

    with contextlib.suppress(Exception):
        me = ray.get_runtime_context().get_node_id()
        for node in ray.nodes():
            if node.get("NodeID") == me:
                return int(node.get("Resources", {}).get("GPU", 0))
    return None


def execute_job(
    job_dict: dict[str, Any],
    threads: int,
    scratch_root: str | None = None,
    extra_path: tuple[str, ...] = (),
    lock_clocks: bool = False,
    shared_cache: CacheAccess | None = None,
    overlap: bool = True,
    lanes: bool = False,
    sent_ns: int | None = None,
) -> dict[str, Any]:
    """Body of the per-job Ray task: run the job, return its result fields plus where it ran; or,
    when its driver stops the sweep (`stop_key`) or the task is cancelled (`ray.cancel` without
    force: a KeyboardInterrupt), `{"cancelled": True}` with what the job's cold compile had
    streamed (`kernel_choices`, `autotuned_ops`). With `lanes` (the driver admitted `LANE_DEPTH`
    tasks per GPU: `workers.lanes`), a GPU job takes whichever GPU of its node is free, its first
    process started ahead while it waits, in the order the driver sent the jobs (`sent_ns`, its
    clock's time when it sent this one)."""
    import ray

    _exit_with_raylet()
    job = Job.from_dict(job_dict)
    stopped = _stop_requested()
    if stopped():  # queued when its driver stopped: never started
        return {"cancelled": True}
    lane = None
    if overlap and lanes and job.device == "cuda":  # one of `LANE_DEPTH` tasks per GPU
        lane = Lane(node_gpus(os.environ.get(VISIBLE), _node_gpu_count()), sent_ns=sent_ns)
    report, forget = _phase_reporter(job.job_id)
    try:
        with stopping_when(stopped), reporting_phases(report):
            result = run_job(
                job,
                threads=threads,
                scratch_root=scratch_root,
                extra_path=extra_path,
                lock_clocks=lock_clocks,
                shared_cache=shared_cache,
                overlap=overlap,
                lane=lane,
            )
    except JobCancelled as stop:  # stopped by its driver (or `ray.cancel` without force): read
        return {"cancelled": True, **stop.kept}
    finally:
        forget()
    result["node_id"] = ray.get_runtime_context().get_node_id()
    result["hostname"] = socket.gethostname()
    result.update(host_size())
    return result


def host_size() -> dict[str, int | None]:
    """The node a job ran on, for the records others ingest (`runners`): its cores, its memory and
    the GPUs it offers Ray."""
    try:
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        memory = None
    return {"host_cpus": os.cpu_count(), "host_mem_bytes": memory, "host_gpus": _node_gpu_count()}
