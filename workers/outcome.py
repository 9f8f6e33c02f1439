"""How one job process ended, in its row's terms: `classify` turns what a `python -m workers.bench`
process left (its RESULT.json, its exit, its log) into the status and error of its result. It is
the one place that decides a process's status once it has ended; `workers.runner` calls it for
every process of a job, and a job's later processes run only while each before it is `ok`.

1. A process that ended without its final result is a `timeout` (killed at its time limit) or a
   `crash` (a signal, an exit code): the error says where it was, how far its compile got, and
   ends with its output's tail.
2. Otherwise the status it reported stands (`ok`, `compile_error`, `runtime_error`, `oom`,
   `accuracy_fail`, `unsupported`), its traceback appended to its error.
3. A process whose scratch vanished under it (whatever it reported), or whose failure its
   scratch caused (filled up, turned read-only: `workers.scratch`), failed for the harness, not
   the model: `harness_error`, its cause first in the error, which `--resume` runs again.

Errors carry no terminal colour codes (`workers.text.plain`).
"""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

from workers import scratch
from workers.ahead import Step
from workers.bench.gate import AT_GATE
from workers.text import plain

LOG_TAIL_CHARS = 3000

SCRATCH_MAY_FAIL = ("crash", "timeout", "compile_error", "runtime_error", "oom")
"""The statuses a full, read-only or vanished scratch can cause (not `accuracy_fail`: the check
ran; not `unsupported`: the device said so)."""


def classify(
    result: dict[str, Any],
    returncode: int | None,
    step: Step,
    job_file: Path,
    timed_out_after: float | None = None,
    progress: str | None = None,
) -> None:
    """Give `result` (what `step`'s process wrote, which ended with `returncode`, or was killed
    after `timed_out_after` s) its status and error, as the module's docstring says; `progress`:
    how far its compile got where it streamed kernel choices. `job_file` lies in the job's
    scratch. What the process and the runner say to each other (`final`, `phase`, its gate, its
    traceback) does not stay in the result."""
    if not result.get("final"):
        _ended_early(result, returncode, step, timed_out_after, progress)
    elif progress:  # the process reported an exception from within its compile
        result["notes"] = "; ".join(filter(None, [result.get("notes"), f"the compile failed {progress}"]))
    result.pop("final", None)
    result.pop("phase", None)
    result.pop(AT_GATE, None)  # it died at its gate
    trace = result.pop("traceback", None)
    if trace and result.get("error") and trace.strip() not in result["error"]:
        result["error"] += "\n--- traceback ---\n" + trace.strip()
    if result.get("status") != "unsupported":  # the device's answer, whatever the scratch did
        _scratch_failed(result, step, job_file)
    if result.get("error"):
        result["error"] = plain(result["error"])


def _ended_early(
    result: dict[str, Any],
    returncode: int | None,
    step: Step,
    timed_out_after: float | None,
    progress: str | None,
) -> None:
    """The status and error of a process that ended without its final result: a timeout (after
    `timed_out_after` s) or a crash, where it was and how far its compile got, its output's tail."""
    phase = result.get("phase", "start")
    got = f", {progress}" if progress else ""
    if timed_out_after is not None:
        result["status"] = "timeout"
        result["error"] = (
            f"timed out after {timed_out_after:g} s in phase {phase!r}{got}; killed the process tree"
        )
    else:
        rc = returncode if returncode is not None else 1
        how = f"killed by {signal_name(rc)}" if rc < 0 else f"exited with code {rc}"
        if rc == -signal.SIGKILL:
            how += " (possibly the kernel's out-of-memory killer)"
        result["status"] = "crash"
        result["error"] = f"job process {how} in phase {phase!r}{got}"
    tail = log_tail(step.log_file)
    if tail:
        result["error"] += "\n--- last output ---\n" + tail


def _scratch_failed(result: dict[str, Any], step: Step, job_file: Path) -> None:
    """Make the result of a process whose scratch vanished, or whose failure its scratch caused,
    `harness_error`, the cause first in the error (`workers.scratch`)."""
    where, error = job_file.parent, result.get("error") or ""
    cause = scratch.vanished(where, [job_file, step.log_file])
    if cause is None and result.get("status") in SCRATCH_MAY_FAIL:
        cause = scratch.failed(where, [error, log_tail(step.log_file)])
    if cause is None:
        return
    status = result.get("status")
    first, _, rest = error.partition("\n")
    said = f": {status}: {first}" if first else f" (it reported {status})"
    result["error"] = f"{cause} while the job ran{said}; --resume runs it again"
    if rest:
        result["error"] += "\n" + rest
    result["status"] = "harness_error"


def log_tail(path: Path, chars: int = LOG_TAIL_CHARS) -> str:
    """The last `chars` characters of a process's log, without colour codes ("" where it is gone)."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - chars))
            return plain(f.read().decode(errors="replace").strip())
    except OSError:
        return ""


def signal_name(returncode: int) -> str:
    try:
        return signal.Signals(-returncode).name
    except ValueError:
        return f"signal {-returncode}"
