"""One run's cells as the single-run page and the benchmark records show them: per cell (hardware
class, model, batch size, precision, config) its latest row and its speedup over eager with the
95% interval.

The interval is `compiler.statistics`'s: the hierarchical bootstrap over the row's per-process
samples (`paired_speedup`: eager and compiled were timed in the same processes, so each process
is resampled for both sides at once). A row without samples keeps the interval it was written
with (`speedup_ci_low`, `speedup_ci_high`: the same function, run when the row was measured).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from compiler import statistics as cstats
from store.rows import latest_rows

KEY = ("hardware", "model", "batch_size", "dtype", "config")
"""A cell: the names a run's rows are matched on (within a run, and between two runs compared)."""


@dataclass(frozen=True)
class Speedup:
    """A cell's speedup over eager with its interval (None where not known)."""

    estimate: float
    low: float | None
    high: float | None
    processes: int
    scope: str
    """What the interval covers: "processes" or "one process" (`statistics.Interval.scope`)."""


def _finite(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and math.isfinite(value) else None


def row_speedup(row: dict[str, Any], from_samples: bool = True) -> Speedup | None:
    """An ok row's speedup over eager and its 95% interval: from its samples
    (`statistics.paired_speedup`) where it has them and `from_samples`, else the interval stored
    in the row; None where the row is not ok or has no speedup."""
    if row.get("status") != "ok":
        return None
    eager, compiled = row.get("eager_samples_ms") or [], row.get("compiled_samples_ms") or []
    if from_samples and eager and compiled:
        try:
            iv = cstats.paired_speedup(eager, compiled, row.get("samples_per_repeat"))
        except ValueError:  # sample counts that do not match samples_per_repeat: the stored figures
            iv = None
        if iv is not None and iv.processes:
            return Speedup(iv.estimate, _finite(iv.low), _finite(iv.high), iv.processes, iv.scope)
    estimate = _finite(row.get("speedup"))
    if estimate is None:
        return None
    repeats = row.get("repeats") or 1
    return Speedup(
        estimate,
        _finite(row.get("speedup_ci_low")),
        _finite(row.get("speedup_ci_high")),
        repeats,
        row.get("ci_scope") or ("processes" if repeats > 1 else "one process"),
    )


@dataclass(frozen=True)
class RunCell:
    """One cell of a run: its latest row and its speedup over eager."""

    row: dict[str, Any]
    speedup: Speedup | None

    @property
    def key(self) -> tuple:
        return tuple(self.row[k] for k in KEY)

    @property
    def label(self) -> str:
        """The cell within its hardware class: model, batch size, precision, config."""
        r = self.row
        return f"{r['model']} bs{r['batch_size']} {r['dtype']} {r['config']}"

    @property
    def name(self) -> str:
        r = self.row
        return f"{r['hardware']}/{r['model']}/bs{r['batch_size']}/{r['dtype']}/{r['config']}"


def run_cells(table: pa.Table) -> list[RunCell]:
    """Every cell of a run (its latest row, `store.rows.latest_rows`), ordered by hardware class,
    model, batch size, precision and config, with its speedup interval."""
    rows = latest_rows(table.to_pylist(), lambda r: tuple(r[k] for k in KEY))
    return [
        RunCell(rows[key], row_speedup(rows[key])) for key in sorted(rows, key=lambda k: tuple(map(str, k)))
    ]


def by_class(cells: list[RunCell]) -> dict[str, list[RunCell]]:
    """The cells per hardware class, classes in order."""
    out: dict[str, list[RunCell]] = {}
    for cell in cells:
        out.setdefault(str(cell.row["hardware"]), []).append(cell)
    return out
