"""How a job becomes a Ray task: the connection to a cluster (or a private local one, started for
the block), the per-job remote function of each hardware class (its slot's resources and its
placement: GPU, accelerator type, label selector, lanes) and the run options every task takes.
`orchestrator.fleet.driver` runs a sweep through them.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from typing import Any

from orchestrator.fleet.address import connect_error
from orchestrator.fleet.inventory import ACCEL_LABEL, HardwareClass, local_cpus
from orchestrator.fleet.options import SweepOptions
from workers.lanes import LANE_DEPTH


@contextmanager
def ray_session(address: str | None) -> Iterator[None]:
    """Connect to `address`, or start a private local Ray for the duration of the block.

    A bare `ray.init()` would silently attach to any cluster already running on this machine;
    `address="local"` always starts a new one, with the cores this process may run on
    (`inventory.local_cpus`: a sweep under `taskset` plans only those).
    """
    import ray

    if ray.is_initialized():  # embedded use (tests, notebooks): keep the caller's cluster
        yield
        return
    local = {"num_cpus": local_cpus()} if address in (None, "local") else {}

    def init() -> None:
        ray.init(
            address=address or "local",
            **local,
            include_dashboard=False,
            logging_level=logging.ERROR,
            log_to_driver=False,
            configure_logging=True,
        )

    try:
        if local:
            start_local(init)
        else:
            init()
    except ConnectionError as exc:  # a refused token, a GCS that went away after the address check
        raise connect_error(address, exc) from None
    try:
        yield
    finally:
        ray.shutdown()


LOCAL_START_TRIES = 3
"""Starts of a private local Ray (`start_local`). On a busy host (another sweep compiling on every
core) the raylet may not register with its GCS within the 30 s `ray.init` waits for it
(`raylet_start_wait_time_s` in ray/_private/node.py, not a setting), and the start fails with
"The current node timed out during startup": the processes of that start are ended and Ray is
started again."""

START_TIMED_OUT = "timed out during startup"
"""What Ray's error says where a node's raylet did not register in time (ray/_private/node.py)."""


def start_local(
    init: Callable[[], None],
    tries: int = LOCAL_START_TRIES,
    end_failed: Callable[[], None] | None = None,
) -> None:
    """`init()`, a start of a private local Ray, up to `tries` times where it timed out during
    startup (`LOCAL_START_TRIES`: its error says `START_TIMED_OUT`); each failed start's processes
    are ended before the next: by `end_failed` where given (benchmarks/two_class_cluster.py's
    `ray start` nodes: their process group), else this process's children that were not there
    before it (`ray.init`'s GCS, raylet and agents). The last failure is raised as a RuntimeError
    that says what happened and what to do."""
    import sys

    import psutil

    for attempt in range(1, tries + 1):
        before = {p.pid for p in psutil.Process().children(recursive=True)}
        try:
            init()
            return
        except Exception as exc:
            if START_TIMED_OUT not in str(exc):
                raise
            if end_failed is not None:
                end_failed()
            else:
                _end_children_since(before)
            if attempt == tries:
                raise RuntimeError(
                    f"the local Ray did not start (tries: {tries}): its raylet did not register with "
                    f"its GCS within the 30 s Ray waits ({exc}); the host is likely overloaded: "
                    "run the sweep again when fewer processes compete for its cores, or give "
                    "--address of a running cluster"
                ) from None
            print(
                f"the local Ray did not start within 30 s (a busy host?): starting it again, "
                f"try {attempt + 1} of {tries}",
                file=sys.stderr,
                flush=True,
            )


def _end_children_since(before: set[int]) -> None:
    """SIGKILL this process's children (recursively) that were not among `before`, and reap them:
    what a failed start of a local Ray left running."""
    import psutil

    new = [p for p in psutil.Process().children(recursive=True) if p.pid not in before]
    for p in new:
        with suppress(psutil.Error):
            p.kill()
    psutil.wait_procs(new, timeout=10)


def remote_for(
    hw: HardwareClass,
    gpu_classes: list[str],
    body: Callable[..., dict[str, Any]] | None = None,
    lanes: bool = False,
):
    """The per-job remote function of a class: its slot's resources and its placement.

    GPU classes: one GPU (with `lanes`, `1 / LANE_DEPTH` of one and of a job's cores: the node's
    GPU locks let one job at a time run on a GPU while the next waits, its first process started
    ahead, `workers.lanes`), the `accelerator_type:<class>` resource (on every node of that type,
    autoscaled ones too) and, where all its nodes carry it, the class's label: a node labelled as
    another class still has the resource of the GPU Ray detects. CPU class: a label selector that
    keeps CPU jobs off GPU nodes, whose cores belong to their GPU jobs."""
    import ray

    from workers.task import execute_job

    opts: dict[str, Any] = {"num_cpus": hw.cpus_per_job, "max_retries": 0}
    if hw.device == "cuda":
        opts["num_gpus"] = 1
        if lanes:
            opts["num_gpus"] = 1 / LANE_DEPTH
            opts["num_cpus"] = hw.cpus_per_job / LANE_DEPTH
        opts["max_calls"] = 0  # the Ray worker never touches CUDA itself: reuse it across jobs
        if hw.name != "GPU":
            opts["resources"] = {f"accelerator_type:{hw.name}": 0.001}
            if hw.labelled:
                opts["label_selector"] = {ACCEL_LABEL: hw.name}
    elif gpu_classes:
        # no space after the commas: Ray reads " T4" as a value of its own, and T4 nodes would match
        opts["label_selector"] = {ACCEL_LABEL: f"!in({','.join(gpu_classes)})"}
    return ray.remote(**opts)(body or execute_job)


def uses_lanes(opts: SweepOptions, task_body: Callable[..., dict[str, Any]] | None = None) -> bool:
    """Whether GPU jobs go through lanes (`workers.lanes`): with the overlap on, for the project's
    own task (a replaced task body, the dispatch benchmark's, knows nothing of them)."""
    return opts.overlap and task_body is None


def task_kwargs(opts: SweepOptions, lanes: bool = False) -> dict[str, Any]:
    """The run options every job's task takes as keywords (`workers.task.execute_job`), given
    only where they differ from its defaults; `lanes` where GPU tasks are admitted `LANE_DEPTH`
    to a GPU (`uses_lanes`). The shared cache is given per task, as it is when the task is sent
    (`driver._scheduler`: it may have stopped answering since the run began)."""
    found: dict[str, Any] = {}
    if not opts.overlap:
        found["overlap"] = False
    elif lanes:
        found["lanes"] = True
    return found
