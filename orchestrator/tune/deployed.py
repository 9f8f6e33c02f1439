"""What a tune deploys per cell and accuracy budget, and what that gains over a stock PyTorch user.

A stock user runs the model in its own dtype under torch's defaults, eagerly or with plain
`torch.compile(model)` in its best stock mode. The confirmation round times that user in processes
of its own (`plan`: the cell's fastest stock config, with the other stock mode in the same
processes, and eager beside them), and every precision a budget chose (`orchestrator.tune.budgets`):

1. In the cell's own precision, `cells.decide` keeps a tuned candidate only where it beats the
   stock config (the paired or unpaired interval above 1), and eager where eager beats the choice:
   every budget's fallback.
2. In another precision P, the same rule chooses among P's candidates (its fastest stock mode is
   the baseline; eager in P where it fits the budget). That choice is deployed only where it beats
   the stock user (the faster of stock `torch.compile` and stock eager, by the same rule, unpaired):
   a preset never serves something that measured slower than doing nothing.

Every preset then carries its budget, the accuracy judgement, its error against fp64 beside the
stock policy's, and its speedup over stock eager and over stock `torch.compile` with intervals
(`speedup_vs_stock`: the within-precision part, against the best stock mode of its own precision).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from analysis.stock import StockUser
from compiler import statistics as cstats
from compiler.accuracy import AccuracyBudget
from compiler.job import Job
from orchestrator.tune.budgets import CellAccuracy, Pick, Picks, stock_mode
from orchestrator.tune.cells import Cell, decide, note_refused
from orchestrator.tune.presets import Limits
from orchestrator.tune.space import Candidate

MakeJob = Callable[[Candidate, Candidate | None], Job]


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


def _same_runtime(a: Candidate, b: Candidate) -> bool:
    return a.config.runtime == b.config.runtime


def plan(picks: Picks, make: MakeJob) -> dict[str, PrecisionJobs]:
    """Per precision, the confirmation jobs of a cell's picks. The stock user (the stock config
    and eager under torch's defaults) is timed in processes of its own, with the other stock mode
    beside it where their runtime settings are equal; where the sweep has one stock mode and the
    own precision's candidate is timed beside the stock config, those processes time the stock
    user. A process keeps its first cuDNN plan per convolution (its key holds shapes, dtype, layout,
    `deterministic` and `allow_tf32`, not the benchmark flag), so configs whose runtime settings
    differ never share one."""
    found: dict[str, PrecisionJobs] = {}
    if picks.own is not None:
        own = picks.own
        jobs = PrecisionJobs(own)
        paired = own.candidate is not None and own.mode is not None and _same_runtime(own.candidate, own.mode)
        if own.mode is not None:
            second = picks.second if picks.second and _same_runtime(picks.second, own.mode) else None
            if second is not None or not paired:  # else the pair's processes time the stock user too
                jobs.mode = make(own.mode, second)
        if own.candidate is not None:
            if own.mode is not None and _same_runtime(own.candidate, own.mode):
                jobs.pair = make(own.candidate, own.mode)
            else:
                jobs.candidate = make(own.candidate, None)
        found[own.policy] = jobs
    for pick in picks.budgets.values():
        if pick.policy in found:
            continue
        jobs = PrecisionJobs(pick)
        if pick.candidate is not None and pick.mode is not None and _same_runtime(pick.candidate, pick.mode):
            jobs.pair = make(pick.candidate, pick.mode)
        else:
            jobs.candidate = make(pick.candidate, None) if pick.candidate is not None else None
            jobs.mode = make(pick.mode, None) if pick.mode is not None else None
        found[pick.policy] = jobs
    return found


Rows = dict[str, dict[str, Any]]
"""Rows by job id."""


def stock_user(
    row: dict[str, Any] | None,
    rung1: dict[tuple[str, str], dict[str, Any] | None],
    own: str,
    stock_names: set[str],
    log: dict[str, Any] | None = None,
    eager_presets: bool = True,
) -> tuple[StockUser, dict[str, Any]] | tuple[None, None]:
    """The stock user of a cell from the row of the job that timed it, and the preset that is the
    stock user's own choice: the faster of the stock modes timed there (their medians, in the same
    processes), or eager where it beat that by the project's rule (`eager.reconsider`) and eager
    presets are on (`--no-eager` keeps the stock user's torch.compile). None where the job did not
    run or failed."""
    from orchestrator.tune import eager
    from orchestrator.tune.presets import preset_entry

    if (
        row is None
        or row.get("status") != "ok"
        or not row.get("compiled_samples_ms")
        or row.get("dtype") != own
    ):
        return None, None
    sides = [("compiled", row["config"])] if row["config"] in stock_names else []
    if (
        row.get("baseline_config") in stock_names
        and row.get("baseline_dtype") == own
        and row.get("baseline_samples_ms")
    ):
        sides.append(("baseline", row["baseline_config"]))
    if not sides:
        return None, None
    side, config = min(sides, key=lambda s: row[f"{s[0]}_ms"])
    source = row if side == "compiled" else rung1.get((config, own)) or row
    why = f"stock: a stock user's torch.compile, the faster stock mode in job {row['job_id']}"
    entry = preset_entry(
        source, own, source="stock", decision=why, stock_config=config, stock_ms=row[f"{side}_ms"]
    )
    entry.update(
        config=config, job_id=row["job_id"], compiled_ms=row[f"{side}_ms"], eager_ms=row.get("eager_ms")
    )
    entry["speedup_vs_eager"] = row["eager_ms"] / row[f"{side}_ms"] if row.get("eager_ms") else None
    entry["speedup_vs_stock"] = 1.0
    veto = None if eager_presets else "eager presets are off (--no-eager)"
    entry, why = eager.reconsider(entry, why, row, side, own, log=log, veto=veto)
    choice = "eager" if entry["source"] == "eager" else "compile"
    return StockUser(row, side, choice), {**entry, "decision": why}


def same_choice(entry: dict[str, Any], stock: dict[str, Any]) -> bool:
    """Whether a decided preset is the stock user's own choice."""
    return entry["config"] == stock["config"] and entry["precision"] == stock["precision"]


def _rows_of(jobs: PrecisionJobs, rows2: Rows) -> dict[str, dict[str, Any] | None]:
    return {
        k: rows2.get(j.job_id) if j else None
        for k, j in (("pair", jobs.pair), ("candidate", jobs.candidate), ("mode", jobs.mode))
    }


def decide_own(
    cell: Cell,
    jobs: PrecisionJobs,
    rung1: dict[tuple[str, str], dict[str, Any] | None],
    rows2: Rows,
    limits: Limits,
    log: dict[str, Any],
    eager_presets: bool,
    stock_names: set[str],
) -> tuple[dict[str, Any] | None, str]:
    """`cells.decide` in the cell's own precision: its fastest other candidate against the stock
    config, with the confirmation's rows (a side timed alone stands in for its rung-1 row)."""
    pick = jobs.pick
    got = _rows_of(jobs, rows2)
    results = []
    for cand, alone in ((pick.mode, got["mode"]), (pick.candidate, got["candidate"])):
        if cand is not None:
            row = alone if alone is not None and alone.get("status") == "ok" else rung1.get(cand.key)
            results.append((dataclasses.replace(cand, stock=stock_mode(cand, stock_names)), row))
    confirmation = None
    if pick.candidate is not None and pick.mode is not None:
        first = got["pair"] if jobs.pair is not None else got["candidate"]
        apart = None if jobs.pair is not None else got["mode"]
        confirmation = (pick.candidate, dataclasses.replace(pick.mode, stock=True), first, apart)
    return decide(cell, results, confirmation, limits, log, eager_presets)


def _sides(
    jobs: PrecisionJobs, got: dict[str, dict[str, Any] | None]
) -> list[tuple[Candidate, dict[str, Any], str]]:
    """The confirmed configs of a precision: (candidate, its row, the side its samples are)."""
    pick, pair = jobs.pick, got["pair"]
    if jobs.pair is not None:
        if pair is None or pair.get("status") != "ok":
            return []
        return [(pick.candidate, pair, "compiled"), (pick.mode, pair, "baseline")]  # type: ignore[list-item]
    found = []
    for cand, key in ((pick.candidate, "candidate"), (pick.mode, "mode")):
        row = got[key]
        if (
            cand is not None
            and row is not None
            and row.get("status") == "ok"
            and row.get("compiled_samples_ms")
        ):
            found.append((cand, row, "compiled"))
    return found


def entry_of(
    cand: Candidate,
    row: dict[str, Any],
    side: str,
    own: str,
    rung1: dict[tuple[str, str], dict[str, Any] | None],
) -> dict[str, Any]:
    """A preset entry for `cand`, its figures from `side` of a confirmation row (its compile settings
    from its own row where it was the baseline side)."""
    from orchestrator.tune.presets import preset_entry

    base = row if side == "compiled" else rung1.get(cand.key) or row
    entry = preset_entry(base, own, source="tuned")
    ms = row[f"{side}_ms"]
    entry.update(config=cand.config.name, job_id=row["job_id"], compiled_ms=ms, eager_ms=row.get("eager_ms"))
    entry["speedup_vs_eager"] = row["eager_ms"] / ms if row.get("eager_ms") else None
    if side != "compiled":
        entry["compile_s"] = base.get("compile_s")
    return entry


def decide_other(
    cell: Cell,
    jobs: PrecisionJobs,
    rung1: dict[tuple[str, str], dict[str, Any] | None],
    rows2: Rows,
    user: StockUser | None,
    log: dict[str, Any],
    veto: Callable[[dict[str, Any]], str | None],
) -> tuple[dict[str, Any] | None, str]:
    """In another precision P than the cell's: of P's confirmed configs (its fastest candidate and
    its fastest stock mode, both are tuned configurations to a stock user), the faster of those
    whose interval over the stock user lies above 1; then eager in P where it is faster still and
    within the budget (`veto`). The within-precision figure (P's stock mode / it) is reported, not
    required. None where none beats the stock user."""
    from orchestrator.tune import eager

    policy = jobs.pick.policy
    sides = _sides(jobs, _rows_of(jobs, rows2))
    if user is None:
        return None, f"{policy}: no stock user was timed, so nothing shows a {policy} config faster"
    if not sides:
        return None, f"{policy}: its confirmation did not run or failed"
    passed, refused = [], []
    for cand, row, side in sides:
        iv = versus(user, user.side, (row, side))
        figures = f"{cand.config.name} ({policy}): {iv.estimate:.3f}x [{iv.low:.3f}, {iv.high:.3f}] over {user.label}"
        if cstats.beats(iv):
            passed.append((cand, row, side, figures))
        else:
            refused.append((cand, row, side, figures))
            note_refused(log, iv.estimate)
    if not passed:
        return None, "; ".join(f"{f}, an interval that does not lie above 1" for *_, f in refused)
    cand, row, side, figures = min(passed, key=lambda p: p[1][f"{p[2]}_ms"])
    entry = entry_of(cand, row, side, cell.dtype, rung1)
    mode = next(((c, r, s) for c, r, s in sides if c == jobs.pick.mode), None)
    if mode is not None:
        m_cand, m_row, m_side = mode
        iv = cstats.ratio_interval(
            cstats.row_groups(m_row, m_side), cstats.row_groups(row, side), paired=m_row is row
        )
        entry.update(
            stock_config=m_cand.config.name,
            stock_ms=m_row[f"{m_side}_ms"],
            speedup_vs_stock=iv.estimate,
            speedup_vs_stock_ci_low=iv.low,
            speedup_vs_stock_ci_high=iv.high,
            speedup_vs_stock_from=f"{'paired' if m_row is row else 'unpaired'}: {policy}'s stock mode "
            f"{m_cand.config.name} in job {m_row['job_id']}, {cand.config.name} in job {row['job_id']}",
        )
    why = f"{policy}: {figures}, the faster of the {policy} configs that beat the stock user"
    entry, why = eager.reconsider(entry, why, row, side, policy, None, log, veto(row))
    entry["dtype"] = cell.dtype
    return entry, why


def samples(entry: dict[str, Any], rows: Rows) -> tuple[dict[str, Any], str] | None:
    """The row and side whose samples a preset's latency is: its own job's row (the one its figures
    come from) where that timed it, else a confirmation row that did."""
    eager = entry["source"] == "eager"
    config = entry["eager_over_config"] if eager else entry["config"]

    def side(row: dict[str, Any]) -> str | None:
        if row.get("status") != "ok" or row.get("dtype") != entry["precision"]:
            return None
        if eager:
            return "eager" if row.get("config") == config or row.get("baseline_config") == config else None
        if row.get("config") == config:
            return "compiled"
        if row.get("baseline_config") == config and row.get("baseline_dtype") == entry["precision"]:
            return "baseline"
        return None

    own = rows.get(entry.get("job_id"))
    for row in [own] if own is not None else []:
        if (found := side(row)) is not None:
            return row, found
    for row in rows.values():
        if not eager and (found := side(row)) is not None:
            return row, found
    return None


def beside(user: StockUser, found: tuple[dict[str, Any], str]) -> bool:
    """Whether the preset's samples come from a job that timed the stock user's torch.compile (and
    eager, under the same torch defaults) beside it in the same processes."""
    row, preset_side = found
    return (
        row is not user.row
        and preset_side == "compiled"
        and row.get("baseline_config") == user.compile_config
        and row.get("baseline_dtype") == user.row.get("dtype") == row.get("dtype")
    )


def versus(user: StockUser, side: str, found: tuple[dict[str, Any], str]) -> cstats.Interval:
    """The stock user's `side` (eager or its compile) over the preset's samples: its speedup, paired
    where the two were timed in the same processes (the stock user's own job, or a job that timed
    the stock user's config beside the preset), else unpaired."""
    row, preset_side = found
    mine = cstats.row_groups(row, preset_side)
    if row is user.row and preset_side == side:  # the stock user itself
        return cstats.Interval(1.0, 1.0, 1.0, cstats.LEVEL, len(mine), math.inf, 0.0)
    if beside(user, found):
        return cstats.ratio_interval(
            cstats.row_groups(row, "eager" if side == "eager" else "baseline"), mine, paired=True
        )
    return cstats.ratio_interval(user.groups(side), mine, paired=row is user.row)


def gate(entry: dict[str, Any], user: StockUser | None, rows: Rows) -> tuple[bool, str]:
    """Whether a preset in another precision beats the stock user (its interval above 1)."""
    found = samples(entry, rows)
    if user is None or found is None:
        return False, "the stock user was not timed, so nothing shows it faster"
    iv = versus(user, user.side, found)
    figures = f"{iv.estimate:.3f}x [{iv.low:.3f}, {iv.high:.3f}] over {user.label}"
    return cstats.beats(iv), figures


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
