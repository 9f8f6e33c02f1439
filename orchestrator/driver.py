"""The Ray driver: connect (or start a private local cluster), place jobs, collect rows.

One bounded window of in-flight tasks per hardware class (its slot count), so no class waits
on another; a `ray.wait` loop of our own (Ray's `as_completed` drops results when a task
fails); every job ends as one row, whatever happened to its task.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import signal
import sys
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from orchestrator import runlog
from orchestrator.inventory import HardwareClass, cluster_classes, resolve
from orchestrator.matrix import expand, select
from orchestrator.progress import Progress
from orchestrator.rows import failure_row, make_row
from orchestrator.sink import ResultSink, finished_job_ids
from orchestrator.spec import SweepSpec
from workers.job import Job

WAIT_S = 0.25


class OutputExistsError(RuntimeError):
    pass


class SweepInterrupted(RuntimeError):
    pass


@dataclass
class SweepOptions:
    out_dir: Path
    address: str | None = None
    """Ray cluster address; None starts a private local cluster for this sweep."""
    resume: bool = False
    only: str | None = None
    cpus_per_job: int | None = None
    timeout_cap_s: float | None = None
    """Upper bound on every job's time limit (for runs that must end within a window)."""
    scratch_root: str | None = None
    """Where job subprocesses keep their caches and logs (default: the system temp dir)."""
    argv: list[str] = field(default_factory=list)


@dataclass
class SweepSummary:
    run_id: str
    out_dir: Path
    planned: int
    skipped: int
    counts: dict[str, int]
    wall_s: float
    """Whole invocation, Ray start and stop included."""
    dispatch_s: float
    """From the first job dispatched to the last row recorded."""
    hardware: dict[str, int]


@contextmanager
def ray_session(address: str | None) -> Iterator[None]:
    """Connect to `address`, or start a private local Ray for the duration of the block.

    A bare `ray.init()` would silently attach to any cluster already running on this machine;
    `address="local"` always starts a new one.
    """
    import ray

    if ray.is_initialized():  # embedded use (tests, notebooks): keep the caller's cluster
        yield
        return
    ray.init(
        address=address or "local",
        include_dashboard=False,
        logging_level=logging.ERROR,
        log_to_driver=False,
        configure_logging=True,
    )
    try:
        yield
    finally:
        ray.shutdown()


def _remote_for(hw: HardwareClass, body: Callable[..., dict[str, Any]] | None = None):
    import ray

    from workers.task import execute_job

    body = body or execute_job
    opts: dict[str, Any] = {"num_cpus": hw.cpus_per_job, "max_retries": 0}
    if hw.device == "cuda":
        opts["num_gpus"] = 1
        opts["max_calls"] = 0  # the Ray worker never touches CUDA itself: reuse it across jobs
        if hw.name != "GPU":
            opts["resources"] = {f"accelerator_type:{hw.name}": 0.001}
    return ray.remote(**opts)(body)


def _describe_task_error(exc: BaseException) -> str:
    text = str(exc)
    return text if len(text) < 4000 else text[:2000] + "\n...\n" + text[-2000:]


@contextmanager
def _sigterm_as_interrupt() -> Iterator[None]:
    """Treat SIGTERM (a scheduler stopping us) like Ctrl-C: cancel, flush, say how to resume."""

    def handler(signum, frame):
        raise KeyboardInterrupt

    try:
        previous = signal.signal(signal.SIGTERM, handler)
    except ValueError:  # not the main thread
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def plan_jobs(
    spec: SweepSpec, classes: dict[str, HardwareClass], only: str | None, timeout_cap_s: float | None = None
) -> list[Job]:
    hardware = resolve(spec.hardware, classes)
    jobs = select(expand(spec, {name: hw.device for name, hw in hardware.items()}), only)
    if timeout_cap_s:
        jobs = [dataclasses.replace(j, timeout_s=min(j.timeout_s, timeout_cap_s)) for j in jobs]
    return jobs


def run_sweep(
    spec: SweepSpec,
    opts: SweepOptions,
    stream: TextIO | None = None,
    task_body: Callable[..., dict[str, Any]] | None = None,
) -> SweepSummary:
    """Run every job of `spec` not yet in `opts.out_dir`; return what happened.

    `task_body` replaces the per-job task (`workers.task.execute_job`, same arguments and
    result); the dispatch benchmark uses it to push synthetic jobs through the real driver."""
    import ray

    stream = stream or sys.stderr
    out = Path(opts.out_dir)
    done_ids = finished_job_ids(out)
    if done_ids and not opts.resume:
        raise OutputExistsError(
            f"{out} already holds {len(done_ids)} result rows. Pass --resume to finish that sweep, "
            "or --out to write somewhere else; nothing was changed."
        )
    run_id = time.strftime("%Y%m%dT%H%M%S") + "-" + uuid.uuid4().hex[:6]
    t_start = time.monotonic()
    with ray_session(opts.address), _sigterm_as_interrupt():
        classes = cluster_classes(opts.cpus_per_job)
        jobs = plan_jobs(spec, classes, opts.only, opts.timeout_cap_s)
        todo = [j for j in jobs if j.job_id not in done_ids]
        skipped = len(jobs) - len(todo)
        used = {j.hardware for j in jobs}
        runlog.start_run(
            out,
            run_id,
            spec,
            opts.argv,
            {n: vars(classes[n]) for n in sorted(used)},
            planned=len(jobs),
            skipped=skipped,
        )
        print(
            f"sweep {spec.name!r}: {len(jobs)} jobs planned, {skipped} already done, {len(todo)} to run "
            f"on {', '.join(f'{n} ({classes[n].slots} slots)' for n in sorted(used)) or 'nothing'}; "
            f"run {run_id}, output {out}",
            file=stream,
            flush=True,
        )
        sink = ResultSink(out)
        progress = Progress(total=len(jobs), already_done=skipped, stream=stream)
        remotes = {name: _remote_for(classes[name], task_body) for name in used}
        queues: dict[str, deque[Job]] = {name: deque() for name in sorted(used)}
        for job in todo:
            queues[job.hardware].append(job)
        in_flight: dict[Any, tuple[Job, float]] = {}
        per_class = dict.fromkeys(queues, 0)
        extra_path = (os.getcwd(),)
        t_dispatch = time.monotonic()
        try:
            while in_flight or any(queues.values()):
                for name, queue in queues.items():
                    hw = classes[name]
                    while queue and per_class[name] < hw.slots:
                        job = queue.popleft()
                        ref = remotes[name].remote(
                            job.to_dict(), hw.cpus_per_job, opts.scratch_root, extra_path
                        )
                        in_flight[ref] = (job, time.monotonic())
                        per_class[name] += 1
                        progress.started_job()
                ready, _ = ray.wait(list(in_flight), num_returns=1, timeout=WAIT_S)
                if ready:
                    ready, _ = ray.wait(list(in_flight), num_returns=len(in_flight), timeout=0)
                for ref in ready:
                    job, t_submit = in_flight.pop(ref)
                    per_class[job.hardware] -= 1
                    wall = time.monotonic() - t_submit
                    try:
                        row = make_row(job, ray.get(ref), run_id=run_id, wall_s=wall)
                    except Exception as exc:  # the task itself failed: its worker or node died
                        row = failure_row(
                            job,
                            "crash",
                            f"Ray task failed: {_describe_task_error(exc)}",
                            run_id=run_id,
                            wall_s=wall,
                        )
                    sink.add(row)
                    progress.finished_job(job.name, row["status"], wall)
                sink.tick()
        except KeyboardInterrupt:
            for ref in in_flight:
                ray.cancel(ref, force=True)  # kills the worker; its job process dies with it
            sink.close()
            progress.close()
            runlog.finish_run(out, run_id, dict(progress.counts), interrupted=True)
            raise SweepInterrupted(
                f"interrupted: {sink.rows_written} rows of this run are saved in {out}; "
                f"{len(in_flight)} running jobs were cancelled. Resume with:\n"
                f"  orchestrate sweep {spec.source or 'SWEEP.yaml'} --out {out} --resume"
            ) from None
        sink.close()
        progress.close()
        dispatch_s = time.monotonic() - t_dispatch
    counts = dict(progress.counts)
    runlog.finish_run(out, run_id, counts)
    return SweepSummary(
        run_id=run_id,
        out_dir=out,
        planned=len(jobs),
        skipped=skipped,
        counts=counts,
        wall_s=time.monotonic() - t_start,
        dispatch_s=dispatch_s,
        hardware={n: classes[n].slots for n in sorted(used)},
    )
