"""Two runs' rows matched cell by cell: each run's latest row per cell (hardware class, model,
batch size, precision, config: a run's job ids include its software stack, so cells are matched on
those five names), a row's timed samples grouped by process, the autotune winners per job, the
environment that differs per class, and the speedup of every cell over a series of runs."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from compiler import statistics as cstats
from reports.regression.cells import ENV_KEYS, CellChange
from reports.run_cells import KEY, Speedup, row_speedup
from store.rows import latest_rows


def sample_groups(row: dict[str, Any]) -> list[list[float]]:
    """A row's compiled wall-time samples, one group per process."""
    return cstats.row_groups(row, "compiled")


def device_groups(row: dict[str, Any]) -> list[list[float]]:
    """A row's compiled device-time samples (GPU rows), one group per process."""
    return cstats.row_groups(row, "compiled", device=True)


def latest_by_cell(table: pa.Table) -> dict[tuple, dict[str, Any]]:
    """A run's rows by cell (`KEY`): per cell, the row whose job started last (`store.rows.latest_rows`)."""
    return latest_rows(table.to_pylist(), lambda r: tuple(r[k] for k in KEY))


def winners(choices: pa.Table | None) -> dict[tuple, dict[tuple, str]]:
    """Per cell job id: (op, input shapes) -> the winning candidate's name."""
    found: dict[str, dict[tuple, str]] = defaultdict(dict)
    if choices is None or choices.num_rows == 0:
        return found
    for r in choices.filter(pc.equal(choices["is_winner"], True)).to_pylist():
        found[r["job_id"]][(r["op"], tuple(r["input_shapes"] or ()))] = r["choice"]
    return found


def environment_diff(
    current: pa.Table, baseline: pa.Table
) -> dict[str, dict[str, tuple[list[str], list[str]]]]:
    """Per hardware class, per versions key (and the mean SM clock): the baseline's values and the
    current run's, where they differ."""

    def values(table: pa.Table) -> dict[str, dict[str, set[str]]]:
        found: dict[str, dict[str, set[str]]] = defaultdict(lambda: defaultdict(set))
        for r in table.select(
            [k for k in ("hardware", *ENV_KEYS, "sm_clock_mean_mhz") if k in table.column_names]
        ).to_pylist():
            for k in ENV_KEYS:
                if r.get(k):
                    found[r["hardware"]][k].add(str(r[k]))
            if r.get("sm_clock_mean_mhz"):
                found[r["hardware"]]["sm_clock_mean_mhz"].add(f"{round(r['sm_clock_mean_mhz'], -1):.0f}")
        return found

    now, before = values(current), values(baseline)
    diff: dict[str, dict[str, tuple[list[str], list[str]]]] = {}
    for hw in sorted(set(now) | set(before)):
        for k in (*ENV_KEYS, "sm_clock_mean_mhz"):
            a, b = sorted(before.get(hw, {}).get(k, set())), sorted(now.get(hw, {}).get(k, set()))
            if a != b:
                diff.setdefault(hw, {})[k] = (a, b)
    return diff


def speedup_trend(
    runs: list[pa.Table], labels: list[str]
) -> tuple[dict[str, list[tuple[str, float | None]]], dict[str, list[tuple[float | None, float | None]]]]:
    """Per cell name, each run's speedup over eager (None where the cell was not ok), and beside
    it each run's 95% interval of that speedup: the one its row was written with
    (`reports.run_cells.row_speedup` without recomputing: a window of runs holds many rows, and
    the figure is the same `statistics.paired_speedup` of the same samples), from the samples
    where the row has none."""
    per_run = [latest_by_cell(table) for table in runs]
    trend: dict[str, list[tuple[str, float | None]]] = {}
    bands: dict[str, list[tuple[float | None, float | None]]] = {}
    for key in sorted({k for rows in per_run for k in rows}, key=lambda k: tuple(map(str, k))):
        name = CellChange(*key).name
        trend[name], bands[name] = [], []
        for label, rows in zip(labels, per_run, strict=True):
            row = rows.get(key)
            ok = row is not None and row["status"] == "ok"
            trend[name].append((label, row["speedup"] if ok else None))
            found = _stored_or_sampled(row) if ok else None
            bands[name].append((found.low, found.high) if found else (None, None))
    return trend, bands


def _stored_or_sampled(row: dict[str, Any]) -> Speedup | None:
    """A row's speedup interval as written, or from its samples where it was written without one."""
    stored = row_speedup(row, from_samples=False)
    if stored is not None and stored.low is not None and stored.high is not None:
        return stored
    return row_speedup(row)
