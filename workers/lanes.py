"""GPU lanes: the next job on a GPU starts its first process while the job before it runs.

A job's later processes start ahead within the job (`workers.ahead`), but its first one could
only start once the job's task had its GPU: with one Ray task per GPU, the next task starts when
the GPU's job has ended, and every job paid its first process's start-up (interpreter, imports,
the model built on the host) with the GPU idle. With lanes, the driver admits `LANE_DEPTH` tasks
per GPU (each asks Ray for `1 / LANE_DEPTH` of one, and half a job's cores: only one of them holds
the cores at a time), and the node decides which runs: a job's task starts its first process
ahead (on a spare core, waiting at its gate), then waits for a GPU of its node with no job on it,
a node-wide lock per GPU (`gpu-<id>.lock` beside the cores' lock files, `workers.affinity`),
before it takes its cores and opens the gate. So each GPU holds one job at a time, as before, and
the next one is built and waiting when it ends.

Ray places a fractional GPU task on the GPU with the least room left that fits it (best fit), so
two tasks can share a GPU's half slots while another GPU is idle; the task therefore takes
whichever of its node's GPUs is free (Ray's own pick first), and the process it started ahead
learns which at its gate (`CUDA_VISIBLE_DEVICES` in the gate's message: it has not initialised
CUDA before, and checks afterwards that its device is the lane's GPU). Jobs waiting for the same
GPUs take them in the order the driver sent them (`Ticket`, keyed by the send time): without that,
a GPU that came free went to whichever waiting job polled first, and a long job sent early could
wait behind later ones (seen on a 4-GPU host: two of the first eight jobs sent waited about 400 s
while jobs sent after them ran). A job with k jobs sent before it still waiting may take a GPU
where more than k are free, so that with several GPUs free at once a job need not wait while one
sent before it holds back (below): when only the first in the queue could take a GPU, the second,
third and fourth jobs of a sweep on a 4-GPU host waited 15 s each with GPUs free, and that time was
counted as waiting for a GPU, outside their wall time. Ray starts the tasks of one dispatch seconds apart, in no set
order (up to 10 s on a 4-GPU host), so a job that finds a GPU free holds back for up to
`SETTLE_S`, or until its first process waits at its gate, for jobs sent before it to arrive:
otherwise whichever task Ray started first took the GPU, and a short job could be a GPU's first,
paying its start-up with nothing to hide behind, while the long ones sent before it waited.

`lane_wait_s` in the row is the time the job waited for its GPU while other jobs held it, or
came before it; the driver's `wall_s` leaves it out, so a job's wall time runs from a GPU being
free for it to its result. Time held back with a GPU free (`SETTLE_S`) is the job's own, in its
wall time.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from workers import affinity

LANE_DEPTH = 2
"""Tasks admitted per GPU where lanes are on: the running job and the next one, waiting."""
POLL_S = 0.1
SETTLE_S = 15.0
"""How long a job that finds a GPU free holds back for jobs sent before it that have not reached
the node's queue yet, unless its first process is at its gate sooner (it imports meanwhile)."""
VISIBLE = "CUDA_VISIBLE_DEVICES"


class LaneStopped(Exception):
    """The job was stopped (its driver's stop, a cancel) while it waited for a GPU."""


def _ids(value: str | None) -> list[str]:
    return [v.strip() for v in (value or "").split(",") if v.strip()]


def node_gpus(assigned: str | None = None, count: int | None = None) -> tuple[str, ...]:
    """The GPUs of this node a job may take, the one Ray assigned the task (`assigned`, its
    `CUDA_VISIBLE_DEVICES`) first: those the raylet sees (its own `CUDA_VISIBLE_DEVICES`, else
    every device NVML counts), the first `count` of them where the node offers Ray fewer."""
    import psutil

    seen: list[str] = []
    with contextlib.suppress(psutil.Error, OSError):
        parent = psutil.Process().parent()
        if parent is not None and parent.name() == "raylet":
            seen = _ids(parent.environ().get(VISIBLE))
    if not seen:
        with contextlib.suppress(Exception):
            import pynvml

            pynvml.nvmlInit()
            try:
                seen = [str(i) for i in range(int(pynvml.nvmlDeviceGetCount()))]
            finally:
                pynvml.nvmlShutdown()
    if count is not None:
        seen = seen[: max(0, count)]
    mine = _ids(assigned)[:1]
    return tuple(dict.fromkeys([*mine, *seen]))


@dataclass
class Held:
    """A GPU of the node, held by this job until its block ends."""

    gpu: str
    waited_s: float
    """How long the job waited for it."""
    fd: int = -1


@dataclass
class Ticket:
    """A waiting job's place in its node's queue for a set of GPUs: a file named by the time the
    driver sent the job (`queue-<GPUs' hash>-<ns>-<pid>-<thread>.lock`; the time it began to
    wait where the driver gave none), locked by the job while it waits. A GPU that comes free goes
    to the job sent first (k GPUs free: to the first k), so the jobs run in the order the driver
    sent them (longest first: `orchestrator.fleet.ordering`), not in the order their tasks started
    or their polls land.
    A job that dies drops its lock; the next waiter removes its file."""

    directory: Path
    prefix: str
    path: Path
    fd: int

    @classmethod
    def take(cls, directory: Path, gpus: tuple[str, ...], sent_ns: int | None = None) -> Ticket:
        # the set, not the order: each task lists Ray's pick first
        prefix = "queue-" + hashlib.sha1(",".join(sorted(gpus)).encode()).hexdigest()[:12] + "-"
        key = time.time_ns() if sent_ns is None else sent_ns
        name = f"{prefix}{key:020d}-{os.getpid()}-{threading.get_ident()}.lock"
        hidden = directory / f".{name}"  # locked before others can see it: never taken for a dead job's
        fd = os.open(hidden, os.O_RDWR | os.O_CREAT, 0o666)
        fcntl.flock(fd, fcntl.LOCK_EX)
        os.rename(hidden, directory / name)
        return cls(directory, prefix, directory / name, fd)

    def ahead(self) -> int:
        """How many jobs sent before this one still wait for these GPUs (the tickets of jobs that
        died are removed on the way)."""
        count = 0
        for other in sorted(self.directory.glob(f"{self.prefix}*.lock")):
            if other.name >= self.path.name:
                break
            try:
                fd = os.open(other, os.O_RDWR)
            except OSError:  # removed meanwhile: its job took a GPU, or another waiter cleared it
                continue
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                count += 1  # a job ahead of this one, still waiting
            else:  # its job died waiting
                with contextlib.suppress(OSError):
                    other.unlink()
            finally:
                os.close(fd)
        return count

    def drop(self) -> None:
        if self.fd >= 0:
            with contextlib.suppress(OSError):
                self.path.unlink()
            os.close(self.fd)
            self.fd = -1


@dataclass(frozen=True)
class Lane:
    """The GPUs a job may run on (`node_gpus`), one job on each at a time; `sent_ns`: when the
    driver sent the job (its place in the queue)."""

    gpus: tuple[str, ...]
    directory: Path | None = None
    sent_ns: int | None = None
    settle_s: float = SETTLE_S

    @staticmethod
    def _lock(directory: Path, gpu: str) -> int | None:
        """The node-wide lock of `gpu`, taken (its fd), or None where a job holds it."""
        return affinity.try_lock(directory / f"gpu-{affinity.lock_name_part(gpu)}.lock")

    def _try(self, directory: Path) -> Held | None:
        for gpu in self.gpus:
            fd = self._lock(directory, gpu)
            if fd is not None:
                return Held(gpu, 0.0, fd)
        return None

    def _free(self, directory: Path) -> int:
        """How many of the lane's GPUs no job holds now (each lock taken and at once let go)."""
        free = 0
        for gpu in self.gpus:
            fd = self._lock(directory, gpu)
            if fd is not None:
                os.close(fd)
                free += 1
        return free

    @contextlib.contextmanager
    def hold(
        self,
        stopped: Callable[[], bool] | None = None,
        waiting: Callable[[], object] | None = None,
        ready: Callable[[], bool] | None = None,
    ) -> Iterator[Held]:
        """Wait for a GPU of the lane with no job on it and hold it for the block (a node-wide
        lock that a job's death releases), calling `waiting` at every poll meanwhile. Jobs that
        wait for the same GPUs take them in the order the driver sent them (`Ticket`): a GPU is
        this job's where more are free than jobs sent before it still wait. One that finds a GPU
        free for it takes it once `settle_s` has passed since it began to wait or `ready()` (its
        first process is at its gate), whichever comes first, so that jobs sent before it can
        still claim it; without `ready` it takes it at once. Its `waited_s` is the time no GPU was
        free for it: holding back with one free is its own time. Raises `LaneStopped` when
        `stopped()` says so first."""
        directory = self.directory or affinity.lock_dir()
        directory.mkdir(parents=True, exist_ok=True)
        start = last = time.monotonic()
        held_back, holding_back = 0.0, False
        ticket = Ticket.take(directory, self.gpus, self.sent_ns)
        try:
            while True:
                now = time.monotonic()
                held_back += now - last if holding_back else 0.0
                last, holding_back = now, False
                ahead = ticket.ahead()
                # a GPU is this job's when more are free than jobs sent before it still wait for
                if (ahead == 0 or self._free(directory) > ahead) and (
                    held := self._try(directory)
                ) is not None:
                    if now - start >= self.settle_s or ready is None or ready():
                        break
                    os.close(held.fd)  # free, but a job sent earlier may still come for it
                    holding_back = True
                if stopped is not None and stopped():
                    raise LaneStopped
                if waiting is not None:
                    waiting()
                time.sleep(POLL_S)
        finally:
            ticket.drop()
        held.waited_s = max(0.0, time.monotonic() - start - held_back)
        try:
            yield held
        finally:
            with contextlib.suppress(OSError):
                os.close(held.fd)  # closing drops the flock
