"""The stages of a tune, per cell, each taking what the rounds measured and returning what the next
round measures (`orchestrator.tune.search` runs the rounds across the cluster):

1. rung 0 measured the bases (stock configs and added modes) in every precision the budgets allow:
   `judge` says whether the cell's outputs can judge precision, and which bases get the knobs;
2. the knobs round measured each knob on those bases: `promote` picks what rung 1 measures
   again (`needs_rung1`: unless that is just what the confirmation measures anyway);
3. `confirm` plans the confirmation: a stock user, and per precision chosen the fastest
   candidate against its stock mode, in fresh processes;
4. `decide` chooses per budget (`orchestrator.tune.deployed`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from compiler.accuracy import Budget
from orchestrator.tune import budgets as tb
from orchestrator.tune import deployed
from orchestrator.tune.cells import Cell, figures_of
from orchestrator.tune.presets import Budgets
from orchestrator.tune.space import Candidate, knobs_on


@dataclass
class CellRun:
    """One cell through the stages."""

    cell: Cell
    space: list[Candidate]
    """Every candidate it may reach (`space.candidates`)."""
    state: tb.CellBudgets | None = None
    measured: tb.Results = field(default_factory=list)
    """Rung 0 and the knobs round."""
    bases: list[Candidate] = field(default_factory=list)
    """The bases the knobs were turned on."""
    survivors: list[Candidate] = field(default_factory=list)
    rung1: tb.Results = field(default_factory=list)
    picks: tb.Picks | None = None
    confirm: dict[str, deployed.PrecisionJobs] = field(default_factory=dict)
    log: dict[str, Any] = field(default_factory=dict)


def judge(
    run: CellRun, results0: tb.Results, budgets: tuple[Budget, ...], limits: Budgets
) -> list[Candidate]:
    """After rung 0: the cell's judgement per budget; returns the knob candidates to measure."""
    run.measured = list(results0)
    run.state = tb.judge_cell(run.cell, results0, budgets)
    run.bases = tb.knob_bases(run.state, results0, limits)
    found: list[Candidate] = []
    for base in run.bases:
        found += [c for c in knobs_on(run.space, base) if c not in found]
    run.log["accuracy"] = run.state.log()
    return found


def promote(run: CellRun, knob_results: tb.Results, limits: Budgets, eta: int, stock_names: set[str]) -> None:
    """After the knobs round: what goes on to rung 1 (`budgets.promote`, and per knob base the knobs
    that each helped it, turned together)."""
    assert run.state is not None
    run.measured += knob_results
    run.survivors = tb.promote(run.state, run.measured, limits, eta, stock_names)
    for combined in tb.combinations(run.state, run.measured, limits, run.bases):
        if combined not in run.survivors:
            run.survivors.append(combined)
    run.log["candidates"] = {f"{c.config.name}@{c.dtype}": figures_of(r, limits) for c, r in run.measured}
    run.log["promoted"] = [f"{c.config.name}@{c.dtype}" for c in run.survivors]


def needs_rung1(run: CellRun) -> bool:
    """Whether rung 1 can tell the cell anything the confirmation will not: more than one stock
    config and one other survived, or a combination of knobs no round measured yet."""
    measured = {c.key for c, _ in run.measured}
    keep = run.survivors
    return len(keep) > 2 or len({c.stock for c in keep}) < 2 or any(c.key not in measured for c in keep)


def confirm(run: CellRun, results1: tb.Results, limits: Budgets, stock_names: set[str], make) -> list:
    """After rung 1 (or straight from the knobs round): the confirmation's jobs of the cell."""
    assert run.state is not None
    run.rung1 = results1
    run.log["rung1"] = {f"{c.config.name}@{c.dtype}": figures_of(r, limits) for c, r in results1}
    run.picks = tb.picks(run.state, results1, limits, stock_names)
    run.confirm = deployed.plan(run.picks, make)
    return [j for jobs in run.confirm.values() for j in jobs.jobs()]


def confirm_summary(runs, repeats: int) -> str:
    """What the confirmation round runs, for its progress line."""
    from workers.runner import plural

    runs = list(runs)
    precisions = [p for run in runs for p in run.confirm.values()]
    jobs = sum(len(p.jobs()) for p in precisions)
    paired = sum(1 for p in precisions if p.pair is not None)
    apart = sum(
        1 for p in precisions if p.pair is None and p.candidate is not None and p.pick.mode is not None
    )
    return (
        f"{plural(len(runs), 'cell')}, {plural(jobs, 'job')} of {repeats} processes each: per cell a stock user "
        f"(its fastest stock config, the other stock mode and eager, torch's defaults), and per precision chosen "
        f"the best candidate against its stock mode: in the same processes ({paired}), or apart, as they "
        f"differ in a runtime setting ({apart})"
    )


@dataclass
class Decision:
    entries: list[dict[str, Any]] = field(default_factory=list)
    missing: dict[str, Any] | None = None
    decisions: dict[str, str] = field(default_factory=dict)


def decide(
    run: CellRun,
    budgets: tuple[Budget, ...],
    rows2: dict[str, dict[str, Any]],
    limits: Budgets,
    eager_presets: bool,
    stock_names: set[str],
) -> Decision:
    """Per budget, the cell's preset (`orchestrator.tune.deployed`): its own precision's decision,
    or another precision's where that beats the stock user."""
    assert run.state is not None and run.picks is not None
    state, cell, log = run.state, run.cell, run.log
    mine = {
        j.job_id: rows2[j.job_id] for jobs in run.confirm.values() for j in jobs.jobs() if j.job_id in rows2
    }
    rung1 = {c.key: r for c, r in run.rung1}
    log["confirm"] = {
        j.name: figures_of(mine.get(j.job_id), limits) for p in run.confirm.values() for j in p.jobs()
    }
    found = Decision()
    own_jobs = run.confirm.get(cell.dtype)
    if own_jobs is None:
        own, own_why = None, "no candidate passed its accuracy check within the budgets"
    else:
        own, own_why = deployed.decide_precision(
            cell, own_jobs, rung1, mine, limits, log, eager_presets, stock_names
        )
    user = deployed.stock_user(mine.get(own_jobs.mode.job_id) if own_jobs and own_jobs.mode else None)
    candidates = sum(1 for _, r in run.measured if r is not None and r.get("status") == "ok")
    log["budgets"] = {}
    for budget in budgets:
        blog: dict[str, Any] = {}
        entry, why = own, own_why
        pick = run.picks.budgets.get(budget.name)
        if pick is not None and own is not None:
            other, other_why = deployed.decide_precision(
                cell,
                run.confirm[pick.policy],
                rung1,
                mine,
                limits,
                blog,
                eager_presets,
                stock_names,
                veto=lambda row, b=budget.name: state.why_not(b, row, "eager"),
            )
            if other is not None:
                ok, figures = deployed.gate(other, user, mine)
                if ok:
                    entry, why = other, f"{other_why}; against the stock user: {figures}"
                else:
                    why = (
                        f"{own_why}; {pick.policy} ({other['config']}) not deployed: {figures}, an interval "
                        "that does not lie above 1"
                    )
        name = cell.name if len(budgets) == 1 else f"{cell.name} ({budget.name} budget)"
        found.decisions[name] = why
        blog["decision"] = why
        log["budgets"][budget.name] = blog
        if entry is None:
            continue
        done = deployed.finish({**entry, "decision": why}, budget, state, user, mine, candidates)
        blog["preset"] = {
            k: done.get(k) for k in ("config", "precision", "source", "vs_stock_compile", "vs_stock_eager")
        }
        found.entries.append(done)
    first = log["budgets"][budgets[0].name]
    log["decision"] = first["decision"]
    if own is None:
        found.missing = {
            "hardware": cell.hardware,
            "model": cell.model.name,
            "batch_size": cell.batch_size,
            "dtype": cell.dtype,
            "statuses": {
                k: v.get("over_budget") or v["status"] for k, v in log.get("candidates", {}).items()
            },
        }
    return found


def tune_document(spec, opts, budgets, pruned, effects, won, jobs_run, log) -> dict[str, Any]:
    """tune.json: how the tune was asked for, what each setting gained, and every cell's log."""
    return {
        "format": 2,
        "sweep": spec.source,
        "argv": opts.argv,
        "budgets": opts.budgets.to_dict(),
        "accuracy": [b.name for b in budgets],
        "eta": opts.eta,
        "confirm_repeats": opts.confirm_repeats,
        "eager_presets": opts.eager_presets,
        "precisions": list(opts.precisions) if opts.precisions is not None else "as the budgets allow",
        "knobs": list(opts.knobs),
        "bases": list(opts.bases) if opts.bases is not None else "max-autotune modes on GPU classes",
        "pruned": pruned,
        "setting_effects": effects,
        "what_won": won,
        "jobs": jobs_run,
        "cells": log,
    }
