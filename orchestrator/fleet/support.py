"""Which planned jobs their hardware class cannot run, from the capability table
(`compiler.capabilities`): `plan` shows them with the reason, `sweep` writes them as `unsupported`
rows without running them. A class the table does not know is planned as runnable; its jobs check
their device when they start (`workers.bench`) and end `unsupported` there if it rules them out."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field

from compiler.capabilities import Capabilities, cell_support, known
from compiler.job import Job
from compiler.known_gpus import TABLE_VERSION


@dataclass
class Triage:
    runnable: list[Job] = field(default_factory=list)
    unsupported: list[tuple[Job, str]] = field(default_factory=list)
    notes: dict[str, list[str]] = field(default_factory=dict)
    """Per class: what some of its jobs run without (they still run)."""
    unknown: list[str] = field(default_factory=list)
    """Classes the table lacks."""

    def reason_counts(self) -> list[tuple[str, int]]:
        """Each reason and how many jobs it rules out, most first."""
        return Counter(reason for _, reason in self.unsupported).most_common()


def row_error(reason: str) -> str:
    """The `error` of an `unsupported` row: the reason and the table that gave it."""
    return f"{reason} (capability table v{TABLE_VERSION})"


def triage(jobs: Iterable[Job]) -> Triage:
    """Split `jobs` into those their class can run and those it cannot (with the reason)."""
    out = Triage()
    caps: dict[str, Capabilities | None] = {}
    for job in jobs:
        if job.hardware not in caps:
            caps[job.hardware] = known(job.hardware)
            if caps[job.hardware] is None:
                out.unknown.append(job.hardware)
        c = caps[job.hardware]
        if c is None:
            out.runnable.append(job)
            continue
        reason, notes = cell_support(c, job.dtype, job.config)
        if reason is None:
            out.runnable.append(job)
            seen = out.notes.setdefault(job.hardware, [])
            seen += [n for n in notes if n not in seen]
        else:
            out.unsupported.append((job, reason))
    return out
