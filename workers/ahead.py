"""A job's later processes, started before the device is free: the runner's side of the overlap.

Every process of a job is a fresh interpreter, and each spends seconds (35-55 s a job on the
H100 host) importing torch, transformers and the model's code, and the compile stack, before it
measures anything. Once a job's process is past its gate, on the device (`AHEAD_FROM`), the
runner starts each later process of the job (`Overlap`); and a job waiting for its GPU behind
another job starts its first process the same way (`workers.lanes`). Such a process imports
(Dynamo and Inductor too), builds the model and its inputs on the host, and waits at its gate
(`workers.bench.gate`) before it touches the device or makes its first compute call; the runner
opens the gate when the process before it has ended. Nothing of the method changes: each process
is still a fresh interpreter with its own caches, and none runs a compute call while another of
its job (or of another job on its GPU) does.

Until it reaches its gate, the process runs on a core of its own, never a job's: the timing
process keeps its cores to itself. Those cores come from the node's spare cores, the ones no job's
reservation can need (`spare_cores`: the node's cores less its job slots times each job's
cores), and a node-wide token per spare core (`ahead<i>.lock` beside the cores' lock files)
keeps the processes started ahead on a node, all jobs together, within them, so they never leave
a starting job short of its cores. A process waiting at its gate runs nothing (it blocks on a
pipe), so it gives its core and token back (`Overlap.free_at_gate`): only the processes still
starting up count against the spare cores, and one that waits long, behind a long job, does not
keep the others from starting. Where the node has no spare core, where the job is not pinned,
or where the spare cores are taken, the process starts after the one before it, as it always
did, and the row's `ahead_off` says why.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from compiler.env import format_cpus
from workers import affinity
from workers.bench.gate import AT_GATE, GATE_FD_ENV, NVML_CHECK_ENV

AHEAD_FROM = frozenset({"eager", "compile", "compiled_warmup", "timing", "flops", "accuracy", "done"})
"""Phases of a process (its RESULT.json's `phase`) once it is past its gate, on the device: the
later processes of its job start then."""
AHEAD_CORES = 1
"""Cores a process started ahead takes: its imports run on one."""
SPARE_PER_GPU = 3
"""Cores a GPU node keeps aside per GPU for processes started ahead: a job's two later
processes, started as its first one reaches the device, and the next job's first
(`workers.lanes`)."""
MIN_JOB_CORES = 4
"""The fewest cores a GPU job keeps when its node sets `SPARE_PER_GPU` per GPU aside
(`gpu_job_cores`); with fewer, the job takes them all and its processes start one after another."""

OFF_BY_RUN = "turned off for this run (--no-overlap)"


def gpu_job_cores(per_gpu: int) -> int:
    """The cores a GPU job reserves on a node with `per_gpu` cores per GPU: all but
    `SPARE_PER_GPU`, which stay spare for the processes started ahead (the timing process's cores
    stay its own), or all but as many of them as leave the job `MIN_JOB_CORES`; all of them where
    not even one can be spared, and no process starts ahead (`ahead_off`: no spare core). On a
    64-core host with 4 GPUs: 13 cores a job, 12 spare."""
    spare = min(SPARE_PER_GPU, per_gpu - MIN_JOB_CORES)
    return per_gpu - spare if spare >= 1 else per_gpu


@dataclass(frozen=True)
class Step:
    """One process of a job: its `workers.bench` flags, its result and log files, and whether
    its compile's streamed kernel choices are the job's (the first, cold one)."""

    flags: tuple[str, ...]
    result_file: Path
    log_file: Path
    keep_choices: bool = False


def _gpu_count() -> int | None:
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            return int(pynvml.nvmlDeviceGetCount())
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # no NVML here: count by cores
        return None


def spare_cores(device: str, threads: int, node_jobs: int | None = None) -> tuple[int, str]:
    """(cores of this node no job's reservation can need, the node's layout in words).
    `node_jobs`: jobs of `threads` cores the node runs at once; by default one per GPU on a GPU
    node (NVML's count), else as many as its cores hold, as `orchestrator.fleet.inventory` plans
    the node's slots."""
    cores = len(os.sched_getaffinity(0))
    threads = max(1, threads)
    if node_jobs is None:
        node_jobs = max(1, cores // threads)
        gpus = _gpu_count() if device == "cuda" else None
        if gpus:
            node_jobs = min(node_jobs, gpus)
    jobs = f"{node_jobs} job{'' if node_jobs == 1 else 's'}"
    each = f"{threads} core{'' if threads == 1 else 's'}{'' if node_jobs == 1 else ' each'}"
    return cores - node_jobs * threads, f"this node's {cores} cores go to its {jobs} of {each}"


def _read_changed(path: Path, last: int) -> tuple[int, dict | None]:
    """A process's result file's modification time, and what it holds where that time is not
    `last` (None where it is, or where the file cannot be read or parsed)."""
    try:
        mtime = path.stat().st_mtime_ns
    except OSError:
        return last, None
    if mtime == last:
        return last, None
    try:
        return mtime, json.loads(path.read_text())
    except (OSError, ValueError):
        return mtime, None


@dataclass
class AheadCores:
    """Cores a process started ahead holds until it reaches its gate, and the node's tokens for
    them."""

    lease: affinity.CoreLease
    tokens: list[int]

    @property
    def held(self) -> bool:
        return bool(self.tokens)

    def release(self) -> None:
        self.lease.release()
        for fd in self.tokens:
            with contextlib.suppress(OSError):
                os.close(fd)  # closing drops the flock
        self.tokens.clear()


def reserve_ahead(spare: int, directory: Path | None = None, pool: str | None = None) -> AheadCores | str:
    """Up to `AHEAD_CORES` of this node's `spare` cores for a process started ahead: one token
    each (`ahead<i>.lock`, i < spare; `ahead-<pool>-<i>.lock` where the spare cores are shared out
    among the node's GPUs, `pool` naming one), then as many free cores; or why none, in words."""
    directory = directory or affinity.lock_dir()
    with contextlib.suppress(OSError):
        directory.mkdir(parents=True, exist_ok=True)
    prefix = "ahead" if pool is None else f"ahead-{affinity.lock_name_part(pool)}-"
    tokens = []
    for i in range(spare):
        fd = affinity.try_lock(directory / f"{prefix}{i}.lock")
        if fd is not None:
            tokens.append(fd)
            if len(tokens) == AHEAD_CORES:
                break
    if not tokens:
        where = "the node's" if pool is None else f"GPU {pool}'s share of the node's"
        return f"{where} {spare} spare cores were held by other processes started ahead"
    lease = affinity.reserve_cores(len(tokens), directory=directory)
    if not lease.pinned:
        AheadCores(lease, tokens).release()
        return f"no spare core was free ({lease.note})"
    return AheadCores(lease, tokens)


@dataclass
class Started:
    """A process started ahead: its step's index, the process, its cores and its gate."""

    index: int
    proc: subprocess.Popen
    cores: AheadCores
    gate: int
    """The write end of the gate's pipe (-1 once opened or closed)."""
    spawned: float
    """When it was started (`time.monotonic()`)."""
    message: dict[str, object] = field(default_factory=dict)
    """What its gate tells it besides the time (`Overlap.use_cores`: the job's cores, its GPU)."""
    seen: int = 0
    """Its result file's modification time when last read (`at_gate`)."""
    gated: bool = False
    """Whether that file said the process waits at its gate."""

    def at_gate(self, result_file: Path) -> bool:
        """Whether the process waits at its gate now, its start-up done (its result file says
        so: `workers.bench.gate.AT_GATE`); read only when the file changed."""
        self.seen, result = _read_changed(result_file, self.seen)
        if result is not None:
            self.gated = bool(result.get(AT_GATE))
        return self.gated

    def open_gate(self) -> None:
        """Tell the process the device is free: the time now (this clock, `at`), and `message`'s
        fields (`workers.bench.gate.wait_at_gate`)."""
        line = json.dumps({"at": time.time(), **self.message}) + "\n"
        with contextlib.suppress(OSError):  # it died meanwhile: the runner finds out as it waits
            os.write(self.gate, line.encode())
        self._close_gate()

    def _close_gate(self) -> None:
        if self.gate >= 0:
            with contextlib.suppress(OSError):
                os.close(self.gate)
            self.gate = -1

    def drop(self, kill: Callable[[subprocess.Popen], None]) -> None:
        """End a process that will not run: its gate closed unopened (it exits), then killed."""
        self._close_gate()
        kill(self.proc)
        self.cores.release()


Spawn = Callable[[Step, dict[str, str], tuple[int, ...]], subprocess.Popen]
"""Starts a step's process with extra environment variables and file descriptors to pass."""


class Overlap:
    """The processes of one job (`steps`, in order), each started ahead where it can be. While
    step i runs, the runner calls `watch(i)`'s check at every poll; once step i is past its gate
    (on the device: `AHEAD_FROM`), every later step not started yet is started ahead, each on a
    spare core of its own, waiting at its gate. While the job waits for its GPU behind another
    job (`workers.lanes`), `start_waiting` starts its processes ahead in order, as far as its
    GPU's share of the spare cores allows (`use_pool`). `use_cores` gives the job's cores once it
    holds them (and what the gates tell: the cores, the GPU); `take(i)` gives the runner step i's
    process if it was started ahead (the runner opens its gate), and `close` drops those never
    taken. `off_reason` says why some step that ran was not started ahead."""

    def __init__(
        self,
        steps: list[Step],
        device: str,
        threads: int,
        spawn: Spawn,
        kill: Callable[[subprocess.Popen], None],
        node_jobs: int | None = None,
        enabled: bool = True,
    ):
        self.steps, self.spawn, self.kill, self.device = steps, spawn, kill, device
        self.reasons: dict[int, str] = {}
        self.ran: list[int] = []
        self.started: dict[int, Started] = {}
        """Later steps' processes, started ahead, their gates shut."""
        self.running: Started | None = None
        """The running step's process where it was started ahead, until it leaves its cores."""
        self.gate_message: dict[str, object] = {}
        self.spare = 0
        self.pool: str | None = None
        """The GPU whose share of the spare cores this job's processes take (`use_pool`)."""
        self.off: str | None = None
        """Why no step of this job starts ahead."""
        if not enabled:
            self.off = OFF_BY_RUN
        else:
            self.spare, layout = spare_cores(device, threads, node_jobs)
            if self.spare < 1:
                self.off = f"no spare core: {layout}"

    def use_cores(self, job_cores: affinity.CoreLease, env: dict[str, str] | None = None) -> None:
        """The job's cores, now that it holds them, and the environment variables (its GPU) the
        processes started ahead take at their gates. Unpinned cores turn the overlap off for the
        steps not started yet (their processes could not keep off the job's cores)."""
        cpus = job_cores.cpus if job_cores.pinned else tuple(sorted(os.sched_getaffinity(0)))
        self.gate_message = {"cpus": format_cpus(cpus), "env": dict(env or {})}
        if not job_cores.pinned and self.off is None:
            self.off = f"the job's processes are not pinned to cores ({job_cores.note})"

    def watch(self, index: int) -> Callable[[], None]:
        """The check to call while step `index` runs: it frees the cores of a process started
        ahead once that process has passed its gate, and, once this one is past its gate, starts
        the later steps ahead, at every check until each has started (spare cores come free as
        the processes started ahead reach their gates: `free_at_gate`). The step's result file is
        read when it changes."""
        path = self.steps[index].result_file
        seen = [0]
        past_gate = [False]

        def check() -> None:
            self.free_at_gate()
            seen[0], result = _read_changed(path, seen[0])
            if result is not None:
                if self.running is not None and result.get("started_ahead"):
                    self._leave_cores()
                if result.get("phase") in AHEAD_FROM:
                    past_gate[0] = True
            if past_gate[0]:
                self._start_in_order(index + 1)

        return check

    def free_at_gate(self) -> None:
        """Free the spare core of each process started ahead that waits at its gate: its imports
        and build are done, and it runs nothing until the gate opens, so the core (and its token)
        goes to the next process to start. The processes started ahead that are busy never
        outnumber the spare cores; those that wait hold none."""
        for started in self.started.values():
            if started.cores.held and started.at_gate(self.steps[started.index].result_file):
                started.cores.release()

    def first_ready(self) -> bool:
        """Whether the job's first process waits at its gate, or no process of the job starts
        ahead: what a job that found its GPU free may hold back for (`workers.lanes.SETTLE_S`)."""
        if self.off:
            return True
        started = self.started.get(0)
        return started is not None and started.at_gate(self.steps[0].result_file)

    def _start_in_order(self, first: int) -> None:
        """Start the steps from `first` on that have not started, in order, until one cannot."""
        for index in range(first, len(self.steps)):
            if index not in self.started and not self._start(index):
                return

    def use_pool(self, gpu: str, gpus: int) -> None:
        """Take the spare cores from `gpu`'s share of them (the node's spare cores over its `gpus`
        GPUs), so that the jobs of one GPU, the running one and the one waiting behind it, compete
        for its share only: the running job's later processes never wait for cores that jobs
        waiting on other GPUs took."""
        if self.pool is None:
            self.spare = self.spare // max(1, gpus)
            if self.spare < 1 and self.off is None:
                self.off = f"no spare core: the node's spare cores do not go round its {gpus} GPUs"
        self.pool = gpu

    def start_waiting(self) -> None:
        """While the job waits for its GPU (`workers.lanes`), at every poll: start its processes
        ahead in order, as far as spare cores allow (its first, then its later ones, each to wait
        at its gate until the one before it has ended); a process at its gate frees its core for
        the next (`free_at_gate`)."""
        self.free_at_gate()
        self._start_in_order(0)

    def _start(self, index: int) -> bool:
        if self.off:
            return False
        cores = reserve_ahead(self.spare, pool=self.pool)
        if isinstance(cores, str):
            self.reasons[index] = cores
            return False
        read, write = os.pipe()
        extra = {GATE_FD_ENV: str(read), affinity.AHEAD_AFFINITY_ENV: format_cpus(cores.lease.cpus)}
        if self.device == "cuda":  # torch counts devices through NVML until the gate: no CUDA init
            extra[NVML_CHECK_ENV] = "1"
        try:
            proc = self.spawn(self.steps[index], extra, (read,))
        except OSError as exc:
            os.close(write)
            cores.release()
            self.reasons[index] = f"it could not be started ahead: {exc}"
            return False
        finally:
            os.close(read)
        self.reasons.pop(index, None)
        self.started[index] = Started(index, proc, cores, write, time.monotonic())
        return True

    def _leave_cores(self) -> None:
        if self.running is not None:
            self.running.cores.release()
            self.running = None

    def take(self, index: int) -> Started | None:
        """Step `index`'s process if it was started ahead (its gate still shut), else None; the
        runner starts it then. Frees the cores of the step before, if it still held some."""
        self._leave_cores()
        self.ran.append(index)
        started = self.started.pop(index, None)
        if started is not None:
            started.message = self.gate_message
            self.running = started
            return started
        if index > 0 and index not in self.reasons:
            self.reasons[index] = self.off or "the process before it ended before it was seen past its gate"
        return None

    def off_reason(self) -> str | None:
        """Why some process of the job that ran was not started ahead (None: every later one
        was, or the job ran one process)."""
        reasons = [self.reasons[i] for i in self.ran if i in self.reasons]
        return "; ".join(dict.fromkeys(reasons)) or None

    def close(self) -> None:
        """Drop every process started ahead that was never taken; free every core still held."""
        for started in self.started.values():
            started.drop(self.kill)
        self.started.clear()
        self._leave_cores()

    def __enter__(self) -> Overlap:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
