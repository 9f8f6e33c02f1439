"""The stages of a tune, per cell, each taking what the rounds measured and returning what the next
round measures (`orchestrator.tune.search` runs the rounds across the cluster):

1. rung 0 measured the bases (stock configs and added modes) in every precision the budgets allow:
   `judge` says whether the cell's outputs can judge precision, and which bases get the knobs;
2. the knobs round measured each knob on those bases: `promote` picks the survivors, and `rung1`
   what rung 1 measures of them (all of them where they are more than the confirmation times
   anyway, else only the knobs turned together, which no round measured);
3. `confirm` plans the confirmation: a stock user, and per precision chosen the fastest
   candidate against its stock mode, in fresh processes;
4. `decide` chooses per budget (`orchestrator.tune.deployed`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from compiler.accuracy import DETERMINED, AccuracyBudget
from orchestrator.tune import budgets as tb
from orchestrator.tune import deployed
from orchestrator.tune.cells import Cell, figures_of
from orchestrator.tune.presets import Limits
from orchestrator.tune.space import Candidate, knobs_on


@dataclass
class CellRun:
    """One cell through the stages."""

    cell: Cell
    space: list[Candidate]
    """Every candidate it may reach (`space.candidates`)."""
    state: tb.CellAccuracy | None = None
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
    run: CellRun, results0: tb.Results, budgets: tuple[AccuracyBudget, ...], limits: Limits
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


def promote(run: CellRun, knob_results: tb.Results, limits: Limits, eta: int, stock_names: set[str]) -> None:
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


def rung1(run: CellRun, limits: Limits, stock_names: set[str]) -> list[Candidate]:
    """What rung 1 measures of the cell: its survivors where they are more than the confirmation
    times anyway (rung 1 ranks them with the sweep's timed calls), else only those no round measured
    yet (the knobs that each helped, turned together), so they are ranked before the confirmation."""
    assert run.state is not None
    measured = {c.key for c, _ in run.measured}
    fresh = [c for c in run.survivors if c.key not in measured]
    picks = tb.picks(run.state, run.measured, limits, stock_names)
    timed = {picks.second, *(p.candidate for p in (picks.own, *picks.budgets.values()) if p)}
    timed |= {p.mode for p in (picks.own, *picks.budgets.values()) if p}
    if all(c in timed for c in run.survivors if c.key in measured):
        return fresh
    return list(run.survivors)


def rung1_results(run: CellRun, rows1: tb.Results) -> tb.Results:
    """The survivors' rows: rung 1's where it measured them, else the earlier rounds'."""
    again = {c.key: (c, r) for c, r in rows1}
    earlier = {c.key: (c, r) for c, r in run.measured}
    return [again.get(c.key) or earlier[c.key] for c in run.survivors if c.key in again or c.key in earlier]


def confirm(run: CellRun, results1: tb.Results, limits: Limits, stock_names: set[str], make) -> list:
    """After rung 1 (or straight from the knobs round): the confirmation's jobs of the cell."""
    assert run.state is not None
    run.rung1 = results1
    run.log["rung1"] = {f"{c.config.name}@{c.dtype}": figures_of(r, limits) for c, r in results1}
    keys = {c.key for c, _ in results1}
    stock = [(c, r) for c, r in run.measured if c.stock and c.key not in keys]  # both stock modes, always
    run.picks = tb.picks(run.state, [*results1, *stock], limits, stock_names)
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
        f"(its fastest stock config, the other stock mode and eager, torch's defaults; with one stock mode, in its "
        f"own precision's candidate's processes), and per precision chosen "
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
    budgets: tuple[AccuracyBudget, ...],
    rows2: dict[str, dict[str, Any]],
    limits: Limits,
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
        own, own_why = deployed.decide_own(
            cell, own_jobs, rung1, mine, limits, log, eager_presets, stock_names
        )
    timed_by = (own_jobs.mode or own_jobs.pair) if own_jobs else None  # the stock user's processes
    stock_row = mine.get(timed_by.job_id) if timed_by else None
    log["stock_user"] = {}
    user, stock = deployed.stock_user(
        stock_row, rung1, cell.dtype, stock_names, log["stock_user"], eager_presets
    )
    candidates = sum(1 for _, r in run.measured if r is not None and r.get("status") == "ok")
    log["budgets"] = {}
    decided: list[tuple[AccuracyBudget, str, dict[str, Any] | None]] = []
    for budget in budgets:
        blog: dict[str, Any] = {}
        options = []
        pick = run.picks.budgets.get(budget.name)
        if pick is not None:

            def veto(row, b=budget.name):
                if not eager_presets:
                    return "eager presets are off (--no-eager)"
                return state.why_not(b, row, "eager")

            options.append(
                deployed.decide_other(cell, run.confirm[pick.policy], rung1, mine, user, blog, veto)
            )
        options.append((own, own_why))
        entry, why = choose(options, user, stock, mine)
        log["budgets"][budget.name] = blog
        done = None
        if entry is not None:
            done = deployed.finish({**entry, "decision": why}, budget, state, user, mine, candidates)
        decided.append((budget, why, done))
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


def refused_gain(run: CellRun) -> float | None:
    """The largest speedup estimate the cell's decision refused because its interval did not lie
    above 1 (`cells.note_refused`), in its own precision or under any budget; None: none. The
    notes of its own precision are taken, so that a decision made again notes afresh."""
    found = list(run.log.pop("refused", []))
    for blog in (run.log.get("budgets") or {}).values():
        found += blog.get("refused", [])
    return max(found) if found else None


def looser_never_slower(
    decided: list[tuple[AccuracyBudget, str, dict[str, Any] | None]], state: tb.CellAccuracy
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


def choose(options, user, stock, rows) -> tuple[dict[str, Any] | None, str]:
    """Of `options` ((entry, why) per decided precision, the cell's own last), the fastest decided
    preset that is the stock user's own choice or beats it (`deployed.gate`); else the stock user's
    choice. Without a stock user timed, the last option (the cell's own precision) as decided. The
    decision says why each option not chosen was not deployed."""
    if user is None:
        return options[-1]
    passed, won = [], []
    for entry, why in options:
        if entry is None:
            passed.append(f"not deployed: {why}")
            continue
        if deployed.same_choice(entry, stock):
            won.append((entry, why))
            continue
        if entry.get("source") == "stock" and entry["precision"] == stock["precision"]:
            # another stock mode, preferred by other jobs' noise: the stock user's processes timed
            # its modes side by side, and a stock mode serves as the stock user's choice does
            won.append((stock, stock["decision"]))
            continue
        ok, figures = deployed.gate(entry, user, rows)
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
        + (
            "the stock user's own choice"
            if deployed.same_choice(e, stock)
            else "which beats the stock user too"
        )
        + f", is slower at {served_ms(e):.4g} ms"
        for e, _ in won
        if e is not entry and not deployed.same_choice(e, entry)
    ]
    return entry, "; ".join([*passed, *slower, why])


def served_ms(entry: dict[str, Any]) -> float:
    """A preset's median latency as served (eager's where it runs eager)."""
    ms = entry.get("eager_ms") if entry.get("source") == "eager" else entry.get("compiled_ms")
    return ms or math.inf


def tune_document(spec, opts, budgets, pruned, effects, won, jobs_run, log) -> dict[str, Any]:
    """tune.json: how the tune was asked for, what each setting gained, and every cell's log."""
    return {
        "format": 2,
        "sweep": spec.source,
        "argv": opts.sweep.argv,
        "budgets": opts.limits.to_dict(),
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
