"""Stage 3 of a tune, rung 1: the knobs round's survivors measured with the sweep's settings
(`orchestrator.tune.search.run_rung1`), those `to_measure` says: all of them where they are more
than the confirmation times anyway, else only those no round measured yet (the knobs turned
together). Its rule, per cell, is what the confirmation measures (`promote`, `picks`): the cell's
own precision's fastest stock config and fastest other candidate, and for each budget whose
fastest fitting candidate (or its second chance) is in another precision, that precision's fastest
stock mode and fastest other candidate that fit the budget."""

from __future__ import annotations

from orchestrator.tune.cells import (
    CellAccuracy,
    CellRun,
    Pick,
    Picks,
    Results,
    figures_of,
    second_chance,
    stock_mode,
)
from orchestrator.tune.presets import Limits, eligible
from orchestrator.tune.space import Candidate


def to_measure(run: CellRun, limits: Limits, stock_names: set[str]) -> list[Candidate]:
    """What rung 1 measures of the cell: its survivors where they are more than the confirmation
    times anyway (rung 1 ranks them with the sweep's timed calls), else only those no round measured
    yet (the knobs that each helped, turned together), so they are ranked before the confirmation."""
    assert run.state is not None
    measured = {c.key for c, _ in run.measured}
    fresh = [c for c in run.survivors if c.key not in measured]
    chosen = picks(run.state, run.measured, limits, stock_names)
    timed = {chosen.second, *(p.candidate for p in (chosen.own, *chosen.budgets.values()) if p)}
    timed |= {p.mode for p in (chosen.own, *chosen.budgets.values()) if p}
    if all(c in timed for c in run.survivors if c.key in measured):
        return fresh
    return list(run.survivors)


def survivor_results(run: CellRun, rows1: Results) -> Results:
    """The survivors' rows: rung 1's where it measured them, else the earlier rounds'."""
    again = {c.key: (c, r) for c, r in rows1}
    earlier = {c.key: (c, r) for c, r in run.measured}
    return [again.get(c.key) or earlier[c.key] for c in run.survivors if c.key in again or c.key in earlier]


def promote(run: CellRun, results1: Results, limits: Limits, stock_names: set[str]) -> None:
    """After rung 1 (or straight from the knobs round, `results1` then the earlier rounds' rows):
    what the confirmation measures of the cell (`picks`, from the survivors' rows and both stock
    modes of the cell's own precision)."""
    assert run.state is not None
    run.rung1 = results1
    run.log["rung1"] = {f"{c.config.name}@{c.dtype}": figures_of(r, limits) for c, r in results1}
    keys = {c.key for c, _ in results1}
    stock = [(c, r) for c, r in run.measured if c.stock and c.key not in keys]  # both stock modes, always
    run.picks = picks(run.state, [*results1, *stock], limits, stock_names)


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
