"""The regression report as one self-contained HTML file: no script or style from the network,
charts drawn as inline SVG, a table sortable by a few lines of inline JavaScript, and every
string from the data escaped (model names, errors and reasons are user-controlled text).

Per hardware class a bar chart of the compiled speedup over eager per cell, baseline beside
current, and one of the cold compile times; then the cells with their verdicts and reasons.
"""

from __future__ import annotations

import html
from collections import defaultdict

from reports.regression_cells import CellChange, Comparison

COLORS = {"baseline": "#9aa5b1", "current": "#1f6feb"}
VERDICT_COLORS = {
    "regression": "#cf222e",
    "watch": "#9a6700",
    "improvement": "#1a7f37",
    "unchanged": "#57606a",
    "new": "#8250df",
    "missing": "#bc4c00",
}

STYLE = """
body{font-family:system-ui,sans-serif;margin:24px;color:#1f2328}
h1{font-size:20px} h2{font-size:16px;margin-top:28px} h3{font-size:13px;font-weight:600;margin:12px 0 0}
table{border-collapse:collapse;font-size:13px} th,td{border:1px solid #d0d7de;padding:4px 8px;text-align:left}
th{cursor:pointer;background:#f6f8fa} .chart{margin:8px 0 16px} .legend span{margin-right:12px}
"""

SORT_JS = """
document.querySelectorAll('table.sortable th').forEach(function (th, col) {
  th.addEventListener('click', function () {
    var body = th.closest('table').tBodies[0];
    var rows = Array.prototype.slice.call(body.rows);
    var asc = th.dataset.asc !== 'true'; th.dataset.asc = asc;
    rows.sort(function (a, b) {
      var x = a.cells[col].dataset.v || a.cells[col].textContent;
      var y = b.cells[col].dataset.v || b.cells[col].textContent;
      var nx = parseFloat(x), ny = parseFloat(y);
      var c = (!isNaN(nx) && !isNaN(ny)) ? nx - ny : x.localeCompare(y);
      return asc ? c : -c;
    });
    rows.forEach(function (r) { body.appendChild(r); });
  });
});
"""


PALETTE = ("#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf")


def _e(value: object) -> str:
    return html.escape(str(value), quote=True)


def bar_chart(title: str, labels: list[str], series: dict[str, list[float | None]], unit: str) -> str:
    """Grouped horizontal bars, one group per label, one bar per series; an inline <svg>."""
    bar, gap, label_w, plot_w = 12, 8, 260, 420
    n = len(series)
    height = len(labels) * (n * bar + gap) + 30
    top = max([v for vals in series.values() for v in vals if v is not None] or [1.0])
    parts = [
        f"<h3>{_e(title)} ({_e(unit)})</h3>",
        f'<svg class="chart" role="img" width="{label_w + plot_w + 80}" height="{height}" '
        f'xmlns="http://www.w3.org/2000/svg"><title>{_e(title)}</title>',
    ]
    for i, label in enumerate(labels):
        y0 = i * (n * bar + gap) + 20
        parts.append(f'<text x="0" y="{y0 + n * bar / 2 + 4}" font-size="12">{_e(label)}</text>')
        for j, (name, values) in enumerate(series.items()):
            value = values[i]
            if value is None:
                continue
            w = max(1.0, plot_w * value / top)
            y = y0 + j * bar
            parts.append(
                f'<rect class="bar" data-series="{_e(name)}" x="{label_w}" y="{y}" width="{w:.1f}" '
                f'height="{bar - 2}" fill="{COLORS.get(name, "#555")}"><title>{_e(label)} {_e(name)}: '
                f"{value:.3f} {_e(unit)}</title></rect>"
                f'<text x="{label_w + w + 4:.1f}" y="{y + bar - 3}" font-size="10">{value:.2f}</text>'
            )
    parts.append("</svg>")
    return "".join(parts)


def trend_chart(title: str, runs: list[str], series: dict[str, list[float | None]], unit: str) -> str:
    """One line per series over the runs (oldest left), a gap where a run has no value; an inline
    <svg> with a labelled y range and the first and last run names on the x axis."""
    left, plot_w, plot_h, top_pad = 60, 520, 160, 20
    values = [v for vals in series.values() for v in vals if v is not None]
    lo, hi = (min(values), max(values)) if values else (0.0, 1.0)
    if hi - lo < 1e-9:
        lo, hi = lo - 0.5, hi + 0.5
    step = plot_w / max(1, len(runs) - 1)

    def xy(i: int, v: float) -> str:
        return f"{left + i * step:.1f},{top_pad + plot_h * (hi - v) / (hi - lo):.1f}"

    legend_h = 14 * len(series)
    parts = [
        f"<h3>{_e(title)} ({_e(unit)})</h3>",
        f'<svg class="chart trend" role="img" width="{left + plot_w + 20}" '
        f'height="{top_pad + plot_h + 40 + legend_h}" xmlns="http://www.w3.org/2000/svg"><title>{_e(title)}</title>',
        f'<line x1="{left}" y1="{top_pad}" x2="{left}" y2="{top_pad + plot_h}" stroke="#999"/>',
        f'<line x1="{left}" y1="{top_pad + plot_h}" x2="{left + plot_w}" y2="{top_pad + plot_h}" stroke="#999"/>',
        f'<text x="0" y="{top_pad + 4}" font-size="10">{hi:.2f}</text>',
        f'<text x="0" y="{top_pad + plot_h}" font-size="10">{lo:.2f}</text>',
        f'<text x="{left}" y="{top_pad + plot_h + 14}" font-size="10">{_e(runs[0])}</text>',
        f'<text x="{left + plot_w}" y="{top_pad + plot_h + 14}" font-size="10" text-anchor="end">'
        f"{_e(runs[-1])}</text>",
    ]
    for n, (name, vals) in enumerate(series.items()):
        color = PALETTE[n % len(PALETTE)]
        segment: list[str] = []
        for i, v in enumerate([*vals, None]):  # a None ends a segment
            if v is not None:
                segment.append(xy(i, v))
                parts.append(
                    f'<circle class="point" cx="{xy(i, v).split(",")[0]}" cy="{xy(i, v).split(",")[1]}" r="2.5" '
                    f'fill="{color}"><title>{_e(name)} {_e(runs[i])}: {v:.3f} {_e(unit)}</title></circle>'
                )
            elif segment:
                parts.append(
                    f'<polyline class="line" data-series="{_e(name)}" fill="none" stroke="{color}" '
                    f'stroke-width="1.5" points="{" ".join(segment)}"/>'
                )
                segment = []
        y = top_pad + plot_h + 30 + 14 * n
        parts.append(f'<text x="{left}" y="{y}" font-size="11" fill="{color}">&#9632; {_e(name)}</text>')
    parts.append("</svg>")
    return "".join(parts)


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
    """The page's head (title, style), the counts per verdict and the thresholds used."""
    counts = comparison.counts()
    return [
        "<!DOCTYPE html><html><head><meta charset='utf-8'>",
        f"<title>{_e(title)}</title><style>{STYLE}</style></head><body>",
        f"<h1>{_e(title)}</h1>",
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
    """History mode: per hardware class, every cell's speedup over the runs compared."""
    if not comparison.trend:
        return []
    runs = [label for label, _ in next(iter(comparison.trend.values()))]
    out = [f"<h2>Trend over the last {len(runs)} runs</h2>"]
    by_hw: dict[str, dict[str, list[float | None]]] = defaultdict(dict)
    for name, points in comparison.trend.items():
        hw, rest = name.split("/", 1)
        by_hw[hw][rest] = [v for _, v in points]
    for hw, series in sorted(by_hw.items()):
        out.append(trend_chart(f"{hw}: speedup over eager, per run", runs, series, "x"))
    return out


def _cells_table(comparison: Comparison) -> list[str]:
    """Every cell with its verdict, latencies, ratios and reasons, in a sortable table; the page's
    end."""
    out = ["<h2>Cells</h2><table class='sortable'><thead><tr>"]
    heads = (
        "cell",
        "verdict",
        "compiled ms",
        "current / baseline",
        "95% CI",
        "device ms",
        "device ratio [95% CI]",
    )
    for head in (*heads, "judged on", "reasons"):
        out.append(f"<th>{head}</th>")
    out.append("</tr></thead><tbody>")
    out += [_cell_row(c) for c in comparison.cells]
    out.append(f"</tbody></table><script>{SORT_JS}</script></body></html>")
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
