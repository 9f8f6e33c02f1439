"""The Ray driver: connect (or start a private local cluster), plan, place jobs, collect rows.

The dispatch loop itself (windows per class, retries, lost classes) is `orchestrator.fleet.scheduler`;
every job ends as one row, whatever happened to its task.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import shlex
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, TextIO

from orchestrator.fleet.cache import check_address, shared_cache
from orchestrator.fleet.inventory import ACCEL_LABEL, HardwareClass, cluster_classes, resolve
from orchestrator.fleet.ordering import History, longest_first
from orchestrator.fleet.progress import Progress
from orchestrator.fleet.scheduler import Scheduler
from orchestrator.fleet.stopping import DeadlineReached, check_deadline, sigterm_as_interrupt
from orchestrator.fleet.support import row_error, triage
from orchestrator.spec.matrix import expand, select_matching
from orchestrator.spec.sweep import SweepSpec
from store import runlog
from store.location import printable
from store.lock import OutputLock
from store.reader import repair
from store.rows import failure_row
from store.schema import TABLES, table_spec
from store.sink import ResultSink
from store.storage import (
    Location,
    Target,
    WriteRefused,
    check_own_output,
    checked,
    refusal_stops,
)
from workers.job import Job
from workers.runner import plural


class OutputExistsError(RuntimeError):
    pass


class SweepInterrupted(RuntimeError):
    pass


class AddressError(ValueError):
    """A --address that no Ray cluster answers at; the message says what to check."""


def check_ray_address(address: str | None, timeout_s: float = 5.0) -> None:
    """Fail in seconds, before Ray starts, when nothing listens at `address` (Ray itself retries a
    dead address for a minute and then prints a page of log). None and "local" start a private
    Ray; "auto" must find a cluster started on this machine with `ray start`."""
    import socket

    if address in (None, "", "local"):
        return
    shown = printable(address)  # a newline must not split the line
    if address == "auto":
        from ray._private.services import canonicalize_bootstrap_address

        try:
            address = canonicalize_bootstrap_address("auto")
        except (ConnectionError, ValueError):
            address = None
        if not address:
            raise AddressError(
                "--address auto: no Ray cluster runs on this machine (start one with `ray start --head`, "
                "give its address, or leave out --address for a private local Ray)"
            )
    target = address.removeprefix("ray://")
    if "://" in target:
        raise AddressError(
            f"--address {shown}: give HOST:PORT (the cluster's GCS, e.g. head:6379) or ray://HOST:10001; "
            f"an http:// address is the dashboard, which `orchestrate submit` uses"
        )
    host, _, port_text = target.rpartition(":")
    if not host or not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise AddressError(f"--address {shown}: expected HOST:PORT, e.g. 10.0.0.5:6379 or ray://head:10001")
    try:
        conn = socket.create_connection((host.strip("[]"), int(port_text)), timeout=timeout_s)
    except UnicodeError:  # a host name no DNS label can hold
        raise AddressError(f"--address {shown[:80]}...: {host[:60]!r}... is not a host name") from None
    except OSError as exc:
        reason = exc.strerror or str(exc) or type(exc).__name__
        raise AddressError(
            f"--address {shown}: nothing answers at {host}:{port_text} ({reason}); is the cluster up "
            "(`ray status` on its head node) and the port open from here?"
        ) from None
    with conn:
        _check_grpc(conn, shown, f"{host}:{port_text}", timeout_s)


_HTTP2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes([0, 0, 0, 4, 0, 0, 0, 0, 0])
"""An HTTP/2 client's first bytes, then an empty SETTINGS frame: a gRPC server (Ray's GCS, its
Client server) answers with a SETTINGS frame of its own."""


def _check_grpc(conn, shown: str, where: str, timeout_s: float) -> None:
    """Fail in seconds where the port takes connections but is no gRPC server (Ray would wait for
    it for good, deaf to SIGTERM): send the HTTP/2 preface and expect a SETTINGS frame back.
    Skipped under RAY_USE_TLS, whose servers expect a TLS handshake first."""
    if os.environ.get("RAY_USE_TLS", "0").lower() in ("1", "true"):
        return
    head = b""
    try:
        conn.settimeout(timeout_s)
        conn.sendall(_HTTP2_PREFACE)
        while len(head) < 9:
            chunk = conn.recv(9 - len(head))
            if not chunk:
                break
            head += chunk
    except TimeoutError:
        raise AddressError(
            f"--address {shown}: {where} accepts connections but sent nothing in {timeout_s:g} s; it is "
            "not a Ray cluster's GCS (head:6379) or Ray Client server (ray://head:10001), or it hangs"
        ) from None
    except OSError:  # reset or closed on us: judged by what came before
        pass
    if len(head) < 9 or head[3] != 4:
        raise AddressError(
            f"--address {shown}: {where} answers, but not as a Ray cluster (no gRPC); give the GCS address "
            "(head:6379) or ray://head:10001, not the dashboard or another service"
        )


@dataclass
class SweepOptions:
    out_dir: Target
    """A local path or a `pyarrow.fs` URI (s3://bucket/prefix, gs://..., file:///...)."""
    address: str | None = None
    """Ray cluster address; None starts a private local cluster for this sweep."""
    resume: bool = False
    only: str | None = None
    cpus_per_job: int | None = None
    timeout_cap_s: float | None = None
    """Upper bound on every job's time limit (for runs that must end within a window)."""
    allow_missing: bool = False
    """Run the classes that are present when the sweep names some the cluster lacks."""
    max_attempts: int = 3
    """Tries per job when its worker or node dies (a job's own failure is never retried)."""
    history_dirs: list[Target] = field(default_factory=list)
    """Earlier output directories (paths or URIs) whose job times order this sweep (longest
    first); their rows never count as done."""
    scratch_root: str | None = None
    """Where job subprocesses keep their caches and logs (default: the system temp dir)."""
    lock_clocks: bool = False
    """Lock each GPU job's SM clock at its maximum through NVML (root only); rows say if it took."""
    shared_cache: bool = False
    """Jobs compile through Inductor's remote caches on a Redis server shared by the sweep's jobs
    (their compile_s is then not a cold compile; rows say what the cache served). Off by default:
    a sweep measures cold compiles."""
    cache_redis: str | None = None
    """HOST:PORT of an existing Redis server for `shared_cache`; None starts a private one on
    127.0.0.1 for the sweep (reachable by jobs on this machine only)."""
    argv: list[str] = field(default_factory=list)
    resume_command: str | None = None
    """The command an interrupted run prints to resume (default: this sweep with --resume)."""
    deadline: float | None = None
    """`time.monotonic()` at which the run stops as on Ctrl-C (--deadline: a batch job's walltime,
    a spot instance's notice): running jobs cancelled, every finished row kept, exit 130."""


@dataclass
class SweepSummary:
    run_id: str
    out_dir: Location
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


def _remote_for(hw: HardwareClass, gpu_classes: list[str], body: Callable[..., dict[str, Any]] | None = None):
    """The per-job remote function of a class: its slot's resources and its placement.

    GPU classes: one GPU, the `accelerator_type:<class>` resource (on every node of that type,
    autoscaled ones too) and, where all its nodes carry it, the class's label: a node labelled as
    another class still has the resource of the GPU Ray detects. CPU class: a label selector that
    keeps CPU jobs off GPU nodes, whose cores belong to their GPU jobs."""
    import ray

    from workers.task import execute_job

    opts: dict[str, Any] = {"num_cpus": hw.cpus_per_job, "max_retries": 0}
    if hw.device == "cuda":
        opts["num_gpus"] = 1
        opts["max_calls"] = 0  # the Ray worker never touches CUDA itself: reuse it across jobs
        if hw.name != "GPU":
            opts["resources"] = {f"accelerator_type:{hw.name}": 0.001}
            if hw.labelled:
                opts["label_selector"] = {ACCEL_LABEL: hw.name}
    elif gpu_classes:
        # no space after the commas: Ray reads " T4" as a value of its own, and T4 nodes would match
        opts["label_selector"] = {ACCEL_LABEL: f"!in({','.join(gpu_classes)})"}
    return ray.remote(**opts)(body or execute_job)


def plan_jobs(
    spec: SweepSpec,
    classes: dict[str, HardwareClass],
    only: str | None,
    timeout_cap_s: float | None = None,
    allow_missing: bool = False,
) -> list[Job]:
    hardware = resolve(spec.hardware, classes, allow_missing)
    jobs = select_matching(expand(spec, {name: hw.device for name, hw in hardware.items()}), only)
    if timeout_cap_s:
        jobs = [dataclasses.replace(j, timeout_s=min(j.timeout_s, timeout_cap_s)) for j in jobs]
    return jobs


def run_sweep(
    spec: SweepSpec,
    opts: SweepOptions,
    stream: TextIO | None = None,
    task_body: Callable[..., dict[str, Any]] | None = None,
    plan: Callable[[dict[str, HardwareClass]], list[Job]] | None = None,
) -> SweepSummary:
    """Run every job of `spec` not yet in `opts.out_dir`; return what happened.

    `task_body` replaces the per-job task (`workers.task.execute_job`, same arguments and
    result); the dispatch benchmark uses it to push synthetic jobs through the real driver.
    `plan` replaces the sweep's job matrix: it gets the cluster's hardware classes and returns
    the jobs to run (`orchestrate tune` plans each rung of its search this way).

    Before Ray starts: an output or history location that cannot be used raises
    `storage.StorageError`, an output another live driver holds `lock.OutputLocked`, a dead
    `opts.address` `AddressError`, a dead `opts.cache_redis` `cache.CacheAddressError` (when the
    sweep shares its compile cache). With `opts.resume`, damaged part files are moved into
    `<out>/quarantine/` first, so their jobs run again (`store.integrity`)."""
    stream = stream or sys.stderr
    out = checked(opts.out_dir)
    check_own_output(out)  # not `/` or a home directory
    history_dirs = [checked(h) for h in opts.history_dirs]
    check_ray_address(opts.address)
    if opts.shared_cache and opts.cache_redis:
        check_address(opts.cache_redis)
    resume = opts.resume_command or shlex.join(
        ["orchestrate", "sweep", str(spec.source or "SWEEP.yaml"), "--out", str(out), "--resume"]
    )
    with refusal_stops(out, "no job of this run was recorded", resume):  # the lock, quarantine/, run.json
        lock = OutputLock.acquire(out, opts.argv)  # before anything is read: one writer per output
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())  # this run's quarantine folder
        try:
            if lock.taken_over:
                print(f"note: {out}: {lock.taken_over}", file=stream)
            if opts.resume:
                _quarantine_damage(out, stream, stamp)
            return _run_locked(spec, opts, out, history_dirs, lock, stream, stamp, task_body, plan, resume)
        finally:
            lock.release()


def _quarantine_damage(out: Location, stream: TextIO, stamp: str) -> None:
    """Before a resumed sweep reads which jobs are done: move every part the strict reader refuses
    (damaged, foreign, a second row of a job) aside, so its jobs run again, and leave a commit
    ledger listing exactly the parts kept; name the strays, which stay and are ignored."""
    fixed = repair(out, [table_spec(t) for t in TABLES], stamp)
    if fixed.ledger_moved:
        what, dest = fixed.ledger_moved
        print(f"warning: {out.join('_ledger')} was {what}, not a ledger; moved to {dest}", file=stream)
    for rel in fixed.strays:
        print(
            f"warning: ignoring {out.join(rel)}: not a part file this tool writes; move it out", file=stream
        )
    if fixed.adopted:
        print(
            f"note: {out} was written before outputs had a commit ledger; its {fixed.adopted} part file(s) "
            "are listed in it now",
            file=stream,
        )
    for d, dest in fixed.moved:
        whose = (
            "its jobs run again"
            if d.rel.startswith("results/")
            else (
                "the jobs' result rows are intact, so they are not rerun; their rows of this table are lost"
            )
        )
        where = f"moved to {dest}" if dest else "dropped from the commit ledger"
        print(f"warning: {out.join(d.rel)} is {d.kind} ({d.reason}); {where}: {whose}", file=stream)


def _run_locked(
    spec: SweepSpec,
    opts: SweepOptions,
    out: Location,
    history_dirs: list[Location],
    lock: OutputLock,
    stream: TextIO,
    stamp: str,
    task_body: Callable[..., dict[str, Any]] | None,
    plan: Callable[[dict[str, HardwareClass]], list[Job]] | None,
    resume: str,
) -> SweepSummary:
    """The sweep, with the lock held. A write the output's filesystem refuses (full, read-only)
    stops it as Ctrl-C does: running jobs cancelled, rows on disk kept; `WriteRefused` then says
    what was saved, what was not, and the command that resumes."""
    import ray

    if opts.resume:  # before the rows are read: every reader refuses a damaged run.json
        runlog.set_aside_if_damaged(out, stream, stamp)
    history = History.from_output(out, history_dirs)  # one read: job ids done, and durations
    runlog.check_same_sweep(out, spec, history.sweeps)
    done_ids = history.job_ids
    if history.recorded and not opts.resume:
        raise OutputExistsError(
            f"{out} already holds {history.recorded} result rows. Pass --resume to finish that sweep, "
            "or --out to write somewhere else; nothing was changed."
        )
    run_id = time.strftime("%Y%m%dT%H%M%S") + "-" + uuid.uuid4().hex[:6]
    t_start = time.monotonic()
    with (
        shared_cache(
            opts.shared_cache, opts.cache_redis, opts.scratch_root, stream, keep=out
        ) as cache_address,
        ray_session(opts.address),
        sigterm_as_interrupt(),
    ):
        classes = cluster_classes(opts.cpus_per_job)
        if plan is not None:
            jobs = plan(classes)
        else:
            jobs = plan_jobs(spec, classes, opts.only, opts.timeout_cap_s, opts.allow_missing)
        todo = [j for j in jobs if j.job_id not in done_ids]
        skipped = len(jobs) - len(todo)
        checked_jobs = triage(todo)  # cells the capability table rules out get rows, not tasks
        todo = checked_jobs.runnable
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
        if cache_address and not opts.cache_redis and opts.address not in (None, "", "local"):
            print(
                f"note: shared compile cache: a private Redis at {cache_address} serves the jobs on this "
                "machine only; give --cache-redis HOST:PORT of a server every node reaches",
                file=stream,
            )
        if opts.lock_clocks and not any(classes[n].device == "cuda" for n in used):
            print("note: --lock-clocks: this sweep runs on no GPU class; nothing to lock", file=stream)
        print(
            f"sweep {spec.name!r}: {len(jobs)} jobs planned, {skipped} already done, "
            + (f"{len(checked_jobs.unsupported)} unsupported, " if checked_jobs.unsupported else "")
            + f"{len(todo)} to run "
            f"on {', '.join(f'{n} ({classes[n].slots} slots)' for n in sorted(used)) or 'nothing'}; "
            f"run {run_id}, output {out}",
            file=stream,
            flush=True,
        )
        for _, notes in sorted(checked_jobs.notes.items()):
            print("".join(f"note: {n}\n" for n in notes), end="", file=stream)
        sink = ResultSink(out)
        progress = Progress(total=len(jobs), already_done=skipped, stream=stream)

        unlocked: set[str] = set()

        def emit(
            row: dict[str, Any], job: Job, wall: float | None, tables: dict[str, list] | None = None
        ) -> None:
            sink.add(row, tables)
            progress.finished_job(job.name, row["status"], wall)
            if opts.lock_clocks and row.get("clocks_locked") is False and job.hardware not in unlocked:
                unlocked.add(job.hardware)
                why = next((n for n in (row.get("notes") or "").split("; ") if "--lock-clocks" in n), "")
                progress.message(f"warning: {job.hardware}: clocks not locked, jobs run unlocked. {why}")

        for job, reason in checked_jobs.unsupported:
            emit(failure_row(job, "unsupported", row_error(reason), run_id=run_id), job, None)
        gpu_classes = sorted(n for n, hw in classes.items() if hw.device == "cuda")
        scheduler = Scheduler(
            classes=classes,
            remotes={name: _remote_for(classes[name], gpu_classes, task_body) for name in used},
            task_args=(opts.scratch_root, (os.getcwd(),), opts.lock_clocks),
            run_id=run_id,
            emit=emit,
            inventory=lambda: cluster_classes(opts.cpus_per_job),
            max_attempts=opts.max_attempts,
            task_kwargs={"shared_cache": cache_address} if cache_address else {},
            keep=sink.add_side,
        )
        scheduler.add(longest_first(todo, history))
        t_dispatch = time.monotonic()

        def tick() -> None:
            sink.tick()
            lock.refresh()
            check_deadline(opts.deadline)

        try:
            check_deadline(opts.deadline)  # Ray's start may have taken what was left
            scheduler.run(ray, started=progress.started_job, tick=tick)
            sink.close()
        # Ctrl-C, SIGTERM, --deadline (all KeyboardInterrupt), a full or read-only disk
        except (KeyboardInterrupt, WriteRefused) as exc:
            cancelled = scheduler.cancel_all(ray)
            refused = exc if isinstance(exc, WriteRefused) else None
            if refused is None:
                try:
                    sink.close()
                except WriteRefused as late:  # the rows in hand did not fit either
                    refused = late
            progress.close()
            with contextlib.suppress(OSError):  # run.json only describes runs: a full disk may refuse it
                runlog.finish_run(
                    out,
                    run_id,
                    dict(progress.counts),
                    interrupted=True,
                    dispatch_s=time.monotonic() - t_dispatch,
                )
            if refused is not None:
                unrecorded = len(todo) + len(checked_jobs.unsupported) - sink.rows_written
                saved = (
                    f"{sink.rows_written} rows of this run saved, {unrecorded} of its jobs not recorded"
                    + (f" ({cancelled} running jobs cancelled)" if cancelled else "")
                )
                raise refused.stopped(saved, resume) from None
            why = "the deadline (--deadline) passed" if isinstance(exc, DeadlineReached) else "interrupted"
            kept = sink.rows_written
            raise SweepInterrupted(
                f"{why}: {plural(kept, 'row')} of this run {'is' if kept == 1 else 'are'} saved in {out}; "
                f"{plural(cancelled, 'running job')} {'was' if cancelled == 1 else 'were'} cancelled. "
                f"Resume with:\n  {resume}"
            ) from None
        progress.close()
        dispatch_s = time.monotonic() - t_dispatch
    counts = dict(progress.counts)
    saved = f"all {sink.rows_written} rows of this run saved, but not the end of the run in {runlog.RUN_FILE}"
    with refusal_stops(out, saved, resume):
        runlog.finish_run(out, run_id, counts, dispatch_s=dispatch_s)
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
