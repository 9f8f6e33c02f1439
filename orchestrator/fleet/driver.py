"""The Ray driver: connect (or start a private local cluster), plan, place jobs, collect rows.

`run_sweep` checks what it can before Ray starts (`--address`: `orchestrator.fleet.address`), takes
the output's lock, reads what the output holds (`orchestrator.fleet.existing`), then runs: plan ->
start the run log -> dispatch -> finish, or stop (Ctrl-C, SIGTERM, --deadline, a refused write).
The dispatch loop itself (windows per class, retries, lost classes) is `orchestrator.fleet.scheduler`;
every job ends as one row, whatever happened to its task. How a job becomes a Ray task (the
connection, each class's remote function and its placement) is `orchestrator.fleet.ray_tasks`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shlex
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TextIO

from compiler.job import Job
from orchestrator.fleet.cache import CacheLive, shared_cache
from orchestrator.fleet.existing import quarantine_damage, read_done
from orchestrator.fleet.inventory import HardwareClass, cluster_classes, resolve
from orchestrator.fleet.options import SweepOptions
from orchestrator.fleet.ordering import History, longest_first
from orchestrator.fleet.preflight import Checked, check_inputs
from orchestrator.fleet.progress import Progress
from orchestrator.fleet.ray_tasks import ray_session, remote_for, task_kwargs, uses_lanes
from orchestrator.fleet.scheduler import Scheduler
from orchestrator.fleet.stopping import DeadlineReached, check_deadline, sigterm_as_interrupt
from orchestrator.fleet.summary import SweepSummary
from orchestrator.fleet.support import Triage, row_error, triage
from orchestrator.spec.matrix import expand, select_matching
from orchestrator.spec.sweep import SweepSpec
from store import runlog
from store.lock import OutputLock
from store.rows import failure_row
from store.sink import ResultSink
from store.storage import (
    Location,
    WriteRefused,
    refusal_stops,
)
from workers.lanes import LANE_DEPTH
from workers.runner import plural


class SweepInterrupted(RuntimeError):
    pass


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
    ready: Checked | None = None,
) -> SweepSummary:
    """Run every job of `spec` not yet in `opts.out_dir`; return what happened.

    `task_body` replaces the per-job task (`workers.task.execute_job`, same arguments and
    result); the dispatch benchmark uses it to push synthetic jobs through the real driver.
    `plan` replaces the sweep's job matrix: it gets the cluster's hardware classes and returns
    the jobs to run (`orchestrate tune` plans each rung of its search this way). `ready`: what
    `preflight(opts)` found, where the caller ran it (the CLI, after its flags' checks and its
    plan on this machine); else `preflight.check_inputs` checks all of that here (a notebook).

    Before Ray starts: `check_inputs`' errors (`TypeError`, `OptionsError`, `preflight`'s, and
    for a private local Ray `MissingHardwareError`, `NoJobMatches`), and an output another live
    driver holds raises `lock.OutputLocked`. With `opts.resume`, damaged part files are moved into
    `<out>/quarantine/` first, so their jobs run again (`store.integrity`)."""
    stream = stream or sys.stderr
    if ready is None:
        ready = check_inputs(spec, opts, plan or (lambda classes: _planned(spec, opts, classes)))
    out = ready.out
    resume = opts.resume_command or _resume_command(spec, out)
    with refusal_stops(out, "no job of this run was recorded", resume):  # the lock, quarantine/, run.json
        lock = OutputLock.acquire(out, opts.argv)  # before anything is read: one writer per output
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())  # this run's quarantine folder
        try:
            if lock.taken_over:
                print(f"note: {out}: {lock.taken_over}", file=stream)
            if opts.resume:
                quarantine_damage(out, stream, stamp)
            return _run_locked(spec, opts, ready, lock, stream, stamp, task_body, plan, resume)
        finally:
            lock.release()


def _planned(spec: SweepSpec, opts: SweepOptions, classes: dict[str, HardwareClass]) -> list[Job]:
    return plan_jobs(spec, classes, opts.only, opts.timeout_cap_s, opts.allow_missing)


def _resume_command(spec: SweepSpec, out: Location) -> str:
    """What an interrupted run says resumes it: the CLI's command for a sweep file, the call for a
    sweep built from a dict (no file to give the CLI)."""
    if not spec.source:
        return f"run_sweep(spec, SweepOptions(out_dir={str(out)!r}, resume=True))"
    return shlex.join(["orchestrate", "sweep", spec.source, "--out", str(out), "--resume"])


@dataclass
class _Plan:
    """One run's jobs on the cluster's hardware classes: every job planned, how many of them the
    output already holds, and the rest triaged into those to dispatch and those to record unrun."""

    run_id: str
    classes: dict[str, HardwareClass]
    jobs: list[Job]
    """Every job planned on this cluster, those already done included."""
    skipped: int
    """Planned jobs whose rows the output already holds."""
    triage: Triage
    """The other jobs: `runnable` ones to dispatch, `unsupported` ones (their class cannot run
    them) to record as rows without a task."""
    used: set[str] = field(init=False)
    """The classes the planned jobs run on."""

    def __post_init__(self) -> None:
        self.used = {j.hardware for j in self.jobs}

    @property
    def todo(self) -> list[Job]:
        """The jobs to dispatch."""
        return self.triage.runnable


class _Recorder:
    """Where every finished job goes: its row (and its rows of the other tables) into the output's
    sink, a line of progress and, under --lock-clocks, one warning per class whose clocks did not
    lock. A row whose job could not use the shared cache has the cache checked at once
    (`CacheLive.check`), so that a dead server is dropped for the next jobs without waiting for
    the next periodic check."""

    def __init__(
        self, sink: ResultSink, progress: Progress, lock_clocks: bool, cache: CacheLive | None = None
    ):
        self.sink = sink
        self.progress = progress
        self.lock_clocks = lock_clocks
        self.cache = cache
        self.unlocked: set[str] = set()

    def emit(
        self, row: dict[str, Any], job: Job, wall: float | None, tables: dict[str, list] | None = None
    ) -> None:
        """One finished job: its row, and its rows of the other tables (`tables`)."""
        self.sink.add(row, tables)
        self.progress.finished_job(job.name, row["status"], wall)
        if self.cache is not None and row.get("compile_cache") == "unavailable":
            self.cache.check()
        if self.lock_clocks and row.get("clocks_locked") is False and job.hardware not in self.unlocked:
            self.unlocked.add(job.hardware)
            why = next((n for n in (row.get("notes") or "").split("; ") if "--lock-clocks" in n), "")
            self.progress.message(f"warning: {job.hardware}: clocks not locked, jobs run unlocked. {why}")

    def record_unsupported(self, run: _Plan) -> None:
        """The jobs their class cannot run, as `unsupported` rows: no task runs them."""
        for job, reason in run.triage.unsupported:
            self.emit(failure_row(job, "unsupported", row_error(reason), run_id=run.run_id), job, None)


def _run_locked(
    spec: SweepSpec,
    opts: SweepOptions,
    ready: Checked,
    lock: OutputLock,
    stream: TextIO,
    stamp: str,
    task_body: Callable[..., dict[str, Any]] | None,
    plan: Callable[[dict[str, HardwareClass]], list[Job]] | None,
    resume: str,
) -> SweepSummary:
    """The sweep, with the lock held: plan, start the run's entry in run.json, dispatch, then
    finish (the normal end) or stop. Ctrl-C, SIGTERM, --deadline and a write the output's
    filesystem refuses (full, read-only) all stop it alike: running jobs cancelled, rows on disk
    kept; `SweepInterrupted`, or `WriteRefused`, then says what was saved, what was not, and the
    command that resumes."""
    import ray

    out = ready.out
    history = read_done(spec, out, ready.history, opts.resume, stream, stamp)
    run_id = time.strftime("%Y%m%dT%H%M%S") + "-" + uuid.uuid4().hex[:6]
    t_start = time.monotonic()
    with (
        shared_cache(opts.shared_cache, ready.cache, opts.scratch_root, stream, keep=out) as cache,
        ray_session(opts.address),
        sigterm_as_interrupt(),
    ):
        run = _plan_run(spec, opts, history, plan, run_id)
        _start_run_log(out, spec, opts, run)
        _announce(spec, opts, run, out, cache, stream)
        progress = Progress(total=len(run.jobs), already_done=run.skipped, stream=stream)
        recorder = _Recorder(ResultSink(out), progress, opts.lock_clocks, cache)
        recorder.record_unsupported(run)
        scheduler = _scheduler(run, opts, recorder, task_body, cache)
        scheduler.add(longest_first(run.todo, history))
        t_dispatch = time.monotonic()
        try:
            _dispatch(ray, scheduler, recorder, lock, opts.deadline)
        # Ctrl-C, SIGTERM, --deadline (all KeyboardInterrupt), a full or read-only disk
        except (KeyboardInterrupt, WriteRefused) as exc:
            raise _stop(exc, ray, scheduler, recorder, run, out, resume, t_dispatch) from None
        finally:
            progress.close()  # the live view ends (and the terminal's cursor is back) whatever happened
        dispatch_s = time.monotonic() - t_dispatch
    return _finish(out, run, recorder, resume, dispatch_s, t_start)


def _plan_run(
    spec: SweepSpec,
    opts: SweepOptions,
    history: History,
    plan: Callable[[dict[str, HardwareClass]], list[Job]] | None,
    run_id: str,
) -> _Plan:
    """The jobs of this run on the cluster's classes (`plan`'s, else the sweep's matrix), less those
    done, triaged: cells the capability table rules out get rows, not tasks."""
    classes = cluster_classes(opts.cpus_per_job)
    jobs = plan(classes) if plan is not None else _planned(spec, opts, classes)
    todo = [j for j in jobs if j.job_id not in history.job_ids]
    return _Plan(run_id, classes, jobs, skipped=len(jobs) - len(todo), triage=triage(todo))


def _start_run_log(out: Location, spec: SweepSpec, opts: SweepOptions, run: _Plan) -> None:
    """This run's entry in the output's run.json: the sweep, the command, the classes it uses and
    its counts, before any job starts."""
    runlog.start_run(
        out,
        run.run_id,
        spec,
        opts.argv,
        {n: vars(run.classes[n]) for n in sorted(run.used)},
        planned=len(run.jobs),
        skipped=run.skipped,
    )


def _announce(
    spec: SweepSpec,
    opts: SweepOptions,
    run: _Plan,
    out: Location,
    cache: CacheLive | None,
    stream: TextIO,
) -> None:
    """Say what this run does: a note where a private compile cache serves this machine only and
    where --lock-clocks has no GPU to lock, the plan's line, and the notes of the classes' jobs
    that run without something."""
    if cache and cache.server is not None and opts.address not in (None, "", "local"):
        print(
            f"note: shared compile cache: a private Redis at {cache} serves the jobs on this "
            "machine only; give --cache-redis URL of a server every node reaches",
            file=stream,
        )
    if opts.lock_clocks and not any(run.classes[n].device == "cuda" for n in run.used):
        print("note: --lock-clocks: this sweep runs on no GPU class; nothing to lock", file=stream)
    unsupported = run.triage.unsupported
    print(
        f"sweep {spec.name!r}: {len(run.jobs)} jobs planned, {run.skipped} already done, "
        + (f"{len(unsupported)} unsupported, " if unsupported else "")
        + f"{len(run.todo)} to run "
        f"on {', '.join(f'{n} ({run.classes[n].slots} slots)' for n in sorted(run.used)) or 'nothing'}; "
        f"run {run.run_id}, output {out}",
        file=stream,
        flush=True,
    )
    for _, notes in sorted(run.triage.notes.items()):
        print("".join(f"note: {n}\n" for n in notes), end="", file=stream)
    if opts.address in (None, "", "local"):
        held = held_cores_warning(run)
        if held:
            print(held, file=stream, flush=True)


def held_cores_warning(run: _Plan) -> str:
    """On the embedded local Ray: a warning where other jobs (another sweep on this machine) hold
    the cores this run's jobs pin themselves to, with how many of its jobs would run unpinned if
    they kept them (`workers.affinity.held_cores`); "" where enough cores are free."""
    from workers.affinity import held_cores, lock_dir

    held, cores = held_cores()
    if not held:
        return ""
    free = cores - held
    cpu = [run.classes[n] for n in run.used if run.classes[n].device != "cuda"]
    want = max((hw.cpus_per_job for hw in cpu), default=1)
    pinned_at_once = free // want
    what = (
        f"all {len(run.todo)} jobs will run unpinned while they are held"
        if pinned_at_once == 0
        else f"at most {pinned_at_once} job(s) at a time can pin {want} free core(s); the rest run unpinned"
    )
    return (
        f"warning: {held} of this machine's {cores} cores are held by other jobs (another sweep; core "
        f"locks in {lock_dir()}): {what}, sharing cores with that work, and their timings will be marked as "
        "doubted. Wait for it to end for timings you can trust."
    )


def _scheduler(
    run: _Plan,
    opts: SweepOptions,
    recorder: _Recorder,
    task_body: Callable[..., dict[str, Any]] | None,
    cache: CacheLive | None,
) -> Scheduler:
    """The dispatch loop of this run: a remote function per class used, every row to `recorder`,
    the rows of cancelled jobs' other tables kept."""
    gpu_classes = sorted(n for n, hw in run.classes.items() if hw.device == "cuda")
    lanes = uses_lanes(opts, task_body)
    return Scheduler(
        classes=run.classes,
        remotes={name: remote_for(run.classes[name], gpu_classes, task_body, lanes) for name in run.used},
        depth={name: LANE_DEPTH for name in gpu_classes} if lanes else {},
        task_args=(opts.scratch_root, (os.getcwd(),), opts.lock_clocks),
        run_id=run.run_id,
        emit=recorder.emit,
        inventory=lambda: cluster_classes(opts.cpus_per_job),
        max_attempts=opts.max_attempts,
        task_kwargs=task_kwargs(opts, lanes),
        sent_kwargs=(lambda: {"shared_cache": cache.access}) if cache is not None else None,
        keep=recorder.sink.add_side,
    )


def _dispatch(
    ray, scheduler: Scheduler, recorder: _Recorder, lock: OutputLock, deadline: float | None
) -> None:
    """Run every job to its row, then write the last rows. Between results: the sink flushes, the
    lock is kept fresh, and a passed --deadline raises `DeadlineReached`."""

    phases = job_phases(ray, scheduler, recorder.progress)

    def tick() -> None:
        phases()
        recorder.progress.tick()
        recorder.sink.tick()
        lock.refresh()
        check_deadline(deadline)

    check_deadline(deadline)  # Ray's start may have taken what was left
    scheduler.run(ray, started=recorder.progress.started_job, tick=tick)
    recorder.sink.close()


PHASE_POLL_S = 1.0
"""How often the driver reads what its running jobs do (`workers.task.phase_key`)."""


def job_phases(ray, scheduler: Scheduler, progress: Progress) -> Callable[[], None]:
    """A check, at most every `PHASE_POLL_S` and only where the live view shows it, of what each
    running job does (its task puts it in Ray's key-value store: its process's phase, or the GPU
    it waits for), handed to `progress`; a store that cannot be read leaves the phases as they are."""
    from ray.experimental import internal_kv

    from workers.task import PHASE_NAMESPACE, phase_key

    state = {"at": 0.0, "driver": None}

    def poll() -> None:
        now = time.monotonic()
        if not progress.shows_phases or now - state["at"] < PHASE_POLL_S:
            return
        state["at"] = now
        with contextlib.suppress(Exception):  # a courtesy of the view: never a reason to stop
            driver = state["driver"] = state["driver"] or ray.get_runtime_context().get_job_id()
            for running in list(scheduler.running.values()):
                found = internal_kv._internal_kv_get(
                    phase_key(driver, running.job.job_id), namespace=PHASE_NAMESPACE
                )
                if found:
                    progress.set_phase(running.job.name, found.decode(errors="replace"))

    return poll


def _stop(
    exc: KeyboardInterrupt | WriteRefused,
    ray,
    scheduler: Scheduler,
    recorder: _Recorder,
    run: _Plan,
    out: Location,
    resume: str,
    t_dispatch: float,
) -> WriteRefused | SweepInterrupted:
    """The run stopped by `exc` (Ctrl-C, SIGTERM, --deadline, a refused write): cancel the running
    jobs, write the rows in hand, mark the run interrupted in run.json where the disk takes it, and
    return the error that says what was saved and how to resume."""
    sink = recorder.sink
    cancelled = scheduler.cancel_all(ray)
    refused = exc if isinstance(exc, WriteRefused) else None
    if refused is None:
        try:
            sink.close()
        except WriteRefused as late:  # the rows in hand did not fit either
            refused = late
    recorder.progress.close()
    with contextlib.suppress(OSError):  # run.json only describes runs: a full disk may refuse it
        runlog.finish_run(
            out,
            run.run_id,
            dict(recorder.progress.counts),
            interrupted=True,
            dispatch_s=time.monotonic() - t_dispatch,
        )
    if refused is not None:
        unrecorded = len(run.todo) + len(run.triage.unsupported) - sink.rows_written
        saved = f"{sink.rows_written} rows of this run saved, {unrecorded} of its jobs not recorded" + (
            f" ({cancelled} running jobs cancelled)" if cancelled else ""
        )
        return refused.stopped(saved, resume)
    why = "the deadline (--deadline) passed" if isinstance(exc, DeadlineReached) else "interrupted"
    kept = sink.rows_written
    return SweepInterrupted(
        f"{why}: {plural(kept, 'row')} of this run {'is' if kept == 1 else 'are'} saved in {out}; "
        f"{plural(cancelled, 'running job')} {'was' if cancelled == 1 else 'were'} cancelled. "
        f"Resume with:\n  {resume}"
    )


def _finish(
    out: Location, run: _Plan, recorder: _Recorder, resume: str, dispatch_s: float, t_start: float
) -> SweepSummary:
    """The normal end, Ray stopped: the run's end in run.json (a refused write says every row is
    saved), and the summary (with the command that runs its `harness_error` jobs again)."""
    counts = dict(recorder.progress.counts)
    saved = f"all {recorder.sink.rows_written} rows of this run saved, but not the end of the run in {runlog.RUN_FILE}"
    with refusal_stops(out, saved, resume):
        runlog.finish_run(out, run.run_id, counts, dispatch_s=dispatch_s)
    return SweepSummary(
        run_id=run.run_id,
        out_dir=out,
        planned=len(run.jobs),
        skipped=run.skipped,
        counts=counts,
        wall_s=time.monotonic() - t_start,
        dispatch_s=dispatch_s,
        hardware={n: run.classes[n].slots for n in sorted(run.used)},
        resume_command=resume,
    )
