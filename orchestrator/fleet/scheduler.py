"""The dispatch loop: per-class queues and windows, retries after node loss, lost classes.

- One queue and one window of in-flight tasks per hardware class (its slot count), so a slow
  or absent class never holds up the others.
- A task that fails for a system reason (its worker or node died) is retried on the same class,
  up to `max_attempts` times in all. A task whose own code raised is not retried. Either failure
  is the harness's, not the model's: its row is `harness_error`, which `--resume` runs again.
- The inventory is re-read every `recheck_s` seconds and after every system failure. A class
  with no alive nodes left gets `hardware_lost` rows for its queued and running jobs, so the
  sweep finishes instead of waiting forever on tasks Ray cannot place.
- Our own `ray.wait` loop: `ray.util.as_completed` drops results when a task fails.
"""

from __future__ import annotations

import contextlib
import inspect
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from compiler.job import Job
from orchestrator.fleet.inventory import HardwareClass
from store.fields import HARNESS_ERROR
from store.rows import failure_row, make_row, side_rows
from workers.text import plain

WAIT_S = 0.25
CANCEL_GRACE_S = 15.0
"""How long a cancelled task has to kill its job's processes (the runner's SIGTERM grace, then
SIGKILL) and return what they left, before it is killed with its worker."""


def _short(exc: BaseException, limit: int = 2000) -> str:
    """`Type: message` of a Ray exception, without the colour codes Ray puts in it, cut to `limit`
    (its head and its tail)."""
    text = plain(f"{type(exc).__name__}: {exc}")
    return text if len(text) <= limit else text[: limit // 2] + "\n...\n" + text[-limit // 2 :]


def _with_job(started: Callable[..., None]) -> Callable[[Job], None]:
    """`started` as a callback of the job that was sent: one that takes no argument (an older
    caller's) is called without it."""
    try:
        inspect.signature(started).bind(None)
    except TypeError:
        return lambda job: started()
    except ValueError:  # no signature to read (a builtin): given the job
        pass
    return started


@dataclass
class _Running:
    job: Job
    submitted: float
    attempt: int


@dataclass
class Scheduler:
    classes: dict[str, HardwareClass]
    remotes: dict[str, Any]
    """Ray remote function per class, with that class's resources and placement."""
    task_args: tuple
    """Arguments after the job dict: (threads are per class, so they are added per submit)."""
    run_id: str
    emit: Callable[..., None]
    """Called with each finished row, its job, the driver-side wall time and, for a job that
    reported them, its rows of the other tables (`emit(row, job, wall, tables=None)`)."""
    inventory: Callable[[], dict[str, HardwareClass]]
    max_attempts: int = 3
    task_kwargs: dict[str, Any] = field(default_factory=dict)
    """Keyword arguments of every task (run options such as `shared_cache`, given only when set)."""
    sent_kwargs: Callable[[], dict[str, Any]] | None = None
    """Keyword arguments as they are when a task is sent (the shared cache, which the driver stops
    sending once its server stops answering)."""
    keep: Callable[[dict[str, list[dict[str, Any]]]], None] | None = None
    """Gets the rows of the other tables that a cancelled job leaves (its streamed kernel choices)."""
    depth: dict[str, int] = field(default_factory=dict)
    """Tasks admitted per slot, by class (`workers.lanes.LANE_DEPTH` for GPU classes with lanes;
    1 where not named)."""
    recheck_s: float = 5.0
    queues: dict[str, deque[tuple[Job, int]]] = field(default_factory=dict)
    running: dict[Any, _Running] = field(default_factory=dict)
    lost: set[str] = field(default_factory=set)
    last_sent_ns: int = 0
    """The send time (`sent_ns`) given to the last task of a class with lanes."""

    def add(self, jobs: list[Job]) -> None:
        for job in jobs:
            self.queues.setdefault(job.hardware, deque()).append((job, 1))

    def busy(self) -> bool:
        return bool(self.running) or any(self.queues.values())

    def _in_flight(self, name: str) -> int:
        return sum(1 for r in self.running.values() if r.job.hardware == name)

    def fill(self, started: Callable[[Job], None] | Callable[[], None]) -> None:
        """Send queued jobs while their class has room; `started(job)` is called for each job sent
        (`started()` where it takes no argument)."""
        announce = _with_job(started) if any(self.queues.values()) else started
        for name, queue in self.queues.items():
            if name in self.lost:
                continue
            hw = self.classes[name]
            free = hw.slots * self.depth.get(name, 1) - self._in_flight(name)
            while queue and free > 0:
                job, attempt = queue.popleft()
                now = self.sent_kwargs() if self.sent_kwargs is not None else {}
                ref = self.remotes[name].remote(
                    job.to_dict(),
                    hw.cpus_per_job,
                    *self.task_args,
                    **self.task_kwargs,
                    **now,
                    **self._sent(name),
                )
                self.running[ref] = _Running(job, time.monotonic(), attempt)
                free -= 1
                announce(job)

    def _sent(self, name: str) -> dict[str, int]:
        """Where the class's tasks wait in a node's queue for a GPU (`workers.lanes`): the send
        time, strictly increasing, so jobs take the GPUs in the order they were sent whatever
        order Ray starts their tasks in."""
        if self.depth.get(name, 1) <= 1:
            return {}
        self.last_sent_ns = max(self.last_sent_ns + 1, time.time_ns())
        return {"sent_ns": self.last_sent_ns}

    def step(self, ray) -> bool:
        """Wait up to WAIT_S for results and handle them; True if a system failure happened."""
        refs = list(self.running)
        if not refs:
            return False
        ready, _ = ray.wait(refs, num_returns=1, timeout=WAIT_S)
        if ready:
            ready, _ = ray.wait(refs, num_returns=len(refs), timeout=0)
        failed = False
        for ref in ready:
            failed |= self._collect(ray, ref)
        return failed

    def _collect(self, ray, ref) -> bool:
        run = self.running.pop(ref)
        wall = time.monotonic() - run.submitted
        try:
            result = ray.get(ref)
            if isinstance(result, dict) and result.get("lane_wait_s"):  # behind the job on its GPU
                wall = max(0.0, wall - result["lane_wait_s"])
        except ray.exceptions.RayTaskError as exc:  # our task's own code raised: the harness, not the model
            error = f"the job's Ray task raised: {_short(exc)}"
            self.emit(self._failure(run, HARNESS_ERROR, error, wall), run.job, wall)
            return False
        except Exception as exc:  # worker or node died, object lost: the machine failed, not the job
            if run.attempt < self.max_attempts:
                self.queues[run.job.hardware].appendleft((run.job, run.attempt + 1))
            else:
                error = f"Ray task failed {run.attempt} times (worker or node lost); last: {_short(exc)}"
                self.emit(self._failure(run, HARNESS_ERROR, error, wall), run.job, wall)
            return True
        row = make_row(run.job, result, run_id=self.run_id, wall_s=wall, attempt=run.attempt)
        self.emit(row, run.job, wall, side_rows(run.job, result, run_id=self.run_id))
        return False

    def _failure(self, run: _Running, status: str, error: str, wall: float | None) -> dict[str, Any]:
        return failure_row(run.job, status, error, run_id=self.run_id, wall_s=wall, attempt=run.attempt)

    def check_classes(self, ray) -> None:
        """Re-read the inventory: shrink windows to the slots left; end classes with no nodes."""
        present = self.inventory()
        for name in list(self.queues):
            if name in self.lost:
                continue
            if name in present:
                self.classes[name].slots = present[name].slots
                continue
            self.lost.add(name)
            error = f"no alive node of hardware class {name!r} is left in the cluster"
            for ref, run in list(self.running.items()):
                if run.job.hardware == name:
                    ray.cancel(ref, force=True)
                    del self.running[ref]
                    self.emit(self._failure(run, "hardware_lost", error, None), run.job, None)
            while self.queues[name]:
                job, attempt = self.queues[name].popleft()
                self.emit(self._failure(_Running(job, 0.0, attempt), "hardware_lost", error, None), job, None)

    def run(self, ray, started: Callable[[Job], None] | Callable[[], None], tick: Callable[[], None]) -> None:
        last_check = time.monotonic()
        while self.busy():
            self.fill(started)
            stalled = not self.running  # nothing could be dispatched: every window is zero for now
            failed = self.step(ray)
            if failed or time.monotonic() - last_check > self.recheck_s:
                self.check_classes(ray)
                last_check = time.monotonic()
            tick()
            if stalled and any(self.queues[n] for n in self.queues if n not in self.lost):
                time.sleep(WAIT_S)  # the class's nodes are busy or gone; check again shortly

    def cancel_all(self, ray, grace_s: float = CANCEL_GRACE_S) -> int:
        """Stop every running task; return how many. They are told through Ray's key-value store
        (`workers.task.stop_key`), not `ray.cancel`: each kills its job's processes and returns
        what the cold compile had streamed, which `keep` gets (so a stopped job keeps its kernel
        choices, as a timed-out one does). Any still running after `grace_s` (or at a second
        Ctrl-C) is cancelled with force: its worker is killed, and its job process dies with it.
        A stopped job has no results row: `--resume` runs it again."""
        from ray.experimental import internal_kv

        from workers.task import STOP_NAMESPACE, stop_key

        refs = list(self.running)
        ready: list = []
        key = stop_key(ray.get_runtime_context().get_job_id())
        try:
            if refs:
                internal_kv._internal_kv_put(key, b"1", namespace=STOP_NAMESPACE)
                ready, _ = ray.wait(refs, num_returns=len(refs), timeout=grace_s)
            for ref in ready:
                try:
                    result = ray.get(ref, timeout=grace_s)
                except Exception:  # ended without an answer: nothing to keep
                    continue
                if isinstance(result, dict) and result.get("cancelled") and self.keep is not None:
                    self.keep(side_rows(self.running[ref].job, result, run_id=self.run_id))
        except KeyboardInterrupt:  # a second Ctrl-C: stop waiting for them
            pass
        finally:
            for ref in refs:
                if ref not in ready:  # still running after the grace (or a second Ctrl-C)
                    ray.cancel(ref, force=True)
            if refs:  # the driver's later sweeps (a tune's next rung) must not see it
                with contextlib.suppress(Exception):
                    internal_kv._internal_kv_del(key, namespace=STOP_NAMESPACE)
            self.running.clear()
        return len(refs)
