"""What every stage of a tune speaks (`orchestrator.tune.search` runs the stages in order, each a
module of its own: `rung0`, `knobs`, `rung1`, `confirm`, `decide`, `deployed`; none imports
another): a cell (`Cell`), its judgement under each accuracy budget (`CellAccuracy`: which rows fit
each), a candidate's row as tune.json keeps it (`figures_of`), what the confirmation measures per
precision (`Pick`, `Picks`) and the jobs that do (`PrecisionJobs`), what the decision hands the
deployment (`Choices`), and `CellRun`: what one round hands the next, per cell. The rules two
stages share: `stock_mode`, `second_chance` (the knobs round promotes it, rung 1 picks it). And
`RowsLost`: a round whose rows went missing while the tune ran."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from analysis.stock import StockUser
from compiler import accuracy
from compiler.job import Job, ModelSpec
from orchestrator.tune.presets import Limits, eligible
from orchestrator.tune.space import Candidate, is_base
from store.location_forms import StorageError
from store.storage import Location
from workers.runner import plural


@dataclass(frozen=True)
class Cell:
    hardware: str
    device: str
    model: ModelSpec
    batch_size: int
    dtype: str

    @property
    def name(self) -> str:
        return f"{self.hardware}/{self.model.name}/bs{self.batch_size}/{self.dtype}"

    def __hash__(self) -> int:  # the model's overrides are a dict; its name is unique in a sweep
        return hash(self.name)


Results = list[tuple[Candidate, dict[str, Any] | None]]
"""A cell's candidates, each with its row (None: it has none)."""

Rows = dict[str, dict[str, Any]]
"""Rows by job id."""


@dataclass
class CellAccuracy:
    """The accuracy judgement of one cell under every budget of the tune: whether its outputs can
    judge precision under each, and which rows fit each."""

    cell: Cell
    figures: accuracy.CellFigures
    judgements: dict[str, accuracy.Judgement] = field(default_factory=dict)
    """Per budget name."""

    @property
    def own(self) -> str:
        return self.cell.dtype

    def fits(self, budget: str, row: dict[str, Any] | None, limits: Limits, side: str = "compiled") -> bool:
        return (
            row is not None
            and eligible(row, limits)
            and accuracy.within(row, side, self.judgements[budget], self.own)[0]
        )

    def why_not(self, budget: str, row: dict[str, Any], side: str = "compiled") -> str | None:
        """Why a row's `side` is outside `budget` (None: within)."""
        return accuracy.within(row, side, self.judgements[budget], self.own)[1]

    def fitting(self, budget: str, results: Results, limits: Limits) -> Results:
        return [(c, r) for c, r in results if self.fits(budget, r, limits)]

    def log(self) -> dict[str, Any]:
        """What tune.json keeps of the cell's judgement, per budget."""
        return {
            name: {"decision": j.decision, "why": j.why, "tolerance": j.tolerance, "rule": j.rule}
            for name, j in self.judgements.items()
        }


def stock_mode(c: Candidate, stock_names: set[str]) -> bool:
    """One of the sweep's configs (a stock mode), in any policy."""
    return is_base(c) and c.config.name in stock_names


def second_chance(state: CellAccuracy, ok: Results, results: Results, limits: Limits) -> Candidate | None:
    """A budget's fastest fitting candidate outside the cell's own precision where the budget's
    fastest is in the own precision and this one measured faster than the stock config (`ok`: the
    budget's fitting rows, fastest first): it goes on and is confirmed too, so that a fastest
    candidate the confirmation cannot tell from the stock config does not leave the budget at
    stock. On an H100, resnet-50 at batch 1 ranked an fp32 knob first (0.69 ms) and bf16 close
    behind (0.71 ms against the stock config's 1.37); the fp32 one's confirmation over 2 processes
    could not tell it from the stock config, and with bf16 never confirmed the bf16 budget kept
    stock."""
    first = next((c for c, _ in ok if not c.stock), None)
    lower = next(((c, r) for c, r in ok if not c.stock and c.dtype != state.own), None)
    if first is None or lower is None or first.dtype != state.own:
        return None
    stock = min(
        (r["compiled_ms"] for c, r in results if c.stock and r is not None and eligible(r, limits)),
        default=None,
    )
    return lower[0] if stock is not None and lower[1]["compiled_ms"] < stock else None


@dataclass(frozen=True)
class Pick:
    """What the confirmation measures in one precision of a cell."""

    policy: str
    candidate: Candidate | None
    """The fastest candidate in it other than its stock modes (a knob turned, an added mode)."""
    mode: Candidate | None
    """The fastest stock mode in it: the candidate's within-precision baseline (in the cell's own
    precision, the stock config: a stock user's `torch.compile`)."""


@dataclass
class Picks:
    second: Candidate | None = None
    """The other stock config of the cell's own precision, timed in the stock config's processes
    (the faster of the two is the stock user's `torch.compile`)."""
    own: Pick | None = None
    """The cell's own precision (every budget's fallback)."""
    budgets: dict[str, Pick] = field(default_factory=dict)
    """Per budget whose fastest fitting candidate is in another precision: that precision."""

    @property
    def stock(self) -> Candidate | None:
        return self.own.mode if self.own else None


@dataclass
class PrecisionJobs:
    """The confirmation jobs of one precision of a cell."""

    pick: Pick
    pair: Job | None = None
    """The candidate against the stock mode in the same processes (equal runtime settings)."""
    candidate: Job | None = None
    """The candidate alone (no stock mode, or one with other runtime settings)."""
    mode: Job | None = None
    """The stock mode alone (with the other stock config as its baseline, in the own precision)."""

    def jobs(self) -> list[Job]:
        return [j for j in (self.pair, self.candidate, self.mode) if j is not None]


@dataclass
class CellRun:
    """One cell through the stages: what each round hands the next, each stage filling in its part."""

    cell: Cell
    space: list[Candidate]
    """Every candidate it may reach (`space.candidates`)."""
    state: CellAccuracy | None = None
    """Its judgement under each budget, from rung 0 (`rung0.judge_cell`)."""
    measured: Results = field(default_factory=list)
    """Rung 0 and the knobs round."""
    bases: list[Candidate] = field(default_factory=list)
    """The bases the knobs were turned on."""
    survivors: list[Candidate] = field(default_factory=list)
    """What goes on to rung 1 (`knobs.promote`)."""
    rung1: Results = field(default_factory=list)
    """The survivors' rows: rung 1's, or the earlier rounds' where it did not measure them."""
    picks: Picks | None = None
    """What the confirmation measures (`rung1.promote`)."""
    confirm: dict[str, PrecisionJobs] = field(default_factory=dict)
    """The confirmation's jobs, per precision (`confirm.cell_jobs`)."""
    log: dict[str, Any] = field(default_factory=dict)
    """What tune.json keeps of the cell, each stage adding its part."""


@dataclass
class Choices:
    """What the decision hands the deployment, per cell (`decide.decide_cell`)."""

    options: dict[str, list[tuple[dict[str, Any] | None, str]]]
    """Per budget name, (preset entry or None, why) per precision decided: another precision's where
    the budget picked one, the cell's own last."""
    user: StockUser | None
    """The stock user, from the job that timed it (None: that job did not run or failed)."""
    stock: dict[str, Any] | None
    """The stock user's own choice, as a preset."""
    rows: Rows
    """The cell's confirmation rows, by job id."""
    candidates: int
    """How many of the cell's candidates measured ok."""
    missing: dict[str, Any] | None = None
    """Where nothing was decided in the cell's own precision: the cell, and its candidates' statuses."""


def figures_of(row: dict[str, Any] | None, limits: Limits) -> dict[str, Any]:
    """What tune.json keeps of a candidate's row: its figures, its error, or the limit it broke
    (`over_budget`; a job without a row reads `missing`)."""
    if row is None:
        return {"status": "missing"}
    keep = ("status", "compiled_ms", "eager_ms", "compile_s", "peak_mem_bytes", "speedup_vs_baseline")
    figures = {k: row.get(k) for k in keep if row.get(k) is not None}
    excess = limits.excess(row) if row["status"] == "ok" else None
    if row["status"] != "ok":
        figures["error"] = (row.get("error") or "")[:300]
    elif excess:
        figures["over_budget"] = excess
    return figures


class RowsLost(StorageError):
    """A round's sweep ended but some of its jobs have no row in the round's folder: something
    outside the tune removed it or put an older copy in its place while the tune ran. Deciding
    without those rows would turn a lost stock row into a preset no confirmation measured (a stock
    config missing from rung 1 is not one that failed), so the tune stops before deciding."""


def check_rows_kept(
    round_name: str, where: Location, jobs: list[Job], rows: dict[str, Any], resume: str
) -> None:
    """Raise `RowsLost` where a job of the round that just ran has no row in `rows` (read back from
    `where`, the round's folder, after its sweep)."""
    lost = [j for j in jobs if j.job_id not in rows]
    if not lost:
        return
    names = ", ".join(j.name for j in lost[:3]) + (", ..." if len(lost) > 3 else "")
    raise RowsLost(
        f"tune {round_name}: {where} holds no row for {plural(len(lost), 'job')} of the "
        f"{len(jobs)} that ran ({names}): the folder was removed or replaced while the tune ran "
        f"(a copy put back over it?). Nothing was decided; `{resume}` measures them again."
    )
