"""Stage 6 of a tune, the deployment: per cell and accuracy budget what is deployed, and what that
gains over a stock PyTorch user (`orchestrator.tune.search` runs it on the decision's choices).

A stock user runs the model in its own dtype under torch's defaults, eagerly or with plain
`torch.compile(model)` in its best stock mode; the confirmation timed it in processes of its own
(`orchestrator.tune.stock_user`). The rules:

1. A preset never serves something slower than the stock user (`choose`): of the choices the
   decision made per precision (`orchestrator.tune.decide`), the fastest that is the stock user's
   own choice or beats it (`gate`: its interval over the stock user lies above 1); else the stock
   user's choice.
2. A budget that allows more error never deploys a slower preset than one that allows less
   (`looser_never_slower`).

Every preset then carries its budget, the accuracy judgement, its error against fp64 beside the
stock policy's, and its speedup over stock eager and over stock `torch.compile` with intervals
(`finish`; `speedup_vs_stock`: the within-precision part, against the best stock mode of its own
precision). `summary` is `deployed.json`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from analysis.stock import StockUser
from compiler import statistics as cstats
from compiler.accuracy import DETERMINED, AccuracyBudget
from orchestrator.tune.cells import CellAccuracy, CellRun, Choices, Rows
from orchestrator.tune.stock_user import beside, samples, versus


@dataclass
class Decision:
    """What the cell deploys: its presets (one per budget that got one), the cell without a preset in
    its own precision, and each budget's decision in words."""

    entries: list[dict[str, Any]] = field(default_factory=list)
    missing: dict[str, Any] | None = None
    decisions: dict[str, str] = field(default_factory=dict)


def deploy_cell(run: CellRun, choices: Choices, budgets: tuple[AccuracyBudget, ...]) -> Decision:
    """Per budget, what the cell deploys: of the decision's choices, the fastest that is the stock
    user's own choice or beats it (`choose`), with its figures against the stock user (`finish`),
    or a tighter budget's preset where that one is faster (`looser_never_slower`); each budget's
    decision, in words, also in the cell's log."""
    assert run.state is not None
    state, cell, log = run.state, run.cell, run.log
    decided: list[tuple[AccuracyBudget, str, dict[str, Any] | None]] = []
    for budget in budgets:
        entry, why = choose(choices.options[budget.name], choices.user, choices.stock, choices.rows)
        done = None
        if entry is not None:
            done = finish(
                {**entry, "decision": why}, budget, state, choices.user, choices.rows, choices.candidates
            )
        decided.append((budget, why, done))
    found = Decision(missing=choices.missing)
    for budget, why, done in looser_never_slower(decided, state):
        blog = log["budgets"][budget.name]
        name = cell.name if len(budgets) == 1 else f"{cell.name} ({budget.name} budget)"
        found.decisions[name] = blog["decision"] = why
        if done is None:
            continue
        blog["preset"] = {
            k: done.get(k) for k in ("config", "precision", "source", "vs_stock_compile", "vs_stock_eager")
        }
        found.entries.append(done)
    first = log["budgets"][budgets[0].name]
    log["decision"] = first["decision"]
    return found


def choose(options, user, stock, rows) -> tuple[dict[str, Any] | None, str]:
    """Of `options` ((entry, why) per decided precision, the cell's own last), the fastest decided
    preset that is the stock user's own choice or beats it (`gate`); else the stock user's
    choice. Without a stock user timed, the last option (the cell's own precision) as decided. The
    decision says why each option not chosen was not deployed."""
    if user is None:
        return options[-1]
    passed, won = [], []
    for entry, why in options:
        if entry is None:
            passed.append(f"not deployed: {why}")
            continue
        if same_choice(entry, stock):
            won.append((entry, why))
            continue
        if entry.get("source") == "stock" and entry["precision"] == stock["precision"]:
            # another stock mode, preferred by other jobs' noise: the stock user's processes timed
            # its modes side by side, and a stock mode serves as the stock user's choice does
            won.append((stock, stock["decision"]))
            continue
        ok, figures = gate(entry, user, rows)
        if ok:
            won.append((entry, f"{why}; against the stock user: {figures}"))
            continue
        passed.append(
            f"{entry['config']} ({entry['precision']}) not deployed: {figures}, an interval that does not lie above 1"
        )
    if not won:
        return stock, "; ".join([*passed, stock["decision"]])
    entry, why = min(won, key=lambda ew: served_ms(ew[0]))
    slower = [
        f"{e['config']} ({e['precision']}), "
        + ("the stock user's own choice" if same_choice(e, stock) else "which beats the stock user too")
        + f", is slower at {served_ms(e):.4g} ms"
        for e, _ in won
        if e is not entry and not same_choice(e, entry)
    ]
    return entry, "; ".join([*passed, *slower, why])


def served_ms(entry: dict[str, Any]) -> float:
    """A preset's median latency as served (eager's where it runs eager)."""
    ms = entry.get("eager_ms") if entry.get("source") == "eager" else entry.get("compiled_ms")
    return ms or math.inf


def same_choice(entry: dict[str, Any], stock: dict[str, Any]) -> bool:
    """Whether a decided preset is the stock user's own choice."""
    return entry["config"] == stock["config"] and entry["precision"] == stock["precision"]


def gate(entry: dict[str, Any], user: StockUser | None, rows: Rows) -> tuple[bool, str]:
    """Whether a preset in another precision beats the stock user (its interval above 1)."""
    found = samples(entry, rows)
    if user is None or found is None:
        return False, "the stock user was not timed, so nothing shows it faster"
    iv = versus(user, user.side, found)
    figures = f"{iv.estimate:.3f}x [{iv.low:.3f}, {iv.high:.3f}] over {user.label}"
    return cstats.beats(iv), figures


def looser_never_slower(
    decided: list[tuple[AccuracyBudget, str, dict[str, Any] | None]], state: CellAccuracy
) -> list[tuple[AccuracyBudget, str, dict[str, Any] | None]]:
    """Per budget, (budget, why, finished entry or None), where a budget takes the preset of one
    that allows less error when that one's is faster over the stock user's torch.compile (medians):
    what is within a tighter tolerance is within a looser one. On an H100 detr's bf16 budget was
    `undetermined` (its box output nearly constant, less than bf16's 5% could erase) and kept fp32
    at 1.00x, while its stock budget, judged at a 1.3e-2 tolerance, deployed tf32 at 1.23x. A
    preset in the cell's own precision qualifies under any budget; another precision only from a
    determined budget whose tolerance is no larger. The preset taken keeps its figures and the
    judgement that admitted it."""

    def allowed_under(budget: AccuracyBudget, other: AccuracyBudget, done: dict[str, Any]) -> bool:
        if done.get("precision") == state.own:
            return True
        mine, theirs = state.judgements[budget.name], state.judgements[other.name]
        return (
            theirs.decision == DETERMINED
            and theirs.tolerance is not None
            and mine.tolerance is not None
            and theirs.tolerance <= mine.tolerance
        )

    def speed(done: dict[str, Any] | None) -> float:
        value = (done or {}).get("vs_stock_compile")
        return value if isinstance(value, (int, float)) and value == value else float("-inf")

    out = []
    for budget, why, done in decided:
        better = [
            (o, odone)
            for o, _, odone in decided
            if o is not budget
            and odone is not None
            and speed(odone) > speed(done)
            and speed(odone) > 0
            and allowed_under(budget, o, odone)
        ]
        if not better:
            out.append((budget, why, done))
            continue
        other, odone = max(better, key=lambda b: speed(b[1]))
        mine = (
            "no preset"
            if done is None
            else f"its own choice, {done['config']} ({done['precision']}), at {speed(done):.3g}x"
        )
        moved_why = (
            f"{budget.name} budget as the {other.name} budget, which allows less error: {odone['config']} "
            f"({odone['precision']}) at {speed(odone):.3g}x over stock torch.compile beats {mine}; "
            f"{other.name}: {odone['decision']}"
        )
        moved = {
            **odone,
            "budget": budget.name,
            "decision": moved_why,
            "accuracy_why": f"judged under the {other.name} budget: {odone['accuracy_why']}",
        }
        out.append((budget, moved_why, moved))
    return out


def accuracy_fields(budget: AccuracyBudget, state: CellAccuracy) -> dict[str, Any]:
    j = state.judgements[budget.name]
    return {
        "budget": budget.name,
        "accuracy_rule": j.rule,
        "accuracy_decision": j.decision,
        "accuracy_why": j.why,
        "weights": state.figures.weights,
    }


def finish(
    entry: dict[str, Any],
    budget: AccuracyBudget,
    state: CellAccuracy,
    user: StockUser | None,
    rows: Rows,
    candidates: int,
) -> dict[str, Any]:
    """A decided entry with its budget's judgement and its figures against the stock user."""
    out = {**entry, **accuracy_fields(budget, state), **stock_figures(entry, user, rows)}
    out["candidates"] = candidates
    return out


def stock_figures(entry: dict[str, Any], user: StockUser | None, rows: Rows) -> dict[str, Any]:
    """A preset's speedup over stock eager and over stock torch.compile, with intervals."""
    if user is None:
        return {"vs_stock_from": "no stock user timed: the stock config's confirmation did not run or failed"}
    out: dict[str, Any] = {
        "stock_eager_ms": user.row.get("eager_ms"),
        "stock_compile_config": user.compile_config,
        "stock_compile_ms": user.compile_ms,
        "stock_max_rel_err": user.error,
    }
    found = samples(entry, rows)
    if found is None:
        return out | {"vs_stock_from": "the preset's samples were not found"}
    for key, side in (("vs_stock_eager", "eager"), ("vs_stock_compile", user.compile_side)):
        iv = versus(user, side, found)
        values = zip((key, f"{key}_ci_low", f"{key}_ci_high"), (iv.estimate, iv.low, iv.high), strict=True)
        out.update({k: None if math.isnan(v) else v for k, v in values})
    row, side = found
    if beside(user, found):
        out["vs_stock_from"] = (
            f"paired: the stock user's {user.compile_config} and eager beside the preset in the "
            f"{row.get('repeats')} processes of job {row['job_id']}"
        )
    else:
        scope = "paired" if row is user.row else "unpaired"
        out["vs_stock_from"] = (
            f"{scope}: the stock user in job {user.row['job_id']} ({user.row.get('repeats')} processes), the "
            f"preset's {side} side in job {row['job_id']} ({row.get('repeats')} processes)"
        )
    out["max_rel_err"] = row.get("eager_fp64_max_rel_err" if side == "eager" else "fp64_max_rel_err")
    return out


def summary_row(entry: dict[str, Any]) -> dict[str, Any]:
    """One cell and budget of the deployed summary (`deployed.json`)."""
    cell = f"{entry['hardware']}/{entry['model']}/bs{entry['batch_size']}/{entry['dtype']}"
    finite = {
        k: (v if isinstance(v, (int, float)) and math.isfinite(v) else None)
        for k, v in entry.items()
        if k.startswith("vs_stock") and not k.endswith("_from")
    }
    return {
        "cell": cell,
        "device_name": entry.get("device_name"),
        "budget": entry.get("budget"),
        "preset": entry["config"],
        "policy": entry.get("precision"),
        "vs_stock_eager": finite.get("vs_stock_eager"),
        "vs_stock_eager_ci": [finite.get("vs_stock_eager_ci_low"), finite.get("vs_stock_eager_ci_high")],
        "vs_stock_compile": finite.get("vs_stock_compile"),
        "vs_stock_compile_ci": [
            finite.get("vs_stock_compile_ci_low"),
            finite.get("vs_stock_compile_ci_high"),
        ],
        "stock_compile_config": entry.get("stock_compile_config"),
        "within_precision": entry.get("speedup_vs_stock"),
        "max_rel_err": entry.get("max_rel_err"),
        "stock_max_rel_err": entry.get("stock_max_rel_err"),
        "accuracy_decision": entry.get("accuracy_decision"),
        "weights": entry.get("weights"),
        "source": entry.get("source"),
    }


def geomean(values: list[float | None]) -> float | None:
    ok = [v for v in values if v is not None and v > 0 and math.isfinite(v)]
    return math.exp(sum(math.log(v) for v in ok) / len(ok)) if ok else None


def summary(entries: list[dict[str, Any]]) -> dict[str, Any]:
    """`deployed.json`: the hardware, the stack, every (cell, budget) and per budget its geometric
    means over stock eager and stock `torch.compile`, and the cells below 1."""
    first = entries[0] if entries else {}
    cells = [summary_row(e) for e in entries]
    budgets: dict[str, Any] = {}
    for name in dict.fromkeys(c["budget"] for c in cells):
        mine = [c for c in cells if c["budget"] == name]
        budgets[str(name)] = {
            "cells": len(mine),
            "geomean_vs_stock_compile": geomean([c["vs_stock_compile"] for c in mine]),
            "geomean_vs_stock_eager": geomean([c["vs_stock_eager"] for c in mine]),
            "below_1": [c["cell"] for c in mine if (c["vs_stock_compile"] or 0) < 1],
            "undetermined": [c["cell"] for c in mine if c["accuracy_decision"] == "undetermined"],
        }
    return {
        "gpu": first.get("device_name"),
        "torch": first.get("torch_version"),
        "budgets": budgets,
        "cells": cells,
    }
