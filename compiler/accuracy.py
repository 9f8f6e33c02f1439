"""Accuracy budgets: how much error against fp64 a user accepts, which precision policies that lets
a hardware class search, and whether a cell's outputs can judge it at all.

A sweep or a tune declares `accuracy:` (`parse_budget`):

- `stock`: no worse against fp64 than the stock policy (`compiler.precision.STOCK`, torch's
  defaults) on that cell, within `accuracy_stock_factor` (and never below `accuracy_floor`);
- a named level, `tf32`, `fp16` or `bf16`: the max relative error against fp64 such a policy is
  allowed (`accuracy_<level>`);
- a number: that max relative error against fp64.

The error is the one `compiler.measure.rel_err_against` measures: max |x - fp64| / max |fp64| over
the output tensors (a row's `fp64_max_rel_err`, or `eager_fp64_max_rel_err` for eager). Every
threshold is in `compiler/statistics/thresholds.json` (`compiler.statistics.Thresholds`).

Which policies a budget searches on a class (`policies_for`): the cell's own (the model's dtype,
always: it is the stock user's), and the others in the nominal order of `compiler.precision`
(fp32-strict, fp32, tf32, fp16, bf16) up to the budget's level, that the class runs natively
(`compiler.capabilities`): no TF32 or bf16 below sm80. Each policy left out has its reason.

With random weights a cell's outputs may not judge precision (`judge`): the stock policy's eager
output already outside the budget against fp64, outputs nearly constant, or ill-conditioned
(`output_sensitivity`). Such a cell is `undetermined` and keeps its own precision; with real
weights (`weights` other than random) the measured errors judge as they are.

This module imports neither Ray nor `orchestrator`, nor torch.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from compiler.precision import POLICIES, PRECISIONS, SENSITIVITY_STEPS, STOCK, canonical_precision

LEVELS: tuple[str, ...] = ("tf32", "fp16", "bf16")
"""The named levels a budget may give (each is a policy's name)."""
STOCK_BUDGET = "stock"

DETERMINED = "determined"
UNDETERMINED = "undetermined"


@dataclass(frozen=True)
class AccuracyBudget:
    """One accuracy budget."""

    name: str
    """`stock`, a level of `LEVELS`, or the number as given (e.g. `0.01`)."""
    value: float | None = None
    """The max relative error for a number; None for `stock` and the levels."""

    @property
    def kind(self) -> str:
        return (
            "number" if self.value is not None else (STOCK_BUDGET if self.name == STOCK_BUDGET else "level")
        )

    def max_rank(self) -> int:
        """The highest nominal rank (`compiler.precision.Policy.rank`) the budget searches."""
        if self.kind == "number":
            return max(p.rank for p in POLICIES.values())
        if self.kind == STOCK_BUDGET:
            return POLICIES["tf32"].rank  # the stock policy's own TF32 convolutions, on matmuls too
        return POLICIES[self.name].rank

    def tolerance(self, stock_err: float | None, thresholds: Any) -> float | None:
        """The max relative error against fp64 it allows on a cell whose stock policy's eager error
        is `stock_err` (None: the stock budget cannot be set without it)."""
        if self.kind == "number":
            return self.value
        if self.kind == "level":
            return getattr(thresholds, f"accuracy_{self.name}")
        if stock_err is None or not math.isfinite(stock_err):
            return None
        return max(thresholds.accuracy_stock_factor * stock_err, thresholds.accuracy_floor)

    def rule(self, thresholds: Any) -> str:
        """The rule in words (a preset's `accuracy_rule`)."""
        if self.kind == "number":
            return f"max relative error against fp64 <= {self.value:g}"
        if self.kind == "level":
            return (
                f"max relative error against fp64 <= {getattr(thresholds, f'accuracy_{self.name}'):g} "
                f"({self.name} level)"
            )
        return (
            f"max relative error against fp64 <= {thresholds.accuracy_stock_factor:g} x the stock policy's "
            f"eager error on the cell (at least {thresholds.accuracy_floor:g})"
        )


def parse_budget(value: Any) -> AccuracyBudget:
    """A budget from a sweep file's or the command line's value; ValueError saying what is valid."""
    valid = f"{STOCK_BUDGET}, {', '.join(LEVELS)}, or a number such as 0.01 (max relative error against fp64)"
    if isinstance(value, bool):
        raise ValueError(f"an accuracy budget is {valid}, not {value!r}")
    if isinstance(value, str):
        text = value.strip()
        canon = canonical_precision(text)
        if text == STOCK_BUDGET:
            return AccuracyBudget(STOCK_BUDGET)
        if canon in LEVELS:
            return AccuracyBudget(canon)
        try:
            value = float(text)
        except ValueError:
            raise ValueError(f"unknown accuracy budget {text[:60]!r}; valid: {valid}") from None
    if isinstance(value, (int, float)):
        if not (math.isfinite(value) and 0 < value < 1):
            raise ValueError(f"a numeric accuracy budget is a relative error in (0, 1), got {value!r}")
        return AccuracyBudget(f"{float(value):g}", float(value))
    raise ValueError(f"an accuracy budget is {valid}, not {type(value).__name__}")


def parse_budgets(values: Iterable[Any]) -> tuple[AccuracyBudget, ...]:
    """Several budgets, each once (ValueError on a repeat or a bad one)."""
    found: list[AccuracyBudget] = []
    for v in values:
        b = parse_budget(v)
        if any(f.name == b.name for f in found):
            raise ValueError(f"accuracy budget {b.name!r} given twice")
        found.append(b)
    return tuple(found)


@dataclass(frozen=True)
class PolicyChoice:
    policy: str
    searched: bool
    why: str


def _unsupported(policy: str, caps: Any) -> str | None:
    """Why class `caps` (`compiler.capabilities.Capabilities`) cannot run `policy` natively."""
    needs = POLICIES[policy].needs
    if needs is None or caps is None:
        return None
    who = f"{caps.name} ({caps.sm})" if caps.device == "cuda" else caps.name
    if needs == "tf32" and (caps.device != "cuda" or not caps.tf32):
        where = "TF32 is a tensor-core format of sm80+" if caps.device == "cuda" else "TF32 is a GPU format"
        return f"{who}: {where}, so tf32 would run and measure as fp32"
    if needs == "bf16" and not caps.bf16:
        return f"{who} has no native bf16 (sm80+): Inductor would skip bf16 graphs and eager emulates it"
    if needs == "fp16" and not caps.fp16:
        return f"{who} has no fp16"
    return None


def policies_for(
    budget: AccuracyBudget, caps: Any, own: str = STOCK, restrict: Iterable[str] | None = None
) -> list[PolicyChoice]:
    """Every policy, searched or not on a class with capabilities `caps` under `budget`, with why;
    `own` is the cell's own policy (always searched), `restrict` the policies the user allows
    (`--precisions`; None: all)."""
    allowed = set(restrict) if restrict is not None else None
    own_rank = POLICIES[own].rank
    found = []
    for name in PRECISIONS:
        p = POLICIES[name]
        if name == own:
            found.append(PolicyChoice(name, True, "the cell's own precision: what a stock user runs"))
            continue
        if p.rank < own_rank:
            why = f"stricter than the cell's own {own}: never faster"
        elif p.rank > budget.max_rank():
            why = f"rounds more than the {budget.name} budget allows"
        elif (reason := _unsupported(name, caps)) is not None:
            why = reason
        elif allowed is not None and name not in allowed:
            why = "not among --precisions"
        else:
            found.append(PolicyChoice(name, True, f"within the {budget.name} budget's level"))
            continue
        found.append(PolicyChoice(name, False, why))
    return found


def searched(budgets: Iterable[AccuracyBudget], caps: Any, own: str = STOCK, restrict=None) -> list[str]:
    """The policies any of `budgets` searches on the class, in the nominal order."""
    names = {c.policy for b in budgets for c in policies_for(b, caps, own, restrict) if c.searched}
    return [p for p in PRECISIONS if p in names]


def _step(budget: AccuracyBudget) -> int:
    """The index in `SENSITIVITY_STEPS` of the coarsest rounding `budget` searches: 2^-11 where
    TF32 or fp16 is the most it allows, 2^-8 where bf16 may be searched."""
    return 2 if budget.max_rank() >= POLICIES["bf16"].rank else 1


@dataclass(frozen=True)
class CellFigures:
    """What a cell's rows of its own policy say of its outputs (`figures_of_rows`)."""

    stock_err: float | None
    """The own policy's eager error against fp64 (the largest its rows measured)."""
    spread: float | None
    sensitivity: tuple[float, ...] | None
    """At each of `SENSITIVITY_STEPS` (the largest any row measured)."""
    weights: str = "random"


def figures_of_rows(rows: Iterable[dict[str, Any]], own: str = STOCK) -> CellFigures:
    """`CellFigures` from a cell's result rows (those of its own policy count)."""
    mine = [r for r in rows if r.get("dtype") == own and r.get("status") == "ok"]

    def pick(key: str, choose) -> float | None:
        values = [r[key] for r in mine if r.get(key) is not None]
        return choose(values) if values else None

    probes = [tuple(r["output_sensitivity"]) for r in mine if r.get("output_sensitivity")]
    sensitivity = tuple(max(p[i] for p in probes) for i in range(min(map(len, probes)))) if probes else None
    weights = next((r.get("weights") for r in mine if r.get("weights")), "random")
    return CellFigures(pick("eager_fp64_max_rel_err", max), pick("output_spread", min), sensitivity, weights)


@dataclass(frozen=True)
class Judgement:
    decision: str
    """`determined` or `undetermined`."""
    why: str
    tolerance: float | None
    """The max relative error against fp64 a candidate of another policy may have."""
    rule: str


def judge(budget: AccuracyBudget, figures: CellFigures, thresholds: Any) -> Judgement:
    """Whether the cell's outputs can judge precision under `budget`, and its tolerance."""
    tol = budget.tolerance(figures.stock_err, thresholds)
    rule = budget.rule(thresholds)

    def undetermined(why: str) -> Judgement:
        return Judgement(UNDETERMINED, f"{why}: the cell keeps its own precision", tol, rule)

    if figures.stock_err is None or tol is None:
        return undetermined("no error against fp64 was measured for the stock policy")
    if figures.weights != "random":
        return Judgement(DETERMINED, f"judged on {figures.weights} weights", tol, rule)
    if figures.stock_err > tol:
        return undetermined(
            f"with random weights the stock policy's eager output is already off by {figures.stock_err:.3g} "
            f"against fp64, beyond the budget's {tol:.3g}"
        )
    least = max(thresholds.accuracy_min_spread, tol)
    if figures.spread is not None and figures.spread < least:
        return undetermined(
            f"with random weights an output is nearly constant (it varies by {figures.spread:.3g} of its "
            f"magnitude, less than {least:.3g}): an error the budget allows could erase its variation"
        )
    sens = figures.sensitivity
    if sens and sens[0] < thresholds.accuracy_min_sensitivity:
        return undetermined(
            f"with random weights the outputs barely depend on the inputs (a relative input change of "
            f"{SENSITIVITY_STEPS[0]:g} moves them {sens[0]:.3g}x as much): no precision's error reaches them"
        )
    step = _step(budget)
    if sens and len(sens) > step and sens[step] > thresholds.accuracy_max_sensitivity:
        return undetermined(
            f"with random weights the outputs are ill-conditioned (a relative input change of "
            f"{SENSITIVITY_STEPS[step]:.3g}, the budget's rounding, grows {sens[step]:.3g}x, above "
            f"{thresholds.accuracy_max_sensitivity:g}x)"
        )
    spread = f"spread {figures.spread:.3g}" if figures.spread is not None else "spread not measured"
    probe = f"sensitivity {sens[0]:.3g}x to {max(sens):.3g}x" if sens else "no float input to perturb"
    return Judgement(
        DETERMINED,
        f"random weights whose outputs can judge it (stock error {figures.stock_err:.3g}, {spread}, {probe})",
        tol,
        rule,
    )


def within(row: dict[str, Any], side: str, judgement: Judgement, own: str = STOCK) -> tuple[bool, str | None]:
    """Whether a candidate (the `compiled` or `eager` side of `row`) is within the budget, and why
    not. The cell's own policy always is (the fp64 harness rule of its job judged it); another
    policy needs a determined cell and its error against fp64 within the tolerance."""
    if row.get("dtype") == own:
        return True, None
    if judgement.decision != DETERMINED:
        return False, f"precision undetermined on the cell ({row.get('dtype')} not tried against it)"
    err = row.get("fp64_max_rel_err" if side == "compiled" else "eager_fp64_max_rel_err")
    if err is None:
        return False, "no error against fp64 measured"
    if judgement.tolerance is None or not err <= judgement.tolerance:
        return False, f"error against fp64 {err:.3g} over the budget's {judgement.tolerance:.3g}"
    return True, None
