"""What a job process records (`workers.bench`): RESULT.json, the phase it is in, and the
wall time of each phase.

`JobRecord` holds the job, `result` (every field measured so far, the row-to-be) and `notes`.
Each phase starts with `enter(phase)`: that ends the previous phase (its wall time is added to
`phase_<name>_s`) and rewrites RESULT.json, so a crash or a timeout still leaves what was
measured before it and says where it happened. `fail` turns an exception (or a reason) into the
result's status and error. A process started ahead waits at its gate in `pass_gate`
(`workers.bench.gate`), between building on the host and its first use of the device.
"""

from __future__ import annotations

import json
import os
import platform
import time
import traceback
from contextlib import suppress
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from compiler import durable
from compiler.env import format_cpus, parse_cpus
from compiler.job import PHASES
from workers.affinity import AFFINITY_ENV, AHEAD_AFFINITY_ENV
from workers.bench.calls import rotating
from workers.bench.gate import (
    AT_GATE,
    GATE_FD_ENV,
    NVML_CHECK_ENV,
    check_device,
    gate_fd,
    pin_every_thread,
    wait_at_gate,
)
from workers.lanes import VISIBLE

SPAWNED_AT_ENV = "CO_SPAWNED_AT"
CACHE_SERVED = "cache_served"
"""In RESULT.json (never a row's column): the shared cache handed this process an entry, so a
failure after it may be the cache's (the runner compiles the job once more without it)."""
ERROR_CHARS = 4000


def error_text(exc: BaseException) -> str:
    """`Type: message`, cut to `ERROR_CHARS` (its head and its tail)."""
    text = f"{type(exc).__name__}: {exc}"
    if len(text) > ERROR_CHARS:
        text = text[: ERROR_CHARS // 2] + "\n...\n" + text[-ERROR_CHARS // 2 :]
    return text


def error_line(exc: BaseException, chars: int) -> str:
    """`Type: ` and the first line of the message, cut to `chars`: an error a record names in one
    line (a package's or a serving plan's)."""
    text = str(exc)
    return f"{type(exc).__name__}: {text.splitlines()[0][:chars] if text else ''}"


def is_oom(exc: BaseException) -> bool:
    """Whether `exc` says the device or the host ran out of memory."""
    import torch

    if isinstance(exc, (MemoryError, torch.cuda.OutOfMemoryError)):
        return True
    text = str(exc).lower()
    # CUDA: "CUDA out of memory"; CPU allocator: "DefaultCPUAllocator: can't allocate memory"
    return any(m in text for m in ("out of memory", "can't allocate memory", "cannot allocate memory"))


class JobRecord:
    """One job process's record: `job`, `result` (every field measured so far), `notes`, and
    `shared_cache` (`compiler.shared_cache.SharedCache`, once the compile stack is loaded)."""

    def __init__(self, job_path: Path, result_path: Path):
        from compiler.job import Job

        self.job = Job.from_dict(json.loads(job_path.read_text()))
        self.result_path = result_path
        self.notes: list[str] = []
        self.shared_cache = None  # compiler.shared_cache.SharedCache, once the compile stack is loaded
        self.result: dict[str, Any] = {
            "started_at": datetime.now(timezone.utc).isoformat(),
            "python_version": platform.python_version(),
            "phase": "start",
        }
        self._phase_t0 = time.perf_counter()
        self._spawned: float | None = None
        spawned = os.environ.get(SPAWNED_AT_ENV)
        if spawned:  # interpreter start and this module's imports, from the runner's clock
            with suppress(ValueError):
                self._spawned = float(spawned)
                self.result["phase_start_s"] = max(0.0, time.time() - self._spawned)
        self._gate = gate_fd()
        self.ahead = self._gate is not None
        """Started ahead: the process waits at its gate before it touches the device."""

    def cache_served(self) -> None:
        """The shared cache handed this process its first entry: said in RESULT.json at once."""
        self.result[CACHE_SERVED] = True
        self.save()

    def save(self, final: bool = False) -> None:
        """Rewrite RESULT.json (atomically) with the result and the notes so far."""
        self.result["final"] = final
        if self.notes:
            self.result["notes"] = "; ".join(self.notes)
        durable.write_text(self.result_path, json.dumps(self.result, default=str))

    def enter(self, phase: str) -> None:
        """Record the phase before starting it, so a crash or timeout says where it happened; the
        phase it ends gets its wall time (`phase_<name>_s`)."""
        self.close_phase()
        self.result["phase"] = phase
        self.save()

    def close_phase(self) -> None:
        """Add the wall time since the current phase began to its `phase_<name>_s`."""
        now = time.perf_counter()
        previous = self.result.get("phase")
        if previous in PHASES and previous not in ("start", "exit"):
            key = f"phase_{previous}_s"
            self.result[key] = self.result.get(key, 0.0) + now - self._phase_t0
        self._phase_t0 = now

    def pass_gate(self) -> None:
        """In a process started ahead, wait at the gate until the process before it has ended,
        take the variables the gate gives (the job's GPU), move onto the job's cores and record
        `started_ahead`, `gate_wait_s` (how long it waited, ready before the device was free),
        `ahead_hidden_s` (how much of its start-up ran while the process before it still ran) and
        `ahead_cpus`. The wait counts in no phase. A no-op in any other process, and after the
        first call."""
        fd, self._gate = self._gate, None
        if fd is None:
            return
        ready = time.time()
        self.close_phase()
        self.result[AT_GATE] = True  # the runner frees the spare core it started on
        self.save()
        message = wait_at_gate(fd)
        del self.result[AT_GATE]
        if message is None:  # the runner dropped this process: nothing of it is wanted
            os._exit(0)
        opened = message["at"]
        before = format_cpus(os.sched_getaffinity(0))
        for name in (
            GATE_FD_ENV,
            AHEAD_AFFINITY_ENV,
            NVML_CHECK_ENV,
        ):  # not for its children
            os.environ.pop(name, None)
        os.environ.update({str(k): str(v) for k, v in (message.get("env") or {}).items()})
        wanted = message.get("cpus") or os.environ.get(AFFINITY_ENV)
        if wanted:
            os.environ[AFFINITY_ENV] = wanted
            pinned = pin_every_thread(parse_cpus(wanted))
            if not pinned:
                self.notes.append(f"could not move onto the job's cores {wanted} after the gate")
            self.result.update(cpu_affinity=format_cpus(os.sched_getaffinity(0)), cpu_pinned=pinned)
        spawned = self._spawned if self._spawned is not None else ready
        self.result.update(
            started_ahead=True,
            gate_wait_s=max(0.0, opened - ready),
            ahead_hidden_s=max(0.0, min(opened, ready) - spawned),
            ahead_cpus=before,
        )
        if self.job.device == "cuda":  # its description waited for the device too
            from compiler.env import describe

            if VISIBLE in (message.get("env") or {}):
                check_device(os.environ[VISIBLE])
            self.result.update(describe(self.job.device))
        self._phase_t0 = time.perf_counter()
        self.save()

    def fail(self, status: str, exc: BaseException | str) -> None:
        """End the job with `status` (`oom` instead, where `exc` ran out of memory) and the error,
        an exception's with its traceback."""
        self.result["status"] = "oom" if isinstance(exc, BaseException) and is_oom(exc) else status
        self.result["error"] = exc if isinstance(exc, str) else error_text(exc)
        if isinstance(exc, BaseException):
            self.result["traceback"] = "".join(traceback.format_exception(exc))[-ERROR_CHARS:]
        if self.shared_cache is not None:  # what the cache did before the failure: the row names its part
            cols = self.shared_cache.columns()
            self.result.update({k: cols[k] for k in ("compile_cache", "cache_rejected") if k in cols})
            self.notes.extend(n for n in self.shared_cache.notes if n not in self.notes)
            if self.shared_cache.link is not None and self.shared_cache.workers().served:
                self.result[CACHE_SERVED] = True  # a compile worker was handed a Triton config

    def rotating(self, fn, input_sets, mark_step: bool = False):
        """`workers.bench.calls.rotating` on this job's device."""
        return rotating(fn, input_sets, self.job.device, mark_step)
