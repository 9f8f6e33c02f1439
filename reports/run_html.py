"""One run as one self-contained HTML page (`orchestrate report OUT --html FILE`): per hardware
class a chart of every cell's compiled speedup over eager with its 95% interval as whiskers
(`reports.run_cells`: the hierarchical bootstrap of `compiler.statistics` over the row's
per-process samples), a chart of its cold compile time (and the warm one where a later process
measured it), then every cell in a sortable table. Charts and frame: `reports.charts`."""

from __future__ import annotations

from collections import Counter

import pyarrow as pa

from reports.charts import TABLE_END, Bar, bar_chart, interval_chart, page_end, page_head, table_start
from reports.charts import esc as _e
from reports.run_cells import RunCell, by_class, run_cells

COMPILE_COLORS = {"cold compile": "#1f6feb", "warm compile": "#9aa5b1"}


def render_run_html(
    table: pa.Table, title: str = "Speedup report", cells: list[RunCell] | None = None
) -> str:
    """The page of one run's result table (`cells`: its `run_cells`, where the caller has them)."""
    cells = run_cells(table) if cells is None else cells
    statuses = Counter(str(c.row["status"]) for c in cells)
    out = [
        page_head(title),
        f"<p>{len(cells)} cells: "
        + ", ".join(f"<b>{n}</b> {_e(s)}" for s, n in sorted(statuses.items()))
        + "</p>",
        "<p>Speedup: median eager latency over median compiled latency, with its 95% interval over the "
        "row's processes (whiskers; one process: the interval of its calls only, tighter than a rerun "
        "would agree with). The dashed line is 1x: no gain.</p>",
    ]
    for hw, mine in by_class(cells).items():
        out.append(f"<h2>{_e(hw)}</h2>")
        out.append(interval_chart(f"{hw}: speedup over eager", [_speedup_bar(c) for c in mine], "x"))
        series = {"cold compile": [c.row.get("compile_s") for c in mine]}
        warm = [c.row.get("warm_compile_s") for c in mine]
        if any(v is not None for v in warm):
            series["warm compile"] = warm
        labels = [c.label for c in mine]
        out.append(bar_chart(f"{hw}: compile time", labels, series, "s", COMPILE_COLORS))
    out += _table(cells)
    return "".join(out)


def _speedup_bar(cell: RunCell) -> Bar:
    s = cell.speedup
    if s is None:
        status = str(cell.row["status"])
        return Bar(cell.label, None, note=status if status != "ok" else "no speedup measured")
    over = f"over {s.processes} processes" if s.processes > 1 else "of one process's calls"
    return Bar(cell.label, s.estimate, s.low, s.high, detail=f"(95% interval {over})")


def _num(value: object, fmt: str) -> str:
    return "-" if not isinstance(value, (int, float)) else format(value, fmt)


def _table(cells: list[RunCell]) -> list[str]:
    heads = (
        "cell",
        "status",
        "eager ms",
        "compiled ms",
        "speedup",
        "95% CI",
        "processes",
        "compile s",
        "peak MiB",
    )
    out = ["<h2>Cells</h2>", table_start(heads)]
    for c in cells:
        r, s = c.row, c.speedup
        ci = "" if s is None or s.low is None else f"[{s.low:.3f}, {s.high:.3f}]"
        peak = r.get("peak_mem_bytes")
        out.append(
            f"<tr><td>{_e(c.name)}</td><td>{_e(r['status'])}</td><td>{_num(r.get('eager_ms'), '.3f')}</td>"
            f"<td>{_num(r.get('compiled_ms'), '.3f')}</td>"
            f"<td data-v='{'' if s is None else s.estimate}'>{'-' if s is None else f'{s.estimate:.3f}'}</td>"
            f"<td>{ci}</td><td>{'-' if s is None else s.processes}</td><td>{_num(r.get('compile_s'), '.1f')}</td>"
            f"<td>{_num(None if peak is None else peak / 2**20, '.0f')}</td></tr>"
        )
    out.append(TABLE_END + page_end())
    return out
