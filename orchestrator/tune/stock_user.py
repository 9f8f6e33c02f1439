"""The stock user of a tuned cell, read from the confirmation job that timed it (`stock_user`: the
faster of the stock modes timed there, or eager where eager beat them), and a preset's samples
against it (`samples`, `versus`: paired where the same processes timed both, else unpaired). The
decision weighs another precision against it (`orchestrator.tune.decide`); the deployment gates
every preset on it and states what each gains over it (`orchestrator.tune.deployed`). The stock
user itself is `analysis.stock.StockUser`, as a sweep's presets and reports read it."""

from __future__ import annotations

import math
from typing import Any

from analysis.stock import StockUser
from compiler import statistics as cstats
from orchestrator.tune import eager
from orchestrator.tune.presets import preset_entry


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


def samples(entry: dict[str, Any], rows: dict[str, dict[str, Any]]) -> tuple[dict[str, Any], str] | None:
    """The row and side whose samples a preset's latency is: its own job's row (the one its figures
    come from) where that timed it, else a confirmation row that did."""
    is_eager = entry["source"] == "eager"
    config = entry["eager_over_config"] if is_eager else entry["config"]

    def side(row: dict[str, Any]) -> str | None:
        if row.get("status") != "ok" or row.get("dtype") != entry["precision"]:
            return None
        if is_eager:
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
        if not is_eager and (found := side(row)) is not None:
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
