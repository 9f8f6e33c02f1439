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

import os
import socket
import threading
import time
from typing import Any

from workers.job import Job
from workers.runner import JobCancelled, run_job

RAYLET_POLL_S = 0.2
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


def execute_job(
    job_dict: dict[str, Any],
    threads: int,
    scratch_root: str | None = None,
    extra_path: tuple[str, ...] = (),
    lock_clocks: bool = False,
    shared_cache: str | None = None,
) -> dict[str, Any]:
    """Body of the per-job Ray task: run the job, return its result fields plus where it ran; or,
    when the task is cancelled (`ray.cancel` without force: a KeyboardInterrupt), `{"cancelled":
    True}` with what the job's cold compile had streamed (`kernel_choices`, `autotuned_ops`)."""
    import ray

    _exit_with_raylet()
    started = time.time()
    job = Job.from_dict(job_dict)
    try:
        result = run_job(
            job,
            threads=threads,
            scratch_root=scratch_root,
            extra_path=extra_path,
            lock_clocks=lock_clocks,
            shared_cache=shared_cache,
        )
    except JobCancelled as stop:  # a task that returns after `ray.cancel` (not forced) is read
        return {"cancelled": True, **stop.kept}
    result["node_id"] = ray.get_runtime_context().get_node_id()
    result["hostname"] = socket.gethostname()
    result["task_s"] = time.time() - started
    return result
