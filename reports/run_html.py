"""One run as one self-contained HTML page (`orchestrate report OUT --html FILE`): per hardware
class (labelled by what it is: "GPU: NVIDIA H100 ...", "CPU: AMD EPYC ...") a chart of every
cell's compiled speedup over the cell's eager reference on a log axis, its 95% interval as
whiskers (`reports.run_cells`), doubted timings and intervals that hold 1x marked, a chart of its
cold compile time (and the warm one where a later process measured it), then every cell in a
sortable table. Geometry: `reports.charts`; markup: `reports/templates/run.html.j2`."""

from __future__ import annotations

from collections import Counter

import pyarrow as pa

from compiler import statistics as cstats
from reports.charts import CROSSES, Bar, Td, class_label, dot_chart, interval_chart, render
from reports.run_cells import RunCell, by_class, run_cells

COMPILE_COLORS = {"cold compile": "#1f6feb", "warm compile": "#9aa5b1"}
HEADS = (
    "cell",
    "status",
    "eager reference ms",
    "compiled ms",
    "speedup",
    "95% CI",
    "processes",
    "compile s",
    "peak MiB",
)


def render_run_html(
    table: pa.Table, title: str = "Speedup report", cells: list[RunCell] | None = None
) -> str:
    """The page of one run's result table (`cells`: its `run_cells`, where the caller has them)."""
    cells = run_cells(table) if cells is None else cells
    statuses = Counter(str(c.row["status"]) for c in cells)
    classes = []
    for hw, mine in by_class(cells).items():
        label = class_label(hw, (c.row.get("device_name") for c in mine))
        series = {"cold compile": [c.row.get("compile_s") for c in mine]}
        warm = [c.row.get("warm_compile_s") for c in mine]
        if any(v is not None for v in warm):
            series["warm compile"] = warm
        classes.append(
            {
                "label": label,
                "speedup": interval_chart(f"{label}: speedup over eager", [speedup_bar(c) for c in mine]),
                "compile": dot_chart(
                    f"{label}: compile time", [c.label for c in mine], series, "s", COMPILE_COLORS
                ),
            }
        )
    return render(
        "run.html.j2",
        title=title,
        cells=len(cells),
        statuses=sorted(statuses.items()),
        doubted=sum(c.doubted for c in cells),
        classes=classes,
        heads=HEADS,
        rows=[_row(c) for c in cells],
    )


def speedup_bar(cell: RunCell) -> Bar:
    """A cell's bar: its speedup over its eager reference with the interval and doubts, or why
    there is none."""
    s = cell.speedup
    if s is None:
        status = str(cell.row["status"])
        return Bar(cell.label, None, note=status if status != "ok" else "no speedup measured")
    over = f"over {s.processes} processes" if s.processes > 1 else "of one process's calls"
    return Bar(cell.label, s.estimate, s.low, s.high, detail=f"(95% interval {over})", doubts=cell.doubts)


def _num(value: object, fmt: str) -> str:
    return "-" if not isinstance(value, (int, float)) else format(value, fmt)


def _row(c: RunCell) -> list[Td]:
    r, s = c.row, c.speedup
    peak = r.get("peak_mem_bytes")
    speedup = Td()
    if s is not None:
        marks = (f" {cstats.MARK}" if c.doubted else "") + (f" {CROSSES}" if c.crosses_one else "")
        speedup = Td(f"{s.estimate:.3f}{marks}", s.estimate, cstats.doubt_text(list(c.doubts)))
    return [
        Td(c.name),
        Td(r["status"]),
        Td(_num(c.reference_ms, ".3f")),
        Td(_num(r.get("compiled_ms"), ".3f")),
        speedup,
        Td("" if s is None or s.low is None or s.high is None else f"[{s.low:.3f}, {s.high:.3f}]"),
        Td("-" if s is None else s.processes),
        Td(_num(r.get("compile_s"), ".1f")),
        Td(_num(None if peak is None else peak / 2**20, ".0f")),
    ]
