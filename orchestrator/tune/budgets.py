"""A tune's accuracy budgets, cell by cell: whether a cell's outputs can judge precision, which
candidates fit each budget, which bases get the knobs, which candidates go on to rung 1, and what
the confirmation measures (`orchestrator.tune.search` runs the rounds, `orchestrator.tune.deployed`
decides).

A candidate fits a budget when its row is eligible (ok, within the compile-time and memory
limits: `presets.eligible`) and within the budget (`compiler.accuracy.within`: its own precision
always is; another one needs a determined cell and its error against fp64 within the tolerance).
The judgement comes from the rung-0 rows of the cell's own precision: the stock policy's eager
error against fp64, how much the outputs vary and how they respond to a change of the inputs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from compiler import accuracy
from compiler import statistics as cstats
from orchestrator.tune import cells
from orchestrator.tune.cells import Cell, combine_helping_knobs
from orchestrator.tune.presets import Limits, eligible
from orchestrator.tune.space import Candidate, is_base

Results = list[tuple[Candidate, dict[str, Any] | None]]


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


def judge_cell(cell: Cell, results: Results, budgets: tuple[accuracy.AccuracyBudget, ...]) -> CellAccuracy:
    """The cell's judgement under each budget, from its measured rows."""
    thresholds = cstats.load_thresholds()
    figures = accuracy.figures_of_rows([r for _, r in results if r is not None], cell.dtype)
    state = CellAccuracy(cell, figures)
    for b in budgets:
        state.judgements[b.name] = accuracy.judge(b, figures, thresholds)
    return state


def fastest(results: Results) -> tuple[Candidate, dict[str, Any]] | None:
    ok = [(c, r) for c, r in results if r is not None and r.get("compiled_ms")]
    return min(ok, key=lambda cr: cr[1]["compiled_ms"]) if ok else None


def knob_bases(state: CellAccuracy, results: Results, limits: Limits) -> list[Candidate]:
    """The bases the knobs are turned on: the fastest base of the cell's own precision, and the
    fastest base that fits each budget (each once)."""
    bases = [(c, r) for c, r in results if is_base(c)]
    found: list[Candidate] = []
    own = fastest(
        [(c, r) for c, r in bases if c.dtype == state.own and r is not None and eligible(r, limits)]
    )
    if own:
        found.append(own[0])
    for budget in state.judgements:
        best = fastest(state.fitting(budget, bases, limits))
        if best and best[0] not in found:
            found.append(best[0])
    return found


def combinations(
    state: CellAccuracy, results: Results, limits: Limits, bases: list[Candidate]
) -> list[Candidate]:
    """Per knob base, the knobs that each helped it turned together (`cells.combine_helping_knobs`)."""
    found = []
    for base in bases:
        combined = combine_helping_knobs(base, results, limits)
        if combined is not None and combined not in found:
            found.append(combined)
    return found


def stock_mode(c: Candidate, stock_names: set[str]) -> bool:
    """One of the sweep's configs (a stock mode), in any policy."""
    return is_base(c) and c.config.name in stock_names


def promote(
    state: CellAccuracy, results: Results, limits: Limits, eta: int, stock_names: set[str]
) -> list[Candidate]:
    """The candidates that go on to rung 1: per budget, `cells.promote` over the candidates that fit
    it (the others count as failed), and the fastest stock mode in the precision of its best other
    candidate (that candidate's within-precision baseline)."""
    keep: list[Candidate] = []
    for budget in state.judgements:
        masked = [(c, r if state.fits(budget, r, limits) else None) for c, r in results]
        for c in cells.promote(masked, eta, limits):
            if c not in keep:
                keep.append(c)
        ok = sorted(state.fitting(budget, results, limits), key=lambda cr: cr[1]["compiled_ms"])
        other = next((c for c, _ in ok if not c.stock), None)
        lower = second_chance(state, ok, results, limits)
        if lower is not None and lower not in keep:
            keep.append(lower)
        for best in (other, lower):
            if best is None:
                continue
            mode = next((c for c, _ in ok if c.dtype == best.dtype and stock_mode(c, stock_names)), None)
            if mode is not None and mode not in keep:
                keep.append(mode)
    return keep


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


def picks(state: CellAccuracy, results: Results, limits: Limits, stock_names: set[str]) -> Picks:
    """What the confirmation of the cell measures (`results`: rung 1's, or rung 0's for a cell that
    skipped it): its own precision's fastest stock config and fastest other candidate, and for each
    budget, the precision P of its fastest fitting candidate outside the cell's own precision where
    that one is the budget's fastest or its `second_chance`: P's fastest stock mode and fastest other
    candidate that fit the budget."""
    found = Picks()
    own = sorted(
        ((c, r) for c, r in results if c.dtype == state.own and r is not None and eligible(r, limits)),
        key=lambda cr: cr[1]["compiled_ms"],
    )
    stock = [c for c, _ in own if c.stock]
    found.second = stock[1] if len(stock) > 1 else None
    other = next((c for c, _ in own if not c.stock), None)
    if stock or other:
        found.own = Pick(state.own, other, stock[0] if stock else None)
    for budget in state.judgements:
        ok = sorted(state.fitting(budget, results, limits), key=lambda cr: cr[1]["compiled_ms"])
        best = next((c for c, _ in ok if not c.stock), None)
        if best is None:
            continue
        if best.dtype == state.own:
            best = second_chance(state, ok, results, limits)
            if best is None:
                continue
        mine = [c for c, _ in ok if c.dtype == best.dtype]
        found.budgets[budget] = Pick(
            best.dtype,
            next((c for c in mine if not stock_mode(c, stock_names)), None),
            next((c for c in mine if stock_mode(c, stock_names)), None),
        )
    return found
