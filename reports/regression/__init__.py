"""Two runs compared cell by cell: what got slower, on which hardware class, by how much (with
its interval) and why.

A cell is (hardware class, model, batch size, precision, config); a run's job ids include its
software stack, so cells are matched on those five names, not on ids. For every cell in either
run: the status change, the compiled-latency ratio current / baseline with its interval (from
every timed sample, grouped by process: `compiler.statistics.ratio_interval`, unpaired), the
speedup change, the cold compile time and peak memory changes, graph breaks and recompiles with
the reasons that are new, and the autotune winners that changed (from `kernel_choices`, where
both runs have them). Each becomes a verdict (regression, improvement, unchanged, new, missing)
with its reasons in words. The decisions and their thresholds are `compiler.statistics`'s
(`latency_verdict`, `figure_verdict`, `thresholds.json`); nothing here decides on its own.

Here: `compare` (two runs, a window's samples pooled into the baseline's) and `compare_history`
(the consecutive-runs rule). The parts: `reports.regression.cells` (a `CellChange` per cell, the
`Comparison`), `reports.regression.match` (rows matched by cell, samples, winners, environment),
`reports.regression.verdict` (one cell judged) and `reports.regression.markdown` (the text).
"""

from __future__ import annotations

from collections import defaultdict

import pyarrow as pa

from compiler import statistics as cstats
from reports.regression.cells import ENV_KEYS, VERDICTS, CellChange, Comparison
from reports.regression.markdown import to_json_text, to_markdown
from reports.regression.match import (
    device_groups,
    environment_diff,
    latest_by_cell,
    sample_groups,
    speedup_trend,
    winners,
)
from reports.regression.verdict import compare_cell, compare_winners
from reports.run_cells import KEY

__all__ = [
    "ENV_KEYS",
    "KEY",
    "NOISY",
    "VERDICTS",
    "CellChange",
    "Comparison",
    "compare",
    "compare_history",
    "to_json_text",
    "to_markdown",
]


def compare(
    current: pa.Table,
    baseline: pa.Table,
    thresholds: cstats.Thresholds | None = None,
    current_choices: pa.Table | None = None,
    baseline_choices: pa.Table | None = None,
    window: list[pa.Table] = (),
) -> Comparison:
    """`current` against `baseline`; the timed samples of the same cell in the `window` runs (older
    ones) join the baseline's in the latency interval (a multi-run baseline)."""
    t = thresholds or cstats.load_thresholds()
    cur, base = latest_by_cell(current), latest_by_cell(baseline)
    pooled: dict[tuple, list[list[float]]] = defaultdict(list)
    pooled_device: dict[tuple, list[list[float]]] = defaultdict(list)
    pooled_compile: dict[tuple, list[float]] = defaultdict(list)
    for table in window:
        for key, row in latest_by_cell(table).items():
            if row["status"] == "ok":
                pooled[key] += sample_groups(row)
                pooled_device[key] += device_groups(row)
                pooled_compile[key].append(row.get("compile_s"))
    cur_win, base_win = winners(current_choices), winners(baseline_choices)
    cells = []
    for key in sorted(set(cur) | set(base), key=lambda k: tuple(map(str, k))):
        c = CellChange(*key)
        now, before = cur.get(key), base.get(key)
        if before is None:
            c.verdict = "new"
            c.reasons.append(f"not in the baseline; now {now['status']}")
        elif now is None:
            c.verdict = "missing"
            c.reasons.append(f"not in this run; was {before['status']}")
        else:
            older = (pooled.get(key, []), pooled_device.get(key, []), pooled_compile.get(key, []))
            compare_cell(c, now, before, t, *older)
            compare_winners(c, cur_win.get(now["job_id"], {}), base_win.get(before["job_id"], {}))
        cells.append(c)
    return Comparison(cells, environment_diff(current, baseline), t)


NOISY = ("latency", "compile_time", "memory")
"""Regressions one noisy run can show: in history mode they must hold on consecutive runs."""


def compare_history(
    runs: list[pa.Table],
    thresholds: cstats.Thresholds | None = None,
    choices: list[pa.Table | None] | None = None,
    labels: list[str] | None = None,
) -> Comparison:
    """The newest of `runs` (oldest first) against the ones before it, in the manner of PyTorch's
    dashboard: the last `consecutive` runs are each compared with the same reference, the
    `window_runs` runs before them (the newest of those as the baseline, the samples of all of
    them pooled), and a latency, compile-time or memory regression of the newest run counts only
    if every one of those `consecutive` runs shows it (a step change is caught on its second
    night, a single noisy night is not); a status, graph-break or recompile regression counts at
    once. With too few runs for a reference the newest is compared with the one before it and a
    noisy regression is only a "watch". Each reason says which rule fired."""
    t = thresholds or cstats.load_thresholds()
    if len(runs) < 2:
        raise ValueError("history mode needs at least two runs")
    choices = list(choices or [None] * len(runs))
    k = t.consecutive
    reference = list(range(max(0, len(runs) - k - t.window_runs), max(0, len(runs) - k)))
    rule = f"the last {k} runs against the {len(reference)} runs before them"

    def against_reference(i: int) -> Comparison:
        if not reference:
            return compare(runs[i], runs[i - 1], t, choices[i], choices[i - 1])
        base = reference[-1]
        window = [runs[j] for j in reference[:-1]]
        return compare(runs[i], runs[base], t, choices[i], choices[base], window=window)

    newest = against_reference(len(runs) - 1)
    others = [against_reference(i) for i in range(len(runs) - k, len(runs) - 1)] if reference else []
    for cell in newest.cells:
        if cell.verdict != "regression":
            continue
        if not all(what in NOISY for what in cell.regressed_on):
            cell.reasons.append("rule fired: a failure, graph break or recompile counts at once")
            continue
        held = [any(e.name == cell.name and e.verdict == "regression" for e in comp.cells) for comp in others]
        if not reference:
            cell.verdict = "watch"
            cell.reasons.append(
                f"watch: {len(runs)} runs are too few for the {k}-run rule; against the previous run only"
            )
        elif not all(held):
            cell.verdict = "watch"
            cell.reasons.append(f"watch: over the threshold on {1 + sum(held)} of the last {k} runs ({rule})")
        else:
            cell.reasons.append(f"rule fired: {rule}, every one over the threshold")
    newest.trend, newest.trend_ci = speedup_trend(runs, labels or [f"run {i + 1}" for i in range(len(runs))])
    return newest
