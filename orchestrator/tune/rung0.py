"""Stage 1 of a tune, rung 0: every cell's bases (the stock configs and added modes, in every
precision a budget lets the class search), measured cheaply (`orchestrator.tune.search.run_rung0`).
Its rules, per cell: the cell's judgement under each accuracy budget, from the rows of its own
precision (`judge_cell`: whether its outputs can judge precision at all; random weights may not),
and what goes on to the knobs round (`promote`): each knob on the fastest base of the cell's own
precision and on each budget's fastest base that fits it (`knob_bases`)."""

from __future__ import annotations

from typing import Any

from compiler import accuracy
from compiler import statistics as cstats
from compiler.accuracy import AccuracyBudget
from orchestrator.tune.cells import Cell, CellAccuracy, CellRun, Results
from orchestrator.tune.presets import Limits, eligible
from orchestrator.tune.space import Candidate, is_base, knobs_on


def promote(
    run: CellRun, results0: Results, budgets: tuple[AccuracyBudget, ...], limits: Limits
) -> list[Candidate]:
    """After rung 0: the cell's judgement per budget (`judge_cell`); returns the knob candidates to
    measure, each knob on the bases `knob_bases` picks."""
    run.measured = list(results0)
    run.state = judge_cell(run.cell, results0, budgets)
    run.bases = knob_bases(run.state, results0, limits)
    found: list[Candidate] = []
    for base in run.bases:
        found += [c for c in knobs_on(run.space, base) if c not in found]
    run.log["accuracy"] = run.state.log()
    return found


def judge_cell(cell: Cell, results: Results, budgets: tuple[AccuracyBudget, ...]) -> CellAccuracy:
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
