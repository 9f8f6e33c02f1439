"""The regression report as one self-contained HTML file: no script or style from the network,
charts drawn as inline SVG (`reports.charts`), a table sortable by a few lines of inline
JavaScript, and every string from the data escaped (model names, errors and reasons are
user-controlled text).

Per hardware class a bar chart of the compiled speedup over eager per cell, baseline beside
current, and one of the cold compile times; in history mode a trend chart per cell (model, batch
size, precision, config) with its interval band, every run named on hover; then the cells with
their verdicts and reasons.
"""

from __future__ import annotations

from collections import defaultdict

from reports.charts import COLORS, TABLE_END, Point, bar_chart, page_end, page_head, table_start, trend_chart
from reports.charts import esc as _e
from reports.regression.cells import CellChange, Comparison

VERDICT_COLORS = {
    "regression": "#cf222e",
    "watch": "#9a6700",
    "improvement": "#1a7f37",
    "unchanged": "#57606a",
    "new": "#8250df",
    "missing": "#bc4c00",
}


def render_html(comparison: Comparison, title: str = "Regression report") -> str:
    """The page: its head and counts, the environment that changed, the cross-GPU view, the charts
    per hardware class, the trend (history mode) and the table of cells."""
    return "".join(
        [
            *_head(comparison, title),
            *_environment(comparison),
            *_across_classes(comparison),
            *_class_charts(comparison),
            *_trend(comparison),
            *_cells_table(comparison),
        ]
    )


def _head(comparison: Comparison, title: str) -> list[str]:
    """The page's head (title, policy, style), the counts per verdict and the thresholds used."""
    counts = comparison.counts()
    return [
        page_head(title),
        "<p>" + ", ".join(f"<b>{n}</b> {_e(v)}" for v, n in counts.items() if n) + "</p>",
        f"<p>Thresholds v{comparison.thresholds.version}: a latency change counts beyond "
        f"{comparison.thresholds.latency_change:.0%} at {comparison.thresholds.level:.0%} confidence.</p>",
    ]


def _environment(comparison: Comparison) -> list[str]:
    """The versions (and clocks) that differ per hardware class, where any do."""
    if not comparison.environment:
        return []
    out = ["<h2>Environment changes</h2><ul>"]
    for hw, keys in comparison.environment.items():
        for key, (was, now) in keys.items():
            out.append(
                f"<li>{_e(hw)} {_e(key)}: {_e(', '.join(was) or '-')} &rarr; {_e(', '.join(now) or '-')}</li>"
            )
    out.append("</ul>")
    return out


def _across_classes(comparison: Comparison) -> list[str]:
    """The cross-GPU view: per model, the classes it regressed and improved on."""
    view = comparison.by_model()
    if not view:
        return []
    out = ["<h2>Across hardware classes</h2><table><thead><tr><th>model</th><th>regressed on</th>"]
    out.append("<th>improved on</th></tr></thead><tbody>")
    for model, d in view.items():
        out.append(
            f"<tr><td>{_e(model)}</td><td>{_e(', '.join(d['regression']) or '-')}</td>"
            f"<td>{_e(', '.join(d['improvement']) or '-')}</td></tr>"
        )
    out.append("</tbody></table>")
    return out


def _class_charts(comparison: Comparison) -> list[str]:
    """Per hardware class, baseline beside current: the speedup over eager and the cold compile
    time of every cell."""
    by_class = defaultdict(list)
    for c in comparison.cells:
        by_class[c.hardware].append(c)
    legend = "".join(f'<span style="color:{color}">&#9632; {name}</span>' for name, color in COLORS.items())
    out = []
    for hw, cells in sorted(by_class.items()):
        labels = [f"{c.model} bs{c.batch_size} {c.dtype} {c.config}" for c in cells]
        out.append(f"<h2>{_e(hw)}</h2><div class='legend'>{legend}</div>")
        out.append(
            bar_chart(
                f"{hw}: speedup over eager",
                labels,
                {"baseline": [c.speedup[0] for c in cells], "current": [c.speedup[1] for c in cells]},
                "x",
            )
        )
        out.append(
            bar_chart(
                f"{hw}: cold compile time",
                labels,
                {"baseline": [c.compile_s[0] for c in cells], "current": [c.compile_s[1] for c in cells]},
                "s",
            )
        )
    return out


def _trend(comparison: Comparison) -> list[str]:
    """History mode: per hardware class, one small chart per cell (model, batch size, precision,
    config) of its speedup over the runs compared, with its 95% interval as a band; hovering a
    point names its run."""
    if not comparison.trend:
        return []
    runs = [label for label, _ in next(iter(comparison.trend.values()))]
    out = [
        f"<h2>Trend over the last {len(runs)} runs</h2><p>Speedup over eager per cell and run, "
        "the band its 95% interval; hover a point for its run, a cross marks a run where the cell "
        "was not ok.</p>"
    ]
    by_hw: dict[str, list[str]] = defaultdict(list)
    for name in comparison.trend:
        by_hw[name.split("/", 1)[0]].append(name)
    for hw, names in sorted(by_hw.items()):
        out.append(f"<h3>{_e(hw)}</h3><div class='grid'>")
        for name in names:
            bands = comparison.trend_ci.get(name) or [(None, None)] * len(runs)
            points = [
                None if v is None else Point(v, lo, hi)
                for (_, v), (lo, hi) in zip(comparison.trend[name], bands, strict=True)
            ]
            out.append(trend_chart(name.split("/", 1)[1], runs, points, "x"))
        out.append("</div>")
    return out


def _cells_table(comparison: Comparison) -> list[str]:
    """Every cell with its verdict, latencies, ratios and reasons, in a sortable table; the page's
    end."""
    heads = (
        "cell",
        "verdict",
        "compiled ms",
        "current / baseline",
        "95% CI",
        "device ms",
        "device ratio [95% CI]",
    )
    out = ["<h2>Cells</h2>", table_start((*heads, "judged on", "reasons"))]
    out += [_cell_row(c) for c in comparison.cells]
    out.append(TABLE_END + page_end())
    return out


def _cell_row(c: CellChange) -> str:
    """One cell's row of the table."""
    ratio = "" if c.latency_ratio is None else f"{c.latency_ratio:.3f}"
    ci = "" if c.latency_ci[0] is None else f"[{c.latency_ci[0]:.3f}, {c.latency_ci[1]:.3f}]"
    ms = " &rarr; ".join("-" if v is None else f"{v:.3f}" for v in c.compiled_ms)
    dms = " &rarr; ".join("-" if v is None else f"{v:.3f}" for v in c.device_ms)
    dratio = (
        "" if c.device_ratio is None else f"{c.device_ratio:.3f} [{c.device_ci[0]:.3f}, {c.device_ci[1]:.3f}]"
    )
    return (
        f"<tr><td>{_e(c.name)}</td><td style='color:{VERDICT_COLORS[c.verdict]}'>{_e(c.verdict)}</td>"
        f"<td>{ms}</td><td data-v='{ratio}'>{ratio}</td><td>{ci}</td><td>{dms}</td><td>{dratio}</td>"
        f"<td>{_e(c.judged_on or '')}</td><td>{_e('; '.join(c.reasons))}</td></tr>"
    )
