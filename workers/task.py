"""The Ray task that owns one device slot and runs one job in a subprocess.

Ray sets CUDA_VISIBLE_DEVICES for a task that reserves a GPU; the job subprocess inherits it.
This module reads its own node id from the runtime context and nothing else from Ray.
"""

from __future__ import annotations

import socket
import time
from typing import Any

from workers.job import Job
from workers.runner import run_job


def execute_job(
    job_dict: dict[str, Any],
    threads: int,
    scratch_root: str | None = None,
    extra_path: tuple[str, ...] = (),
    lock_clocks: bool = False,
    shared_cache: str | None = None,
) -> dict[str, Any]:
    """Body of the per-job Ray task: run the job, return its result fields plus where it ran."""
    import ray

    started = time.time()
    job = Job.from_dict(job_dict)
    result = run_job(
        job,
        threads=threads,
        scratch_root=scratch_root,
        extra_path=extra_path,
        lock_clocks=lock_clocks,
        shared_cache=shared_cache,
    )
    result["node_id"] = ray.get_runtime_context().get_node_id()
    result["hostname"] = socket.gethostname()
    result["task_s"] = time.time() - started
    return result
