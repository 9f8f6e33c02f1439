"""Run one job in a fresh subprocess with its own caches, thread counts and a hard timeout.

The subprocess is `python -m workers.bench`. Whatever happens to it (a segfault, a hang, an
exception, running out of memory, its scratch filling up) this module returns a result dict with
a `status`; it never raises for a job's failure. Each process's status is decided once it has
ended, in one place, `workers.outcome.classify` (called by `_run_bench`); the job's scratch
directory is made and checked by `workers.scratch`. The whole process tree (Inductor's compile workers included) is
killed on timeout, on cancellation, and when the caller's thread is interrupted; and when this
process dies, even of SIGKILL, the job process dies with it (PR_SET_PDEATHSIG) and a guard it
forked kills its process group, every descendant included (`compiler.env.guard_process_group`,
docs/fleet.md, "No orphans"). A job whose
first process ends before its compile returns keeps the kernel choices that compile had
streamed to disk, marked partial (`keep_streamed_choices`); so does a job cancelled then
(`JobCancelled` carries them to the task, which returns them instead of a result). A job's
later processes start while the one before each is past its compile, on the node's spare
cores, and wait at a gate until it has ended (`workers.ahead`); a process started ahead that
does not get to run is ended with the job.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil

from compiler import clocks
from compiler.cache_access import CacheAccess
from compiler.env import project_pythonpath
from compiler.job import Job
from compiler.kernels import read_choice_stream
from compiler.shared_cache import cache_environment
from workers import affinity, cache_retry, scratch
from workers.ahead import Overlap, Started, Step
from workers.bench import PARENT_PID_ENV, SPAWNED_AT_ENV, choices_stream
from workers.lanes import VISIBLE, Held, Lane, LaneStopped
from workers.outcome import classify
from workers.repeats import merge

POLL_S = 0.1
KILL_GRACE_S = 3.0


def job_environment(
    scratch: Path,
    threads: int,
    base: dict[str, str] | None = None,
    extra_path: tuple[str, ...] = (),
    shared_cache: CacheAccess | None = None,
) -> dict[str, str]:
    """Environment of a job subprocess: private compile caches (so every compile is cold and
    jobs never share state), explicit thread counts, no network access to model hubs. With
    `shared_cache` (the access to a Redis server: `compiler.cache_access`) Inductor's remote caches
    are on and the job shares its compile work there (`compiler.shared_cache`; the secret goes
    into the environment, never the command line); without it every remote cache is
    pinned off, whatever the caller's environment says."""
    env = dict(os.environ if base is None else base)
    threads_s = str(max(1, threads))
    env.update(
        TORCHINDUCTOR_CACHE_DIR=str(scratch / "inductor"),
        TRITON_CACHE_DIR=str(scratch / "triton"),
        OMP_NUM_THREADS=threads_s,
        MKL_NUM_THREADS=threads_s,
        TORCHINDUCTOR_COMPILE_THREADS=threads_s,
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        PYTHONUNBUFFERED="1",
        PYTHONFAULTHANDLER="1",
    )
    cache_environment(env, shared_cache)
    env[PARENT_PID_ENV] = str(os.getpid())
    # The job imports this project's packages: make sure the subprocess finds them the way we did.
    # `python:` model factories may live in the directory the sweep was started from.
    env["PYTHONPATH"] = project_pythonpath(env.get("PYTHONPATH"), extra_path)
    return env


def kill_tree(proc: subprocess.Popen, grace_s: float = KILL_GRACE_S) -> None:
    """SIGTERM the process and all its descendants, then SIGKILL whatever is left after `grace_s`."""
    try:
        parent = psutil.Process(proc.pid)
        procs = [*parent.children(recursive=True), parent]
    except psutil.NoSuchProcess:
        procs = []
    for p in procs:
        with contextlib.suppress(psutil.NoSuchProcess):
            p.send_signal(signal.SIGTERM)
    _, alive = psutil.wait_procs(procs, timeout=grace_s)
    for p in alive:
        with contextlib.suppress(psutil.NoSuchProcess):
            p.kill()
    psutil.wait_procs(alive, timeout=grace_s)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=grace_s)


def _read_result(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def plural(n: int, word: str) -> str:
    """A count with its noun for a message: '1 op', '3 ops'."""
    return f"{n} {word}{'' if n == 1 else 's'}"


def keep_streamed_choices(result: dict[str, Any], stream: Path) -> str | None:
    """Put the kernel choices a process streamed (`stream`) into its `result` where the result
    lacks them: its compile did not return (a timeout, a crash, an exception), so the rows are
    marked `partial` and `autotuned_ops` counts the ops whose rows were kept. A result that has
    them (the compile returned) keeps its own, whole rows, so nothing is counted twice. Returns
    how far the compile got, in words (None: nothing streamed, or nothing needed)."""
    if result.get("kernel_choices") or result.get("compile_s") is not None:  # the compile returned
        return None
    ops, rows = read_choice_stream(stream)
    if not ops:
        return None
    result["kernel_choices"] = rows
    result["autotuned_ops"] = ops
    return (
        f"after autotuning {plural(ops, 'op')} "
        f"({plural(len(rows), 'candidate')} kept in kernel_choices, marked partial)"
    )


class JobCancelled(KeyboardInterrupt):
    """The job was cancelled (Ray's `ray.cancel` raises KeyboardInterrupt in its task, as Ctrl-C
    does): its processes are killed, and `kept` holds what they left that is worth keeping, the
    kernel choices of its cold compile (`kernel_choices`, `autotuned_ops`; empty if none). A
    KeyboardInterrupt still, for every caller that does not look for it."""

    def __init__(self, kept: dict[str, Any]):
        super().__init__("the job was cancelled")
        self.kept = kept


def _kept_choices(result: dict[str, Any]) -> dict[str, Any]:
    return {k: result[k] for k in ("kernel_choices", "autotuned_ops") if result.get(k)}


_stop_check: Callable[[], bool] | None = None
"""While a task runs a job under `stopping_when`: true once the driver stops the sweep."""

_phase_report: Callable[[str], None] | None = None
"""While a task runs a job under `reporting_phases`: told what the job is doing (its process's
phase, or what it waits for), for the driver's live view."""

PHASE_POLL_S = 1.0
"""How often a running job's phase is read from its process's RESULT.json and reported."""


@contextlib.contextmanager
def reporting_phases(report: Callable[[str], None] | None) -> Iterator[None]:
    """For the block, what the job does is told to `report` (`report_phase`)."""
    global _phase_report
    before, _phase_report = _phase_report, report
    try:
        yield
    finally:
        _phase_report = before


def report_phase(text: str) -> None:
    """Tell the reporter of `reporting_phases` what the job does now; never raises."""
    if _phase_report is not None:
        with contextlib.suppress(Exception):  # the view is a courtesy: it never fails a job
            _phase_report(text)


@contextlib.contextmanager
def stopping_when(check: Callable[[], bool] | None) -> Iterator[None]:
    """For the block, a job process's wait also ends the job as a cancellation (`JobCancelled`,
    with what its compile streamed) once `check()` is true: the driver's stop of a sweep, which
    reaches the task without `ray.cancel` (whose race with a task's reply can abort the driver:
    `workers.task`)."""
    global _stop_check
    before, _stop_check = _stop_check, check
    try:
        yield
    finally:
        _stop_check = before


def _spawn(
    step: Step, job_file: Path, env: dict[str, str], pass_fds: tuple[int, ...] = ()
) -> subprocess.Popen:
    """Start `step`'s `python -m workers.bench` process, its output appended to its log file."""
    env = {**env, SPAWNED_AT_ENV: repr(time.time())}
    with open(step.log_file, "ab") as log:
        return subprocess.Popen(
            [sys.executable, "-m", "workers.bench", *step.flags, str(job_file), str(step.result_file)],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=job_file.parent,
            start_new_session=True,  # its own process group, which its guard kills when it dies
            pass_fds=pass_fds,
        )


def _wait(
    proc: subprocess.Popen, step: Step, timeout_s: float, started: float, watch: Callable[[], None] | None
) -> bool:
    """Wait for `proc` to end, calling `watch` at every poll; whether it ran out of its time
    (then it is killed, with its tree). A cancellation kills it too, and raises `JobCancelled`."""
    reported, last = "", 0.0
    try:
        while proc.poll() is None:
            if time.monotonic() - started > timeout_s:
                return True
            if _phase_report is not None and time.monotonic() - last >= PHASE_POLL_S:
                last = time.monotonic()
                phase = str(_read_result(step.result_file).get("phase") or "start")
                if phase != reported:
                    reported = phase
                    report_phase(phase)
            if _stop_check is not None and _stop_check():
                raise KeyboardInterrupt  # the driver stops the sweep: handled as a cancellation
            if watch is not None:
                watch()
            time.sleep(POLL_S)  # short waits so a cancellation (KeyboardInterrupt) lands here
    except KeyboardInterrupt:  # cancelled: the process tree goes, what its compile streamed stays
        kill_tree(proc)
        result = _read_result(step.result_file)
        if step.keep_choices:
            keep_streamed_choices(result, choices_stream(step.result_file))
        raise JobCancelled(_kept_choices(result)) from None
    finally:
        if proc.poll() is None:
            kill_tree(proc)
    return False


def _run_bench(
    step: Step,
    job_file: Path,
    env: dict[str, str],
    timeout_s: float,
    ahead: Started | None = None,
    watch: Callable[[], None] | None = None,
) -> dict[str, Any]:
    """One `python -m workers.bench` process under a wall-time limit; its result, classified
    (`workers.outcome.classify`: its status and error, the harness's faults told from the job's).
    With `ahead`, the process was started ahead (`workers.ahead`): its gate opens now, its time
    limit counts from here, and its `subprocess_s` from its start. `watch` is called at every
    poll. With `step.keep_choices` (the job's first, cold process: only its choices are the
    job's), the kernel choices of a compile that did not return are kept from its stream."""
    started = time.monotonic()
    if ahead is None:
        proc, spawned = _spawn(step, job_file, env), started
    else:
        ahead.open_gate()
        proc, spawned = ahead.proc, ahead.spawned
    timed_out = _wait(proc, step, timeout_s, started, watch)
    ended = time.time()
    result = _read_result(step.result_file)
    result["subprocess_s"] = time.monotonic() - spawned
    finished = result.pop("finished_at_unix", None)
    if isinstance(finished, (int, float)) and not timed_out:
        # from the job's last write to the end of its process: the kernel and the GPU driver
        # tearing the process down (its CUDA context, its memory), within one poll interval
        result["phase_exit_s"] = max(0.0, ended - finished)
    progress = keep_streamed_choices(result, choices_stream(step.result_file)) if step.keep_choices else None
    classify(result, proc.returncode, step, job_file, timeout_s if timed_out else None, progress)
    return result


def _take_device(
    stack: contextlib.ExitStack,
    job: Job,
    threads: int,
    ahead: Overlap,
    env: dict[str, str],
    lane: Lane | None,
    lock_clocks: bool,
) -> tuple[Held | None, affinity.CoreLease, Any]:
    """What a job holds while it runs, each kept until `stack` closes: with `lane`, a GPU with no
    job on it (its processes started ahead while it waits, as far as its GPU's share of the spare
    cores allows); then its cores (near its GPU first) and, with `lock_clocks`, its GPU's locked
    clock. `env` and the gates get the GPU and the cores."""
    gpu = job.device == "cuda"
    gate_env: dict[str, str] = {}
    held = None
    if lane is not None:
        ahead.use_pool(lane.gpus[0], len(lane.gpus))  # Ray's pick: where it nearly always runs
        ahead.start_waiting()  # and again while it waits, as spare cores come free
        held = stack.enter_context(_hold(lane, ahead.start_waiting, ahead.first_ready))
        ahead.use_pool(held.gpu, len(lane.gpus))  # its later processes: its GPU's share
        if gpu:  # this job's GPU, for NVML here (its cores, clocks) and its processes
            os.environ[VISIBLE] = env[VISIBLE] = gate_env[VISIBLE] = held.gpu
    cores = stack.enter_context(affinity.core_lease(threads, clocks.gpu_local_cpus() if gpu else set()))
    clock_lock = stack.enter_context(
        clocks.locked_clocks() if gpu and lock_clocks else contextlib.nullcontext()
    )
    _pin(env, cores)
    ahead.use_cores(cores, gate_env)
    return held, cores, clock_lock


def _hidden_behind_the_wait(first: dict[str, Any], waited_s: float) -> None:
    """A job's first process, started before the job held a GPU, hid only the start-up that ran
    while no GPU was free for the job (`lane_wait_s`, outside its wall time). What ran while a
    GPU sat free waiting for it (the hold-back: `workers.lanes`) hid nothing: it stays in its
    start-up phases, not in `ahead_hidden_s`."""
    if first.get("ahead_hidden_s"):
        first["ahead_hidden_s"] = min(first["ahead_hidden_s"], waited_s)


@contextlib.contextmanager
def _hold(lane: Lane, waiting: Callable[[], object], ready: Callable[[], bool]) -> Iterator[Held]:
    """`lane.hold`, a stop while waiting being a cancellation (nothing ran: nothing to keep)."""
    report_phase("waiting for a GPU")
    try:
        with lane.hold(_stop_check, waiting, ready) as held:
            yield held
    except LaneStopped:
        raise JobCancelled({}) from None


def _pin(env: dict[str, str], cores: affinity.CoreLease) -> None:
    """Tell the job processes which cores they hold (they pin themselves before importing torch),
    and which the runner may use (`affinity.NODE_CPUS_ENV`, where its serving stand-ins go back to)."""
    env[affinity.NODE_CPUS_ENV] = affinity.format_cpus(os.sched_getaffinity(0))
    if cores.pinned:
        env[affinity.AFFINITY_ENV] = affinity.format_cpus(cores.cpus)


def _steps(job: Job, made: scratch.Scratch) -> list[Step]:
    """The job's processes in order: the cold one, its repeats, or its warm compile alone."""
    where = made.path
    steps = [Step((), where / "result.json", made.log_file, keep_choices=True)]
    for k in range(2, job.measure.repeats + 1):
        steps.append(Step(("--repeat", str(k)), where / f"repeat{k}.json", where / f"log-repeat{k}.txt"))
    if job.measure.warm_compile and job.measure.repeats == 1:
        steps.append(Step(("--warm",), where / "warm.json", where / "log-warm.txt"))
    return steps


def _run_steps(
    job: Job,
    steps: list[Step],
    job_file: Path,
    env: dict[str, str],
    overlap: Overlap,
    done: list[dict[str, Any]],
) -> None:
    """Run the job's processes one after another into `done`, each later one only while every
    one before it is `ok`; each is started ahead of the end of the one before it where
    `overlap` can (`workers.ahead`). One that failed after the shared cache handed it an entry
    runs again without the cache (`workers.cache_retry`)."""
    for i, step in enumerate(steps):
        if done and done[-1].get("status") != "ok":
            return
        result = _run_bench(step, job_file, env, job.timeout_s, overlap.take(i), overlap.watch(i))
        result = cache_retry.settle(result, step, env, lambda s, e: _run_bench(s, job_file, e, job.timeout_s))
        cache_retry.drop_after(result, env)
        done.append(result)


def run_job(
    job: Job,
    threads: int,
    scratch_root: str | None = None,
    keep_scratch: bool = False,
    extra_path: tuple[str, ...] = (),
    lock_clocks: bool = False,
    shared_cache: CacheAccess | None = None,
    node_jobs: int | None = None,
    overlap: bool = True,
    lane: Lane | None = None,
) -> dict[str, Any]:
    """Run `job` in fresh subprocesses; return its row's fields (see workers.bench and
    workers.repeats) plus `status`, `error` and `subprocess_s`.

    The first process compiles cold and measures everything. With `measure.repeats: N`, N - 1
    more processes (one after another, on the same device and cores) compile against the cache
    the first filled and time again; their compile times are the warm compile. With one repeat
    and `measure.warm_compile`, a second process only compiles warm. The later processes start
    once the first is past its gate, on spare cores of the node, each waiting at a gate until
    the one before it has ended (`workers.ahead`; `node_jobs`: the jobs this node runs at once, by
    default its GPUs or as many as its cores hold; `overlap` False: never, `--no-overlap`). With
    `lane` (`workers.lanes`), the job first waits for a GPU of the lane with no job on it, its
    processes started ahead meanwhile, and takes its cores once it holds one. The
    processes are pinned to
    `threads` cores reserved on this node (`workers.affinity`); with `lock_clocks` the GPU's SM
    clock is locked for the job where NVML allows it. With `shared_cache` (the access to a Redis
    server: `compiler.cache_access`) its processes share compile and autotune work there (a run
    option: the job's id and identity do not change with it); a process that fails after the
    cache handed it an entry runs once more without it (`workers.cache_retry`). A scratch directory that cannot be made, or that fills up,
    turns read-only or vanishes under a running process (`workers.scratch`), is the harness's
    failure, not the job's: a `harness_error` result, which `--resume` runs again. Each process's
    status is decided by `workers.outcome.classify`, once it has ended."""
    try:
        made = scratch.make(job, scratch_root, "job")
    except OSError as exc:
        return scratch.unmade(scratch_root, exc)
    job_file = made.job_file
    env = job_environment(made.path, threads, extra_path=extra_path, shared_cache=shared_cache)
    gpu = job.device == "cuda"
    steps = _steps(job, made)
    done: list[dict[str, Any]] = []

    def spawn(step: Step, extra: dict[str, str], fds: tuple[int, ...]) -> subprocess.Popen:
        return _spawn(step, job_file, {**env, **extra}, fds)

    try:
        with contextlib.ExitStack() as stack:
            ahead = stack.enter_context(
                Overlap(steps, job.device, threads, spawn, kill_tree, node_jobs, overlap)
            )
            held, cores, clock_lock = _take_device(stack, job, threads, ahead, env, lane, lock_clocks)
            _run_steps(job, steps, job_file, env, ahead, done)
        if held is not None and done:
            _hidden_behind_the_wait(done[0], held.waited_s)
        warm = done[-1] if len(done) > 1 and steps[-1].flags == ("--warm",) else None
        result = merge(done[0], done[1 : len(done) - (warm is not None)], warm)
        if len(steps) > 1 or lane is not None:
            result["ahead_off"] = ahead.off_reason()
        if held is not None:
            result["lane_wait_s"] = held.waited_s
        notes = [] if cores.pinned else [f"not pinned to cores: {cores.note}"]
        if lock_clocks and gpu:
            result["clocks_locked"] = clock_lock.locked_mhz is not None
            if clock_lock.refused:
                notes.append(f"--lock-clocks: {clock_lock.refused}")
        if notes:
            result["notes"] = "; ".join(filter(None, [result.get("notes"), *notes]))
    except JobCancelled as stop:  # in a later process: the cold one's choices are the job's
        raise JobCancelled(stop.kept or (_kept_choices(done[0]) if done else {})) from None
    finally:
        if not keep_scratch:
            shutil.rmtree(made.path, ignore_errors=True)
    return result


def build_bundle(
    job: Job,
    dest: Path,
    threads: int,
    scratch_root: str | None = None,
    package: Path | None = None,
    serving: dict[str, Any] | None = None,
    stock: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Compile `job`'s config cold in a fresh process with empty caches and write the caches it
    filled to `dest` (a compile-cache bundle, `workers.bench --bundle`), then, with `package`,
    its AOTInductor package there; return the process's result (`status`, `compile_s`,
    `bundle_bytes`, `bundle_artifacts`, `package_*` or `package_error`, ...). With `serving` (a
    serving profile's dict), the plan for it is decided and prepared first, its graphs in the
    bundle, its record in the result's `serving` (`workers.bench.serving`); with `stock` too
    (`{"mode": ..., "dtype": ...}`), the stock user under that traffic, in a process of its own,
    in its `stock`."""
    made = scratch.make(job, scratch_root, "bundle")
    env = job_environment(made.path, threads)
    try:
        with affinity.core_lease(threads) as cores:
            _pin(env, cores)
            flags = ("--bundle", str(Path(dest).resolve()))
            if package is not None:
                flags += ("--package", str(Path(package).resolve()))
            if serving is not None:
                flags += ("--serving", json.dumps(serving))
                if stock is not None:
                    flags += ("--serving-stock", json.dumps(stock))
            step = Step(flags, made.path / "result.json", made.log_file)
            return _run_bench(step, made.job_file, env, job.timeout_s)
    finally:
        shutil.rmtree(made.path, ignore_errors=True)
