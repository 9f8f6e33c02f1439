"""Stage 5 of a tune, the decision, on the confirmation's rows (`orchestrator.tune.search`). Its
rules, per cell and accuracy budget:

1. In the cell's own precision a candidate becomes the preset only where the 95% interval of
   stock / candidate lies above 1 (`within_precision`, paired where the two shared their
   processes), else the stock config stays; whichever stays becomes eager where the same
   processes timed eager faster. This is every budget's fallback (`decide_own`).
2. In another precision P a budget picked, the faster of P's confirmed configs (its fastest
   candidate and its fastest stock mode) whose interval over the stock user lies above 1, eager in
   P where that is faster still and fits the budget (`decide_other`).

`decide_cell` hands these choices, with the stock user (`orchestrator.tune.stock_user`), to the
deployment (`orchestrator.tune.deployed`), which picks what each budget serves."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from analysis.stock import StockUser
from compiler import statistics as cstats
from compiler.accuracy import AccuracyBudget
from orchestrator.tune import eager
from orchestrator.tune.cells import Cell, CellRun, Choices, PrecisionJobs, Rows, figures_of, stock_mode
from orchestrator.tune.presets import Limits, eligible, preset_entry
from orchestrator.tune.space import Candidate
from orchestrator.tune.stock_user import stock_user, versus


def decide_cell(
    run: CellRun,
    budgets: tuple[AccuracyBudget, ...],
    rows2: Rows,
    limits: Limits,
    eager_presets: bool,
    stock_names: set[str],
) -> Choices:
    """Per budget, the cell's choices from its confirmation rows (`rows2`): another precision's
    (`decide_other`) where the budget picked one, and the cell's own precision's (`decide_own`),
    every budget's fallback; with the stock user they are weighed against (`stock_user`)."""
    assert run.state is not None and run.picks is not None
    state, cell, log = run.state, run.cell, run.log
    mine = {
        j.job_id: rows2[j.job_id] for jobs in run.confirm.values() for j in jobs.jobs() if j.job_id in rows2
    }
    rung1 = {c.key: r for c, r in run.rung1}
    log["confirm"] = {
        j.name: figures_of(mine.get(j.job_id), limits) for p in run.confirm.values() for j in p.jobs()
    }
    own_jobs = run.confirm.get(cell.dtype)
    if own_jobs is None:
        own, own_why = None, "no candidate passed its accuracy check within the budgets"
    else:
        own, own_why = decide_own(cell, own_jobs, rung1, mine, limits, log, eager_presets, stock_names)
    timed_by = (own_jobs.mode or own_jobs.pair) if own_jobs else None  # the stock user's processes
    stock_row = mine.get(timed_by.job_id) if timed_by else None
    log["stock_user"] = {}
    user, stock = stock_user(stock_row, rung1, cell.dtype, stock_names, log["stock_user"], eager_presets)
    candidates = sum(1 for _, r in run.measured if r is not None and r.get("status") == "ok")
    log["budgets"] = {}
    options: dict[str, list[tuple[dict[str, Any] | None, str]]] = {}
    for budget in budgets:
        blog: dict[str, Any] = {}
        found = []
        pick = run.picks.budgets.get(budget.name)
        if pick is not None:

            def veto(row, b=budget.name):
                if not eager_presets:
                    return "eager presets are off (--no-eager)"
                return state.why_not(b, row, "eager")

            found.append(decide_other(cell, run.confirm[pick.policy], rung1, mine, user, blog, veto))
        found.append((own, own_why))
        log["budgets"][budget.name] = blog
        options[budget.name] = found
    missing = None if own is not None else _missing(cell, log)
    return Choices(options, user, stock, mine, candidates, missing)


def _missing(cell: Cell, log: dict[str, Any]) -> dict[str, Any]:
    """A cell without a preset in its own precision, and its candidates' statuses (or the limit
    each broke)."""
    return {
        "hardware": cell.hardware,
        "model": cell.model.name,
        "batch_size": cell.batch_size,
        "dtype": cell.dtype,
        "statuses": {k: v.get("over_budget") or v["status"] for k, v in log.get("candidates", {}).items()},
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
    """`within_precision` in the cell's own precision: its fastest other candidate against the stock
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
    return within_precision(cell, results, confirmation, limits, log, eager_presets)


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


def _rows_of(jobs: PrecisionJobs, rows2: Rows) -> dict[str, dict[str, Any] | None]:
    return {
        k: rows2.get(j.job_id) if j else None
        for k, j in (("pair", jobs.pair), ("candidate", jobs.candidate), ("mode", jobs.mode))
    }


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
    base = row if side == "compiled" else rung1.get(cand.key) or row
    entry = preset_entry(base, own, source="tuned")
    ms = row[f"{side}_ms"]
    entry.update(config=cand.config.name, job_id=row["job_id"], compiled_ms=ms, eager_ms=row.get("eager_ms"))
    entry["speedup_vs_eager"] = row["eager_ms"] / ms if row.get("eager_ms") else None
    if side != "compiled":
        entry["compile_s"] = base.get("compile_s")
    return entry


def within_precision(
    cell: Cell,
    rung1: list[tuple[Candidate, dict[str, Any] | None]],
    confirmation: tuple[Candidate, Candidate, dict[str, Any] | None] | None,
    limits: Limits,
    log: dict[str, Any] | None = None,
    eager_presets: bool = True,
    eager_veto: Any = None,
) -> tuple[dict[str, Any] | None, str]:
    """The cell's preset entry (None: nothing eligible) and the decision in words.

    `confirmation` is (candidate, stock, row of their same-process job, None) where one ran, or
    (candidate, stock, candidate's row, stock's row) for configs that differ in a runtime setting,
    which were timed in processes of their own (an unpaired interval). The compiled preset chosen
    becomes eager where the row its figures come from shows eager faster (`eager.reconsider`,
    unless not `eager_presets`, or `eager_veto(row)` gives a reason why eager of that row may not
    be the preset, such as its error over an accuracy budget; the check goes into
    `log["eager_check"]`).

    The steps: the fastest eligible stock config and other candidate of rung 1 (`best_pair`); with
    only one side, that side (`_uncontested`); a confirmation that cannot judge keeps the stock
    config (`_unconfirmed`); else the confirmation's interval decides (`_confirmed`)."""

    def reconsider(entry, why, row, side, stock=None):
        veto = None if eager_presets else "eager presets are off (--no-eager)"
        if veto is None and eager_veto is not None:
            veto = eager_veto(row)
        return eager.reconsider(entry, why, row, side, cell.dtype, stock, log, veto)

    stock, tuned, n = best_pair(rung1, limits)
    if stock is None and tuned is None:
        return None, "no candidate passed its accuracy check within the budgets"
    if stock is None or tuned is None:
        return reconsider(*_uncontested(cell, stock, tuned, n), "compiled")
    row, apart = _confirmation_rows(confirmation)
    why = _unconfirmed(stock[0], tuned[0], row, apart)
    if why is not None:
        entry = preset_entry(stock[1], cell.dtype, source="stock", decision=why, **_stock_fields(stock, n))
        return reconsider(entry, why, stock[1], "compiled")
    return _confirmed(cell, stock, tuned, n, row, apart, reconsider, log)


Ranked = tuple[Candidate, dict[str, Any]]
"""A candidate and its row."""


def best_pair(
    results: list[tuple[Candidate, dict[str, Any] | None]], limits: Limits
) -> tuple[tuple[Candidate, dict[str, Any]] | None, tuple[Candidate, dict[str, Any]] | None, int]:
    """(fastest eligible stock config, fastest eligible other candidate, how many were eligible),
    each as (candidate, row); None where there is none."""
    ok = [(c, r) for c, r in results if r is not None and eligible(r, limits)]

    def fastest(stock: bool):
        return min(
            (cr for cr in ok if cr[0].stock == stock), key=lambda cr: cr[1]["compiled_ms"], default=None
        )

    return fastest(True), fastest(False), len(ok)


def _stock_fields(stock: Ranked, n: int) -> dict[str, Any]:
    """What a stock preset chosen without a confirmation's figures says of the stock config."""
    s_cand, s_row = stock
    return {"stock_config": s_cand.config.name, "stock_ms": s_row["compiled_ms"], "candidates": n}


def _uncontested(
    cell: Cell, stock: Ranked | None, tuned: Ranked | None, n: int
) -> tuple[dict[str, Any], str, dict[str, Any]]:
    """(entry, why, its row) where rung 1 left one side eligible: the fastest other candidate where
    no stock config was, else the fastest stock config; no confirmation to weigh."""
    if stock is None:
        assert tuned is not None
        c, r = tuned
        why = f"no stock config was eligible; {c.config.name} ({c.dtype}) is the fastest of {n} eligible"
        return preset_entry(r, cell.dtype, source="tuned", decision=why, candidates=n), why, r
    why = f"stock: no other candidate was eligible in rung 1 ({n} eligible)"
    entry = preset_entry(stock[1], cell.dtype, source="stock", decision=why, **_stock_fields(stock, n))
    return entry, why, stock[1]


def _confirmation_rows(
    confirmation: tuple[Candidate, Candidate, dict[str, Any] | None] | None,
) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
    """(the candidate's or the pair's row, the stock config's row where it ran apart) of `decide`'s
    `confirmation`."""
    row = confirmation[2] if confirmation else None
    apart = confirmation[3] if confirmation and len(confirmation) > 3 else None
    return row, apart


def _unconfirmed(
    s_cand: Candidate, c: Candidate, row: dict[str, Any] | None, apart: dict[str, Any] | None
) -> str | None:
    """Why the confirmation of `c` against the stock config `s_cand` cannot judge them (not run, a
    job not ok, a paired job without the stock side's samples), in words; None where it can."""
    failed = next(
        (x for x in (row, apart) if x is not None and x["status"] != "ok"),
        None,
    )
    if not (row is None or failed or (apart is None and not row.get("baseline_samples_ms"))):
        return None
    bad = failed or row
    status = "not run" if bad is None else f"{bad['status']}: {(bad.get('error') or '')[:200]}"
    return f"stock: the confirmation of {c.config.name} against {s_cand.config.name} failed ({status})"


def _confirmed(
    cell: Cell,
    stock: Ranked,
    tuned: Ranked,
    n: int,
    row: dict[str, Any],
    apart: dict[str, Any] | None,
    reconsider: Callable[..., tuple[dict[str, Any] | None, str]],
    log: dict[str, Any] | None = None,
) -> tuple[dict[str, Any] | None, str]:
    """The preset where the confirmation ran: the candidate where its interval of stock / candidate
    lies above 1 (`cstats.beats`), else the stock config, timed beside it (the refused estimate
    noted in `log`: `note_refused`)."""
    (s_cand, s_row), (c, r) = stock, tuned
    iv, stock_ms, how, stock_side, scope = _interval(row, apart)
    figures = (
        f"{c.config.name} ({c.dtype}) vs {s_cand.config.name}: {iv.estimate:.3f}x "
        f"[{iv.low:.3f}, {iv.high:.3f}] over {iv.processes} {how}"
    )
    paired = {
        "stock_config": s_cand.config.name,
        "stock_ms": stock_ms,
        "speedup_vs_stock": iv.estimate,
        "speedup_vs_stock_ci_low": iv.low,
        "speedup_vs_stock_ci_high": iv.high,
        "speedup_vs_stock_from": scope,
        "candidates": n,
    }
    best_stock = (s_cand.config.name, *stock_side)
    if cstats.beats(iv):
        why = f"tuned: {figures}"
        # latency from the paired job; compile time and memory from the candidate's own job (in the
        # paired one it compiled second, in a process that had compiled already)
        own = {"compile_s": r["compile_s"], "peak_mem_bytes": r.get("peak_mem_bytes")}
        entry = preset_entry(row, cell.dtype, source="tuned", decision=why, **paired, **own)
        return reconsider(entry, why, row, "compiled", best_stock)
    why = f"stock: {figures}, an interval that does not lie above 1"
    note_refused(log, iv.estimate)
    entry = preset_entry(s_row, cell.dtype, source="stock", decision=why, **paired)
    entry["compiled_ms"] = stock_ms  # the stock side, measured with the candidate
    entry["speedup_vs_stock"] = 1.0
    entry["speedup_vs_stock_ci_low"] = entry["speedup_vs_stock_ci_high"] = None
    entry["speedup_vs_stock_from"] = None
    return reconsider(entry, why, *stock_side, best_stock)


def note_refused(log: dict[str, Any] | None, estimate: float) -> None:
    """Note in a decision's `log` the estimate of a speedup refused for its interval: where one is
    large enough, the tune extends the confirmation (`orchestrator.tune.search.run_extend`)."""
    if log is not None:
        log.setdefault("refused", []).append(round(float(estimate), 4))


def _interval(
    row: dict[str, Any], apart: dict[str, Any] | None
) -> tuple[Any, float, str, tuple[dict[str, Any], str], str]:
    """(interval of stock / candidate, the stock side's ms, how it was timed, (the stock side's row,
    its side), the scope in words) of a confirmation: paired where both ran in the same processes
    (`row` holds both), else unpaired between `apart` (the stock config's) and `row`."""
    if apart is None:
        iv = cstats.paired_speedup(
            row["baseline_samples_ms"], row["compiled_samples_ms"], row["samples_per_repeat"]
        )
        scope = f"paired: both interleaved in the same {iv.processes} processes (job {row['job_id']})"
        return iv, row["baseline_ms"], "processes", (row, "baseline"), scope
    # a runtime setting differs: never timed in one process (compiler.runtime)
    iv = cstats.ratio_interval(
        cstats.row_groups(apart, "compiled"),
        cstats.row_groups(row, "compiled"),
        paired=False,
    )
    how = "processes each, apart (they differ in a runtime setting)"
    scope = f"unpaired: jobs {apart['job_id']} and {row['job_id']} (they differ in a runtime setting)"
    return iv, apart["compiled_ms"], how, (apart, "compiled"), scope


def doubted_cell(
    run: CellRun, confirmed: dict[str, dict[str, Any]], thresholds: cstats.Thresholds
) -> tuple[dict[str, Any], str] | None:
    """Where a confirmation row of the cell has a doubted timing (`compiler.statistics.timing_doubts`,
    after any extension pooled more processes into it): the cell's `no_preset` entry, undecided,
    with each doubted job's reasons, and those reasons as one clause for its decision line; None
    where every timing is trusted."""
    rows = {j.name: confirmed.get(j.job_id) for p in run.confirm.values() for j in p.jobs()}
    doubts = {name: cstats.timing_doubts(r, thresholds) for name, r in rows.items() if r is not None}
    doubts = {name: d for name, d in doubts.items() if d}
    if not doubts:
        return None
    cell = run.cell
    entry = {
        "hardware": cell.hardware,
        "model": cell.model.name,
        "batch_size": cell.batch_size,
        "dtype": cell.dtype,
        "undecided": cstats.UNDECIDED,
        "statuses": {name: cstats.doubted_status(d) for name, d in doubts.items()},
    }
    return entry, "; ".join(f"{name} {cstats.doubt_text(d)}" for name, d in doubts.items())
