"""One run's cells as the report, the single-run page and the benchmark records show them: per
cell (hardware class, model, batch size, precision, config) its latest row, its speedup over the
cell's one eager reference with the 95% interval, and why its timing is doubted, if it is.

The reference is `compiler.statistics.cell_reference`: eager pooled over the jobs of the cell
(every config of one hardware class, model, batch size and precision), so every config's speedup
is over the same eager and the fastest config has the highest speedup. The interval is the
hierarchical bootstrap over both sides' processes (unpaired: the pool and the config's compiled
calls); a row without samples keeps its point figure over the reference, with no interval.
`row_speedup` is a row's speedup over its own job's eager (the regression report's figure, which
compares one cell across runs).
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


def reference_speedup(ref: cstats.CellReference, row: dict[str, Any]) -> Speedup | None:
    """`row`'s speedup over its cell's eager reference (None where the row is not ok or has no
    compiled latency)."""
    if row.get("status") != "ok":
        return None
    iv = ref.speedup(row)
    if iv is None or _finite(iv.estimate) is None:
        return None
    return Speedup(iv.estimate, _finite(iv.low), _finite(iv.high), iv.processes, iv.scope)


@dataclass(frozen=True)
class RunCell:
    """One cell of a run: its latest row, its speedup over the cell's eager reference and why its
    timing is doubted (`compiler.statistics.timing_doubts`; empty where it is trusted)."""

    row: dict[str, Any]
    speedup: Speedup | None
    doubts: tuple[str, ...] = ()
    reference_ms: float | None = None
    """The cell's eager reference, ms (pooled over its jobs)."""

    @property
    def doubted(self) -> bool:
        return bool(self.doubts)

    @property
    def crosses_one(self) -> bool:
        """The speedup's interval holds 1x: not shown faster nor slower than eager."""
        s = self.speedup
        return s is not None and s.low is not None and s.high is not None and s.low <= 1.0 <= s.high

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
    model, batch size, precision and config, with its speedup over the cell's eager reference and
    its doubts."""
    rows = latest_rows(table.to_pylist(), lambda r: tuple(r[k] for k in KEY))
    thresholds = cstats.load_thresholds()
    groups: dict[tuple, list[dict[str, Any]]] = {}
    for key, row in rows.items():
        groups.setdefault(key[:-1], []).append(row)
    refs = {k: cstats.cell_reference(v, thresholds) for k, v in groups.items()}
    cells = []
    for key in sorted(rows, key=lambda k: tuple(map(str, k))):
        row, ref = rows[key], refs[key[:-1]]
        doubts = tuple(cstats.timing_doubts(row, thresholds))  # the job's own interval, not the pool's
        cells.append(RunCell(row, reference_speedup(ref, row), doubts, ref.median_ms))
    return cells


def by_class(cells: list[RunCell]) -> dict[str, list[RunCell]]:
    """The cells per hardware class, classes in order."""
    out: dict[str, list[RunCell]] = {}
    for cell in cells:
        out.setdefault(str(cell.row["hardware"]), []).append(cell)
    return out


def doubted_summary(table: pa.Table, run_id: str | None = None, rerun: str = "") -> str:
    """What the end of a sweep says of its doubted timings (`compiler.statistics.timing_doubts`):
    a count line, one line per doubted cell of the run `run_id` (of every run where None) with its
    reasons, and `rerun` (a command that measures again, without its `--only`) with those cells;
    "" where every timing of it is trusted."""
    if run_id is not None and "run_id" in table.column_names:
        table = table.filter(pa.compute.equal(table.column("run_id"), run_id))
    cells = [c for c in run_cells(table) if c.row.get("status") == "ok"]
    doubted = [c for c in cells if c.doubted]
    if not doubted:
        return ""
    lines = [
        f"{cstats.MARK} timing doubted on {len(doubted)} of {len(cells)} ok cells: `report` marks their speedups "
        f"{cstats.MARK} and `presets` leaves their cells undecided"
    ]
    lines += [f"  {cstats.MARK} {c.name}: {cstats.doubt_text(list(c.doubts))}" for c in doubted]
    if rerun:
        names = ",".join(sorted({str(c.row.get("job_name") or c.name) for c in doubted}))
        spread_only = all(d.startswith(cstats.SPREAD_DOUBT) for c in doubted for d in c.doubts)
        how = (
            "with more calls or processes (measure.iterations, measure.repeats in the sweep file)"
            if spread_only  # a quiet host would not narrow an interval of too few samples
            else "on a quiet host"
        )
        lines.append(f"measure them again {how}:\n  {rerun} --only '{names}'")
    return "\n".join(lines)
