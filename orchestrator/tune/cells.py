"""A tune's cells and the rules that judge their candidates from rows: which go on to rung 1,
which knobs are turned together, and which config becomes the cell's preset
(`orchestrator.tune.search` runs the rounds)."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from compiler import statistics as cstats
from compiler.job import Job, ModelSpec
from orchestrator.tune import eager
from orchestrator.tune.presets import Limits, eligible, preset_entry
from orchestrator.tune.space import KNOB_NAMES, Candidate, with_knobs
from store.location_forms import StorageError
from store.storage import Location
from workers.runner import plural


@dataclass(frozen=True)
class Cell:
    hardware: str
    device: str
    model: ModelSpec
    batch_size: int
    dtype: str

    @property
    def name(self) -> str:
        return f"{self.hardware}/{self.model.name}/bs{self.batch_size}/{self.dtype}"

    def __hash__(self) -> int:  # the model's overrides are a dict; its name is unique in a sweep
        return hash(self.name)


class RowsLost(StorageError):
    """A round's sweep ended but some of its jobs have no row in the round's folder: something
    outside the tune removed it or put an older copy in its place while the tune ran. Deciding
    without those rows would turn a lost stock row into a preset no confirmation measured (a stock
    config missing from rung 1 is not one that failed), so the tune stops before deciding."""


def check_rows_kept(
    round_name: str, where: Location, jobs: list[Job], rows: dict[str, Any], resume: str
) -> None:
    """Raise `RowsLost` where a job of the round that just ran has no row in `rows` (read back from
    `where`, the round's folder, after its sweep)."""
    lost = [j for j in jobs if j.job_id not in rows]
    if not lost:
        return
    names = ", ".join(j.name for j in lost[:3]) + (", ..." if len(lost) > 3 else "")
    raise RowsLost(
        f"tune {round_name}: {where} holds no row for {plural(len(lost), 'job')} of the "
        f"{len(jobs)} that ran ({names}): the folder was removed or replaced while the tune ran "
        f"(a copy put back over it?). Nothing was decided; `{resume}` measures them again."
    )


def figures_of(row: dict[str, Any] | None, limits: Limits) -> dict[str, Any]:
    """What tune.json keeps of a candidate's row: its figures, its error, or what budget it broke
    (a job without a row reads `missing`)."""
    if row is None:
        return {"status": "missing"}
    keep = ("status", "compiled_ms", "eager_ms", "compile_s", "peak_mem_bytes", "speedup_vs_baseline")
    figures = {k: row.get(k) for k in keep if row.get(k) is not None}
    excess = limits.excess(row) if row["status"] == "ok" else None
    if row["status"] != "ok":
        figures["error"] = (row.get("error") or "")[:300]
    elif excess:
        figures["over_budget"] = excess
    return figures


def promote(
    results: list[tuple[Candidate, dict[str, Any] | None]], eta: int, limits: Limits
) -> list[Candidate]:
    """The candidates of one cell that go on to rung 1: the fastest ceil(n / eta) eligible ones
    (n: every candidate, failed ones included), and the fastest eligible stock config and the
    fastest eligible other one, so the confirmation always has both sides (rung 0's one short
    process ranks; it cannot tell a 2% difference from noise)."""
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


def decide(
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
