"""A stock PyTorch user of a cell, read from a sweep's result rows: the model in its own dtype under
torch's defaults (the stock precision policy, no runtime setting), run eagerly or with plain
`torch.compile(model)` in its faster stock mode (`default` or `reduce-overhead`). What every preset
and report states its gain against (`speedup_vs_stock_user`), beside the error against fp64.

A sweep times each config in jobs of its own, so a row's speedup over the stock user is unpaired
(`compiler.statistics.ratio_interval`), except against the same row. A tune confirms the stock
user in processes of its own instead (`orchestrator.tune.deployed`).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

from compiler import runtime
from compiler import statistics as cstats
from compiler.precision import STOCK

STOCK_MODES = (None, "default", "reduce-overhead")
"""What `torch.compile(model)` and `torch.compile(model, mode="reduce-overhead")` run with."""


def is_stock_row(row: dict[str, Any], own: str = STOCK) -> bool:
    """A row of plain torch.compile in a stock mode, in the cell's own precision, torch's defaults."""
    return (
        row.get("status") == "ok"
        and row.get("dtype") == own
        and row.get("backend") == "inductor"
        and row.get("mode") in STOCK_MODES
        and json.loads(row.get("options") or "{}") == {}
        and not row.get("fullgraph")
        and row.get("dynamic") is None
        and not row.get("freezing")
        and not row.get("channels_last")
        and not runtime.from_json(row.get("runtime"))
        and not row.get("baseline_config")
        and bool(row.get("compiled_ms"))
    )


@dataclass(frozen=True)
class StockUser:
    """A stock user of a cell, from one row: a sweep's fastest stock mode (`stock_user`), or a
    tune's confirmation job that timed the stock modes and eager in the same processes
    (`orchestrator.tune.stock_user.stock_user`)."""

    row: dict[str, Any]
    """The row of its torch.compile (median); its eager side is stock eager."""
    compile_side: str = "compiled"
    """The side of `row` its torch.compile is: `compiled`, or `baseline` (a tune's other stock mode,
    timed beside the stock config, where it was the faster)."""
    choice: str = "compile"
    """`eager` or `compile`: what the stock user would run (eager where it beat stock compile)."""
    reference: cstats.CellReference | None = None
    """A sweep's stock user: the cell's one eager reference (`compiler.statistics.cell_reference`,
    pooled over its jobs), which its stock eager is, as every speedup of the cell is over it; None
    for a tune's, whose eager was timed in the stock user's own processes."""

    @property
    def compile_config(self) -> str:
        return self.row["config" if self.compile_side == "compiled" else "baseline_config"]

    @property
    def compile_ms(self) -> float:
        return self.row[f"{self.compile_side}_ms"]

    @property
    def eager_ms(self) -> float | None:
        if self.reference is not None and self.reference.median_ms is not None:
            return self.reference.median_ms
        return self.row.get("eager_ms")

    @property
    def error(self) -> float | None:
        """The stock policy's eager error against fp64 on the cell."""
        return self.row.get("eager_fp64_max_rel_err")

    @property
    def side(self) -> str:
        """The side of `row` what it runs is: `eager`, or its torch.compile's."""
        return "eager" if self.choice == "eager" else self.compile_side

    @property
    def label(self) -> str:
        return "stock eager" if self.choice == "eager" else f"stock {self.compile_config}"

    def groups(self, side: str) -> list[list[float]]:
        """The samples of `row`'s `side`, per process (of the cell's reference for eager, where the
        user has one)."""
        if side == "eager" and self.reference is not None and self.reference.groups:
            return [list(g) for g in self.reference.groups]
        return cstats.row_groups(self.row, side)


def stock_user(rows: list[dict[str, Any]], own: str = STOCK) -> StockUser | None:
    """The stock user of one cell's rows, or None where no stock mode was timed there."""
    stock = [r for r in rows if is_stock_row(r, own)]
    if not stock:
        return None
    reference = cstats.cell_reference([r for r in rows if r.get("dtype") == own])
    return StockUser(min(stock, key=lambda r: r["compiled_ms"]), reference=reference)


def versus(user: StockUser, row: dict[str, Any], side: str = "compiled") -> dict[str, Any]:
    """`row`'s `side` (compiled or eager) against the stock user: its speedup over stock eager and
    over stock torch.compile, each with its interval (unpaired unless it is the same row), and the
    errors against fp64 beside each other."""
    out: dict[str, Any] = {
        "stock_eager_ms": user.eager_ms,
        "stock_compile_config": user.compile_config,
        "stock_compile_ms": user.compile_ms,
        "stock_max_rel_err": user.error,
        "max_rel_err": row.get("eager_fp64_max_rel_err" if side == "eager" else "fp64_max_rel_err"),
    }
    mine = cstats.row_groups(row, side)
    same = row is user.row
    for key, stock_side in (("vs_stock_eager", "eager"), ("vs_stock_compile", "compiled")):
        pooled = stock_side == "eager" and user.reference is not None  # the cell's one reference
        theirs = user.groups(stock_side)
        ms = user.eager_ms if stock_side == "eager" else user.row.get(f"{stock_side}_ms")
        if same and stock_side == side and not pooled:
            iv = (1.0, 1.0, 1.0)
        elif mine and theirs:
            interval = cstats.ratio_interval(theirs, mine, paired=same and not pooled)
            iv = (interval.estimate, interval.low, interval.high)
        elif ms and row.get(f"{side}_ms"):
            iv = (ms / row[f"{side}_ms"], math.nan, math.nan)
        else:
            continue
        out.update(
            {
                k: None if math.isnan(v) else v
                for k, v in zip((key, f"{key}_ci_low", f"{key}_ci_high"), iv, strict=True)
            }
        )
    out["vs_stock_from"] = (
        "the same row"
        if same
        else f"unpaired: the stock user's job {user.row['job_id']}, this one's job {row['job_id']}"
    )
    return out
