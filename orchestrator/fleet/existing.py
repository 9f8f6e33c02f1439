"""An output directory as a sweep finds it, read before any job runs: with --resume, the damage
an earlier run left moved aside first (part files into `quarantine/`, a damaged run.json set
aside); then, in one read, the jobs it holds and their durations, and the refusals: rows of
another sweep, or rows at all without --resume."""

from __future__ import annotations

from typing import TextIO

from orchestrator.fleet.ordering import History
from orchestrator.spec.sweep import SweepSpec
from store import runlog
from store.reader import repair
from store.schema import TABLES, table_spec
from store.storage import Location


class OutputExistsError(RuntimeError):
    """An output that already holds result rows, given without --resume."""


def quarantine_damage(out: Location, stream: TextIO, stamp: str) -> None:
    """Before a resumed sweep reads which jobs are done: move every part the strict reader refuses
    (damaged, foreign, a second row of a job) aside, so its jobs run again, and leave a commit
    ledger listing exactly the parts kept; name the strays, which stay and are ignored."""
    fixed = repair(out, [table_spec(t) for t in TABLES], stamp)
    if fixed.ledger_moved:
        what, dest = fixed.ledger_moved
        print(f"warning: {out.join('_ledger')} was {what}, not a ledger; moved to {dest}", file=stream)
    for rel in fixed.strays:
        print(
            f"warning: ignoring {out.join(rel)}: not a part file this tool writes; move it out", file=stream
        )
    if fixed.adopted:
        print(
            f"note: {out} was written before outputs had a commit ledger; its {fixed.adopted} part file(s) "
            "are listed in it now",
            file=stream,
        )
    for d, dest in fixed.moved:
        whose = (
            "its jobs run again"
            if d.rel.startswith("results/")
            else (
                "the jobs' result rows are intact, so they are not rerun; their rows of this table are lost"
            )
        )
        where = f"moved to {dest}" if dest else "dropped from the commit ledger"
        print(f"warning: {out.join(d.rel)} is {d.kind} ({d.reason}); {where}: {whose}", file=stream)


def read_done(
    spec: SweepSpec,
    out: Location,
    history_dirs: list[Location],
    resume: bool,
    stream: TextIO,
    stamp: str,
) -> History:
    """What the output (and the history directories) already hold, read once: the jobs done and
    the durations that order this run. Refused: rows of another sweep, and rows at all without
    --resume (`OutputExistsError`)."""
    if resume:  # before the rows are read: every reader refuses a damaged run.json
        runlog.set_aside_if_damaged(out, stream, stamp)
    history = History.from_output(out, history_dirs)  # one read: job ids done, and durations
    runlog.check_same_sweep(out, spec, history.sweeps)
    if history.recorded and not resume:
        raise OutputExistsError(
            f"{out} already holds {history.recorded} result rows. Pass --resume to finish that sweep, "
            "or --out to write somewhere else; nothing was changed."
        )
    return history
