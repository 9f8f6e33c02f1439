"""The regression report as one self-contained HTML file: no script or style from the network,
charts drawn as inline SVG (geometry: `reports.charts`; markup: `reports/templates/
regression.html.j2`, autoescaped), and a table sortable by a few lines of inline JavaScript.

Per hardware class (labelled by what it is: "GPU: NVIDIA H100 ...", "CPU: AMD EPYC ...") a chart
of every cell's compiled latency, current over baseline, with its 95% interval as whiskers on a
log axis, coloured by verdict (a cell without both latencies is listed under it, not drawn), and
the cold compile times, baseline and current; in history mode a trend chart per cell (model, batch
size, precision, config) with its interval band, every run named on hover; then the cells with
their verdicts and reasons. Doubted timings (`compiler.statistics.timing_doubts` of either run's
row, `row_facts`) are marked where the caller hands in the runs' rows.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

import pyarrow as pa

from compiler import statistics as cstats
from reports.charts import COLORS, CROSSES, Bar, Point, Td, class_label, dot_chart, interval_chart, render
from reports.charts import trend_chart as _trend_chart
from reports.regression.cells import CellChange, Comparison
from reports.regression.match import latest_by_cell

VERDICT_COLORS = {
    "regression": "#cf222e",
    "watch": "#9a6700",
    "improvement": "#1a7f37",
    "unchanged": "#57606a",
    "new": "#8250df",
    "missing": "#bc4c00",
}
HEADS = (
    "cell",
    "verdict",
    "compiled ms",
    "current / baseline",
    "95% CI",
    "device ms",
    "device ratio [95% CI]",
    "speedup over eager",
    "judged on",
    "reasons",
)


@dataclass(frozen=True)
class RowFacts:
    """What the page reads from the runs' rows where its caller has them: per cell name why its
    timing is doubted, and per hardware class the devices its rows name."""

    doubts: dict[str, tuple[str, ...]] = field(default_factory=dict)
    devices: dict[str, tuple[str, ...]] = field(default_factory=dict)


def row_facts(current: pa.Table, baseline: pa.Table | None = None) -> RowFacts:
    """The doubts (`compiler.statistics.timing_doubts`) of each cell's latest row in `current`
    and in `baseline`, each reason naming its run, and the device names per class."""
    t = cstats.load_thresholds()
    doubts: dict[str, list[str]] = defaultdict(list)
    devices: dict[str, set[str]] = defaultdict(set)
    for side, table in (("current", current), ("baseline", baseline)):
        for key, row in latest_by_cell(table).items() if table is not None else ():
            name = CellChange(*key).name
            doubts[name] += [f"{side}: {reason}" for reason in cstats.timing_doubts(row, t)]
            if row.get("device_name"):
                devices[str(row["hardware"])].add(str(row["device_name"]))
    return RowFacts(
        {k: tuple(v) for k, v in doubts.items() if v}, {k: tuple(sorted(v)) for k, v in devices.items()}
    )


def render_html(
    comparison: Comparison, title: str = "Regression report", facts: RowFacts | None = None
) -> str:
    """The page: its head and counts, the environment that changed, the cross-GPU view, the charts
    per hardware class, the trend (history mode) and the table of cells. `facts`: `row_facts` of
    the runs compared, for the doubted timings and the device names (without: none marked, and
    each class named by its name)."""
    facts = facts or RowFacts()
    env = comparison.environment
    return render(
        "regression.html.j2",
        title=title,
        counts=[(v, n) for v, n in comparison.counts().items() if n],
        doubted=sum(bool(_doubts(c, facts)) for c in comparison.cells),
        thresholds=comparison.thresholds,
        environment=[
            (hw, k, ", ".join(was) or "-", ", ".join(now) or "-")
            for hw, ks in env.items()
            for k, (was, now) in ks.items()
        ],
        across=[
            [Td(model), Td(", ".join(d["regression"]) or "-"), Td(", ".join(d["improvement"]) or "-")]
            for model, d in comparison.by_model().items()
        ],
        classes=_class_charts(comparison, facts),
        trend=_trend(comparison, facts),
        heads=HEADS,
        rows=[_cell_row(c, _doubts(c, facts)) for c in comparison.cells],
    )


def _doubts(c: CellChange, facts: RowFacts) -> tuple[str, ...]:
    """Why a cell's timing is doubted: its rows' (`facts`), else what its reasons say (the verdict
    notes a doubted timing where it left a figure undecided)."""
    return facts.doubts.get(c.name) or tuple(r for r in c.reasons if "timing doubted" in r)


def _devices(comparison: Comparison, facts: RowFacts, hw: str) -> list[str]:
    """The device names of a class: the rows' (`facts`), else the environment's where it changed."""
    if hw in facts.devices:
        return list(facts.devices[hw])
    was, now = comparison.environment.get(hw, {}).get("device_name", ([], []))
    return [*was, *now]


def latency_bar(c: CellChange, doubts: tuple[str, ...] = ()) -> Bar:
    """A cell's bar: its compiled latency current / baseline (the device time's where the verdict
    is judged on it) with its interval, coloured by verdict; or, without one, why."""
    label = f"{c.model} bs{c.batch_size} {c.dtype} {c.config}"
    device = c.judged_on == "device" and c.device_ratio is not None
    value, (low, high) = (c.device_ratio, c.device_ci) if device else (c.latency_ratio, c.latency_ci)
    if value is None:
        why = c.reasons[0] if c.reasons else " -> ".join(str(s) for s in c.status)
        return Bar(label, None, note=why if why.startswith(f"{c.verdict}:") else f"{c.verdict}: {why}")
    processes = f"{c.processes[0]} baseline and {c.processes[1]} current processes"
    detail = f"{c.verdict}; {'device' if device else 'wall'} time, 95% interval over {processes}"
    return Bar(label, value, low, high, detail=detail, doubts=doubts, color=VERDICT_COLORS[c.verdict])


def _class_charts(comparison: Comparison, facts: RowFacts) -> list[dict]:
    """Per hardware class: the latency ratio of every cell and the cold compile times, baseline
    and current."""
    by_class: dict[str, list[CellChange]] = defaultdict(list)
    for c in comparison.cells:
        by_class[c.hardware].append(c)
    out = []
    for hw, cells in sorted(by_class.items()):
        label = class_label(hw, _devices(comparison, facts, hw))
        bars = [latency_bar(c, _doubts(c, facts)) for c in cells]
        drawn = dict.fromkeys(c.verdict for c, b in zip(cells, bars, strict=True) if b.value is not None)
        verdicts = {v: VERDICT_COLORS[v] for v in drawn}
        compile_s = {"baseline": [c.compile_s[0] for c in cells], "current": [c.compile_s[1] for c in cells]}
        out.append(
            {
                "label": label,
                "latency": interval_chart(
                    f"{label}: compiled latency, current / baseline", bars, "x", verdicts
                ),
                "compile": dot_chart(
                    f"{label}: cold compile time", [b.label for b in bars], compile_s, "s", COLORS
                ),
            }
        )
    return out


def _trend(comparison: Comparison, facts: RowFacts) -> dict | None:
    """History mode: per hardware class, one small chart per cell (model, batch size, precision,
    config) of its speedup over the runs compared, with its 95% interval as a band; hovering a
    point names its run."""
    if not comparison.trend:
        return None
    runs = [label for label, _ in next(iter(comparison.trend.values()))]
    by_hw: dict[str, list] = defaultdict(list)
    for name, series in comparison.trend.items():
        bands = comparison.trend_ci.get(name) or [(None, None)] * len(runs)
        points = [
            None if v is None else Point(v, lo, hi) for (_, v), (lo, hi) in zip(series, bands, strict=True)
        ]
        by_hw[name.split("/", 1)[0]].append(_trend_chart(name.split("/", 1)[1], runs, points, "x"))
    labelled = [
        (class_label(hw, _devices(comparison, facts, hw)), charts) for hw, charts in sorted(by_hw.items())
    ]
    return {"runs": len(runs), "classes": labelled}


def _pair(values: tuple[float | None, float | None], fmt: str) -> str:
    return " \u2192 ".join("-" if v is None else format(v, fmt) for v in values)


def _cell_row(c: CellChange, doubts: tuple[str, ...]) -> list[Td]:
    """One cell's row of the table."""
    ratio = "" if c.latency_ratio is None else f"{c.latency_ratio:.3f}"
    low, high = c.latency_ci
    crosses = low is not None and high is not None and low <= 1.0 <= high
    ci = (
        "" if low is None or high is None else f"[{low:.3f}, {high:.3f}]" + (f" {CROSSES}" if crosses else "")
    )
    dratio = ""
    if c.device_ratio is not None and None not in c.device_ci:
        dratio = f"{c.device_ratio:.3f} [{c.device_ci[0]:.3f}, {c.device_ci[1]:.3f}]"
    return [
        Td(c.name + (f" {cstats.MARK}" if doubts else ""), title=cstats.doubt_text(list(doubts))),
        Td(c.verdict, color=VERDICT_COLORS[c.verdict]),
        Td(_pair(c.compiled_ms, ".3f")),
        Td(ratio, ratio),
        Td(ci),
        Td(_pair(c.device_ms, ".3f")),
        Td(dratio),
        Td(_pair(c.speedup, ".2f")),
        Td(c.judged_on or ""),
        Td("; ".join(c.reasons)),
    ]
