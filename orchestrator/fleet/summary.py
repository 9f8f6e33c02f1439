"""What a sweep says at its end (`SweepSummary`, which `run_sweep` returns), and the message of a
run that left jobs unfinished: those whose row says `harness_error`, a fault of the harness (a
scratch that filled up or vanished, a Ray task that raised, a worker lost on every attempt),
which `--resume` runs again. `orchestrate sweep`, `tune` and `nightly` print it and exit 3."""

from __future__ import annotations

from dataclasses import dataclass

from store.fields import HARNESS_ERROR
from store.storage import Location
from workers.runner import plural


@dataclass
class SweepSummary:
    """One run of a sweep: what it planned, skipped and recorded (`counts`, by status), its times,
    and the command that runs its unfinished jobs again."""

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
    resume_command: str = ""
    """The command that runs this output's unfinished jobs (`harness_errors`) again."""

    @property
    def harness_errors(self) -> int:
        """Jobs of this run whose row says `harness_error`: a fault of the harness (a scratch that
        filled up or vanished, a lost worker), not a result. The run did not finish them;
        `resume_command` runs them again."""
        return self.counts.get(HARNESS_ERROR, 0)

    def unfinished(self) -> str | None:
        """What to tell the user where jobs ended as `harness_error` (`unfinished`); None if none did."""
        return unfinished(self.harness_errors, self.resume_command) if self.harness_errors else None


def unfinished(count: int, resume: str) -> str:
    """The message of a run that left `count` jobs as `harness_error`, with the command (or call)
    `resume` that runs them again."""
    them = "it" if count == 1 else "them"
    return (
        f"{plural(count, 'job')} failed for a fault of the harness, not of the model (harness_error; "
        f"the row's error says why): not finished. Run {them} again with:\n  {resume}"
    )
