"""Stage 2 of a tune, the knobs round: each knob turned on the bases rung 0 promoted, measured
cheaply (`orchestrator.tune.search.run_knobs`). Its rule, per cell, is what goes on to rung 1
(`promote`): per budget, the fastest 1/eta of the candidates that fit it, with the fastest stock
config and the fastest other candidate beside them (`best_fraction`), the budget's second chance
in a lower precision (`cells.second_chance`) and the fastest stock mode of each one's precision
(`survivors`); and per knob base, the knobs that each were faster than it, turned together
(`combinations`)."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from orchestrator.tune.cells import CellAccuracy, CellRun, Results, figures_of, second_chance, stock_mode
from orchestrator.tune.presets import Limits, eligible
from orchestrator.tune.space import KNOB_NAMES, Candidate, with_knobs


def promote(run: CellRun, knob_results: Results, limits: Limits, eta: int, stock_names: set[str]) -> None:
    """After the knobs round: what goes on to rung 1 (`survivors`, and per knob base the knobs
    that each helped it, turned together)."""
    assert run.state is not None
    run.measured += knob_results
    run.survivors = survivors(run.state, run.measured, limits, eta, stock_names)
    for combined in combinations(run.state, run.measured, limits, run.bases):
        if combined not in run.survivors:
            run.survivors.append(combined)
    run.log["candidates"] = {f"{c.config.name}@{c.dtype}": figures_of(r, limits) for c, r in run.measured}
    run.log["promoted"] = [f"{c.config.name}@{c.dtype}" for c in run.survivors]


def survivors(
    state: CellAccuracy, results: Results, limits: Limits, eta: int, stock_names: set[str]
) -> list[Candidate]:
    """The candidates that go on to rung 1: per budget, `best_fraction` over the candidates that fit
    it (the others count as failed), and the fastest stock mode in the precision of its best other
    candidate (that candidate's within-precision baseline)."""
    keep: list[Candidate] = []
    for budget in state.judgements:
        masked = [(c, r if state.fits(budget, r, limits) else None) for c, r in results]
        for c in best_fraction(masked, eta, limits):
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


def best_fraction(
    results: list[tuple[Candidate, dict[str, Any] | None]], eta: int, limits: Limits
) -> list[Candidate]:
    """The candidates of one cell that go on to rung 1 (of the rows that fit one budget): the
    fastest ceil(n / eta) eligible ones (n: every candidate, failed ones included), and the fastest
    eligible stock config and the fastest eligible other one, so the confirmation always has both
    sides (rung 0's one short process ranks; it cannot tell a 2% difference from noise)."""
    ok = sorted(
        ((c, r) for c, r in results if r is not None and eligible(r, limits)),
        key=lambda cr: cr[1]["compiled_ms"],
    )
    keep = [c for c, _ in ok[: max(1, math.ceil(len(results) / eta))]]
    for side in (True, False):
        best = next((c for c, _ in ok if c.stock == side), None)
        if best is not None and best not in keep:
            keep.append(best)
    return keep


def combinations(
    state: CellAccuracy, results: Results, limits: Limits, bases: list[Candidate]
) -> list[Candidate]:
    """Per knob base, the knobs that each helped it turned together (`combine_helping_knobs`)."""
    found = []
    for base in bases:
        combined = combine_helping_knobs(base, results, limits)
        if combined is not None and combined not in found:
            found.append(combined)
    return found


def combine_helping_knobs(
    base: Candidate, results: list[tuple[Candidate, dict[str, Any] | None]], limits: Limits
) -> Candidate | None:
    """`base` with every knob that was faster than it (each turned on it alone, in its policy),
    turned together, when at least two were: knobs are measured one at a time, and their gains may
    add up (cudnn_benchmark on top of freezing, ...). None otherwise."""
    rows = {c.key: r for c, r in results}
    base_row = rows.get(base.key)
    if base_row is None or not eligible(base_row, limits):
        return None
    faster = {
        c.turned[0]
        for c, r in results
        if c.dtype == base.dtype
        and c.base_name == base.config.name
        and len(c.turned) == 1
        and r is not None
        and eligible(r, limits)
        and r["compiled_ms"] < base_row["compiled_ms"]
    }
    helping = [k for k in KNOB_NAMES if k in faster]
    if len(helping) < 2:
        return None
    cfg = with_knobs(base.config, helping)
    if cfg is None:
        return None
    name = f"{base.config.name}+{'+'.join(helping)}"
    return Candidate(dataclasses.replace(cfg, name=name), base.dtype, False, tuple(helping), base.config.name)
