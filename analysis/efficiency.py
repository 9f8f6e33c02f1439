"""Where a sweep's time went: its job efficiency and the phases that took the most of its wall time.

The end of `orchestrate sweep` prints it for the run's rows, and `orchestrate report` for the
output's, so that a user sees at once whether a sweep was compile-bound, import-bound or
timing-bound. From the results' columns (`store.fields`):

- the wall time is each job's `wall_s` (from dispatch to result, less its wait for a GPU behind
  another job, `lane_wait_s`: `workers.lanes`; `subprocess_s` for a row without it), summed over
  the jobs;
- the **job efficiency** is the share of it spent compiling, timing and checking accuracy
  (`phase_compile_s`, `phase_timing_s`, `phase_accuracy_s`);
- each phase's share is its `phase_<name>_s` over the wall time, except that the start-up of
  processes started ahead (`workers.ahead`), which ran while the process before each still ran,
  is hidden from the wall: a row's `ahead_hidden_s` is taken off its start-up phases (start,
  imports, build) in proportion to them. What no phase holds (dispatch, queueing in Ray,
  teardown not measured) is `other`.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from compiler.job import MEASURING, PHASES

STARTUP = ("start", "imports", "build")
"""The phases a process started ahead runs before its gate."""
TOP = 3
BOUND = {"imports": "import-bound", "start": "start-up-bound", "exit": "exit-bound"}
"""How a sweep is named by its largest phase (else `<phase>-bound`)."""
COLUMNS = [
    "wall_s",
    "subprocess_s",
    "ahead_hidden_s",
    "started_ahead",
    "ahead_off",
    "lane_wait_s",
    "run_id",
] + [f"phase_{p}_s" for p in PHASES]
"""The results columns the summary reads."""


@dataclass
class Efficiency:
    """A set of rows' time: the wall, each phase's share of it, the overlap of start-up."""

    jobs: int = 0
    wall_s: float = 0.0
    phases: dict[str, float] = field(default_factory=lambda: dict.fromkeys(PHASES, 0.0))
    """Seconds of each phase that counted against the wall (start-up hidden behind the
    process before it taken off)."""
    hidden_s: float = 0.0
    later: int = 0
    """Processes after a job's first (those that could start ahead)."""
    ahead: int = 0
    """Of those, the ones started ahead."""
    firsts: int = 0
    """Jobs whose first process started ahead, before the job had its GPU (`workers.lanes`)."""
    off: Counter = field(default_factory=Counter)
    """Why processes were not started ahead: jobs per reason."""

    @property
    def measuring_s(self) -> float:
        return sum(self.phases[p] for p in MEASURING)

    @property
    def efficiency(self) -> float:
        return self.measuring_s / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def other_s(self) -> float:
        return max(0.0, self.wall_s - sum(self.phases.values()))

    def top(self, n: int = TOP) -> list[tuple[str, float]]:
        """The `n` largest shares of the wall time, `other` included, largest first."""
        shares = {**self.phases, "other": self.other_s}
        ranked = sorted(shares.items(), key=lambda kv: -kv[1])
        return [(name, s / self.wall_s) for name, s in ranked[:n] if s > 0]

    @property
    def bound(self) -> str:
        """What the sweep was bound by: its largest phase, or the time in none."""
        name, seconds = max(self.phases.items(), key=lambda kv: kv[1])
        if seconds < self.other_s:
            return "mostly outside the processes' phases (dispatch, queueing, start-up not recorded)"
        return BOUND.get(name, f"{name}-bound")


def _add_row(total: Efficiency, row: dict[str, Any]) -> None:
    wall = row.get("wall_s") or row.get("subprocess_s")
    if not wall:
        return
    total.jobs += 1
    total.wall_s += wall
    values = {p: row.get(f"phase_{p}_s") or 0.0 for p in PHASES}
    hidden = row.get("ahead_hidden_s") or 0.0
    startup = sum(values[p] for p in STARTUP)
    for p in PHASES:
        share = hidden * values[p] / startup if p in STARTUP and startup > 0 else 0.0
        total.phases[p] += max(0.0, values[p] - share)
    total.hidden_s += hidden
    ahead = row.get("started_ahead") or []
    total.later += max(0, len(ahead) - 1)
    total.ahead += sum(bool(a) for a in ahead[1:])
    total.firsts += bool(ahead and ahead[0])
    if row.get("ahead_off"):
        total.off[row["ahead_off"]] += 1


def efficiency(rows: Iterable[dict[str, Any]]) -> Efficiency | None:
    """The time of `rows` (results rows as dicts); None where no row has a wall time."""
    total = Efficiency()
    for row in rows:
        _add_row(total, row)
    return total if total.jobs else None


def summary_lines(e: Efficiency) -> list[str]:
    """The summary as lines of plain text."""
    top = ", ".join(f"{name} {share:.0%}" for name, share in e.top())
    lines = [
        f"job efficiency {e.efficiency:.0%} (compiling, timing and checking accuracy) of "
        f"{e.wall_s:.0f} s of wall time over {e.jobs} job{'' if e.jobs == 1 else 's'}; "
        f"{e.bound}: {top} of the wall time"
    ]
    if e.later or e.firsts:
        whose = f"{e.firsts} job's" if e.firsts == 1 else f"{e.firsts} jobs'"
        firsts = f" and {whose} first, started before the job had its GPU" if e.firsts else ""
        lines.append(
            f"processes started ahead: {e.ahead} of the {e.later} after a job's first{firsts}, "
            f"hiding {e.hidden_s:.1f} s of start-up"
        )
    for reason, jobs in e.off.most_common(2):
        lines.append(f"not started ahead in {jobs} job{'' if jobs == 1 else 's'}: {reason}")
    return lines


def render(rows: Iterable[dict[str, Any]], markdown: bool = False) -> str:
    """The summary of `rows` (empty where none has a wall time): plain lines, or a Markdown
    section with every phase's share."""
    e = efficiency(rows)
    if e is None:
        return ""
    if not markdown:
        return "\n".join(summary_lines(e))
    table = ["| phase | seconds | share of the wall time |", "|---|---|---|"]
    for name, seconds in sorted({**e.phases, "other": e.other_s}.items(), key=lambda kv: -kv[1]):
        table.append(f"| {name} | {seconds:.1f} | {seconds / e.wall_s:.1%} |")
    return "\n".join(["# Where the time went\n", *summary_lines(e), "", *table, ""])


def for_run(out: Any, run_id: str) -> str:
    """The summary of one run's rows in the output `out` (what the end of a sweep prints);
    empty where they cannot be read (the rows are saved either way)."""
    from store.schema import read_results

    try:
        rows = read_results(out, columns=COLUMNS).to_pylist()
    except Exception:  # a damaged or unreachable output: the sweep has said what it saved
        return ""
    return render(r for r in rows if r.get("run_id") == run_id)
