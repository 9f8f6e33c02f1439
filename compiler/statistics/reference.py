"""One eager reference per cell: every speedup of a cell (a hardware class, model, batch size and
precision) is over the same eager latency, pooled over the eager measurements of the cell's jobs,
so the report, the presets and the tune agree on their face: the config with the highest speedup
is the one with the lowest compiled latency. Each job times eager beside its compiled calls; a
job whose own eager was timed while the host was busy (`compiler.statistics.trust`) is left out
of the pool unless every job of the cell was.

Part of the one statistics module (`compiler.statistics`); numpy through `intervals` only.
"""

from __future__ import annotations

import math
import statistics as stdstats
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from compiler.statistics.intervals import LEVEL, Interval, ratio_interval
from compiler.statistics.samples import row_groups
from compiler.statistics.thresholds import Thresholds, load_thresholds
from compiler.statistics.trust import timing_doubts

Row = Mapping[str, Any]


@dataclass(frozen=True)
class CellReference:
    """A cell's eager reference: its samples per process and their median."""

    groups: tuple[tuple[float, ...], ...]
    """Eager samples, one group per job process, of the jobs pooled."""
    median_ms: float | None
    """Median of the pooled samples (of the jobs' `eager_ms` where no job kept samples)."""
    jobs: int
    """Jobs pooled."""
    left_out: int
    """Jobs of the cell whose eager was left out of the pool: doubted timing."""

    def speedup(self, row: Row) -> Interval | None:
        """`row`'s speedup over this reference: median eager (pooled) / its median compiled, with
        the unpaired interval over both sides' processes; the point figure alone (a NaN
        interval) where either side kept no samples; None where the row has no compiled latency."""
        compiled = row_groups(row, "compiled")
        if self.groups and compiled:
            return ratio_interval([list(g) for g in self.groups], compiled, paired=False)
        ms = row.get("compiled_ms")
        if self.median_ms is None or not isinstance(ms, (int, float)) or ms <= 0:
            return None
        return Interval(self.median_ms / ms, math.nan, math.nan, LEVEL, 1, math.nan, math.nan)


def cell_reference(rows: Iterable[Row], thresholds: Thresholds | None = None) -> CellReference:
    """The eager reference of one cell's rows (its ok rows' eager samples, pooled; a row whose
    timing is doubted only where every row is)."""
    t = thresholds or load_thresholds()
    ok = [r for r in rows if r.get("status") == "ok" and isinstance(r.get("eager_ms"), (int, float))]
    trusted = [r for r in ok if not timing_doubts(r, t, spread=False)]
    pool = trusted or ok
    groups = tuple(tuple(g) for r in pool for g in row_groups(r, "eager"))
    if groups:
        median = stdstats.median(x for g in groups for x in g)
    else:
        medians = [float(r["eager_ms"]) for r in pool]
        median = stdstats.median(medians) if medians else None
    return CellReference(groups, median, len(pool), len(ok) - len(pool))
