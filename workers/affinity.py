"""Which cores a job process runs on: a node-wide reservation of `threads` cores per job.

Ray reserves a *number* of CPUs for a task, not which ones, so two jobs on one node (one per
GPU) would otherwise float over all cores and the scheduler would move their threads around:
a launch-bound cell (ResNet-50 at batch 1 spends its time issuing kernels from Python) then
measures whichever core it landed on. Each job takes an exclusive lock on `threads` cores
(one lock file per core under a node-wide directory, `flock`-ed, so a job that dies releases
its cores with its file descriptors) and its process pins itself to them with
`os.sched_setaffinity` before anything else runs. Cores near the job's GPU (its NUMA node, from
NVML) are taken first.

When fewer free cores are left than a job asks for (another program holds them, or the node
runs more jobs than it has cores) the job runs unpinned and its row says why.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import tempfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from compiler.env import format_cpus, parse_cpus

LOCK_DIR_ENV = "CO_CORE_LOCK_DIR"
AFFINITY_ENV = "CO_CPU_AFFINITY"
AHEAD_AFFINITY_ENV = "CO_AHEAD_CPU_AFFINITY"
"""In a process started ahead (`workers.ahead`): the cores it runs on until its gate opens; it
moves onto the job's (`AFFINITY_ENV`) there."""
UNPIN_ENV = "CO_UNPIN"
"""In a job's helper that stands in for a serving process a user starts
(`workers.bench.serving_stock.helper_process(plain=True)`): leave the pinning it inherited
(`unpin`)."""
NODE_CPUS_ENV = "CO_NODE_CPUS"
"""In a job's processes: the cores its runner may use, as "0-15" (the runner's own affinity: the
node's, or what the user's `taskset` or cpuset left a sweep). A helper marked `UNPIN_ENV` goes back
to these, not to every core of the node, so a sweep started on half a node's cores beside another
keeps its serving stand-ins on its own half."""


def lock_dir() -> Path:
    return Path(os.environ.get(LOCK_DIR_ENV) or Path(tempfile.gettempdir()) / "compile-orchestrator-cores")


@dataclass
class CoreLease:
    cpus: tuple[int, ...]
    """The cores reserved for the job (empty: not pinned)."""
    note: str | None = None
    """Why the job is not pinned, when it is not."""
    _fds: list[int] = field(default_factory=list, repr=False)

    @property
    def pinned(self) -> bool:
        return bool(self.cpus)

    def release(self) -> None:
        for fd in self._fds:
            with contextlib.suppress(OSError):
                os.close(fd)  # closing the descriptor drops its flock
        self._fds.clear()


def reserve_cores(n: int, prefer: Iterable[int] = (), directory: Path | None = None) -> CoreLease:
    """Lock `n` cores of this process's affinity set, `prefer`-red ones first. Never blocks."""
    allowed = sorted(os.sched_getaffinity(0))
    n = max(1, n)
    if n > len(allowed):
        return CoreLease((), note=f"job wants {n} cores, this node's processes may use {len(allowed)}")
    preferred = [c for c in sorted(set(prefer)) if c in allowed]
    order = preferred + [c for c in allowed if c not in preferred]
    directory = directory or lock_dir()
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        return CoreLease((), note=f"cannot create the core lock directory {directory}: {exc}")
    lease = CoreLease(())
    taken: list[int] = []
    for cpu in order:
        try:
            fd = os.open(directory / f"cpu{cpu}.lock", os.O_RDWR | os.O_CREAT, 0o666)
        except OSError as exc:
            lease.release()
            return CoreLease((), note=f"cannot open core lock files in {directory}: {exc}")
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            continue
        lease._fds.append(fd)
        taken.append(cpu)
        if len(taken) == n:
            lease.cpus = tuple(sorted(taken))
            return lease
    busy = len(allowed) - len(taken)
    lease.release()
    return CoreLease(
        (), note=f"only {len(taken)} of the {n} cores this job wants were free ({busy} held by other jobs)"
    )


def held_cores(directory: Path | None = None) -> tuple[int, int]:
    """(cores of this process's affinity set whose lock another process holds now, cores in the set):
    each core's lock taken and let go at once, never blocking. What a sweep checks at its start
    (another sweep on this machine holds the cores it would pin its jobs to)."""
    allowed = sorted(os.sched_getaffinity(0))
    directory = directory or lock_dir()
    held = 0
    for cpu in allowed:
        path = directory / f"cpu{cpu}.lock"
        if not path.exists():
            continue
        fd = try_lock(path)
        if fd is None:
            held += 1
        else:
            os.close(fd)
    return held, len(allowed)


def try_lock(path: Path) -> int | None:
    """An exclusive lock on `path` (created), never blocking: its descriptor (closing it drops
    the lock), or None where another process holds it or the file cannot be opened."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return None
    return fd


def lock_name_part(text: str) -> str:
    """`text` (a GPU's id: an index or a UUID) as a safe part of a lock file's name."""
    return re.sub(r"[^A-Za-z0-9_.-]", "_", text)


@contextlib.contextmanager
def core_lease(n: int, prefer: Iterable[int] = ()) -> Iterator[CoreLease]:
    lease = reserve_cores(n, prefer)
    try:
        yield lease
    finally:
        lease.release()


def pin_from_environment() -> tuple[str, bool, str | None]:
    """In the job process, first thing: pin to the cores the runner reserved (if any): a process
    started ahead to the cores it has until its gate opens, any other to the job's; a helper
    marked `UNPIN_ENV` onto every core it may use instead (`unpin`).

    Returns (the affinity the process now has as "0-3", whether it was pinned, a note)."""
    if os.environ.get(UNPIN_ENV):
        return unpin(), False, None
    wanted = os.environ.get(AHEAD_AFFINITY_ENV) or os.environ.get(AFFINITY_ENV)
    note = None
    pinned = False
    if wanted:
        try:
            os.sched_setaffinity(0, parse_cpus(wanted))
            pinned = True
        except (ValueError, OSError) as exc:
            note = f"could not pin to cores {wanted}: {exc}"
    return format_cpus(os.sched_getaffinity(0)), pinned, note


def unpin() -> str:
    """Undo a pinning this process inherited: let it run on every core its runner may use
    (`NODE_CPUS_ENV`; where unset, every core the node lets it use: the kernel keeps a cpuset's
    limit), as a process a user starts there would. Returns the affinity it now has, as "0-3";
    where the node refuses, the one it had."""
    listed = os.environ.get(NODE_CPUS_ENV)
    with contextlib.suppress(OSError, ValueError):
        os.sched_setaffinity(0, parse_cpus(listed) if listed else range(os.cpu_count() or 1))
    return format_cpus(os.sched_getaffinity(0))
