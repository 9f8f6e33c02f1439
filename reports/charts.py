"""The charts and the frame of every HTML page the reports write: inline SVG drawn here, no
plotting library and no script for the charts.

Why hand-written SVG and not a plotting library (docs/reports.md): a page is kilobytes and opens
offline in a browser, a CI artifact viewer or a mail client; hover text is each mark's SVG
`<title>`, so the charts need no JavaScript; the page's Content-Security-Policy
forbids every fetch (`default-src 'none'`) and allows the one inline script (the table sorter) by
its hash; and the core install needs no new package. A library that writes self-contained HTML
(plotly) inlines a JavaScript bundle of several megabytes into every page and needs scripts to
draw anything.

Every string from the data goes through `esc`: model names, run labels, errors and reasons are
user-controlled text.
"""

from __future__ import annotations

import base64
import hashlib
import html
import math
from dataclasses import dataclass

STYLE = """
body{font-family:system-ui,sans-serif;margin:24px;color:#1f2328}
h1{font-size:20px} h2{font-size:16px;margin-top:28px} h3{font-size:13px;font-weight:600;margin:12px 0 0}
table{border-collapse:collapse;font-size:13px} th,td{border:1px solid #d0d7de;padding:4px 8px;text-align:left}
th{cursor:pointer;background:#f6f8fa} .chart{margin:8px 0 16px} .legend span{margin-right:12px}
.grid{display:flex;flex-wrap:wrap;gap:4px 16px} .grid h3{max-width:330px;overflow-wrap:anywhere}
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

CSP = (
    "default-src 'none'; style-src 'unsafe-inline'; "
    f"script-src 'sha256-{base64.b64encode(hashlib.sha256(SORT_JS.encode()).digest()).decode()}'"
)
"""No fetch of any kind; inline styles; the table sorter and no other script (by its hash)."""

PAGE_START = "<!DOCTYPE html><html><head><meta charset='utf-8'>"
"""How every page begins (orchestrator/commands/targets.py replaces only a file that begins so)."""

COLORS = {"baseline": "#9aa5b1", "current": "#1f6feb"}
BAR_COLOR, WHISKER_COLOR, BAND_COLOR, LINE_COLOR = "#1f6feb", "#1f2328", "#b6d4fe", "#1f6feb"


def esc(value: object) -> str:
    return html.escape(str(value), quote=True)


def page_head(title: str) -> str:
    """A page's beginning up to its <h1>: the charset, the policy that keeps it offline, the style."""
    return (
        f"{PAGE_START}<meta http-equiv='Content-Security-Policy' content=\"{CSP}\">"
        f"<title>{esc(title)}</title><style>{STYLE}</style></head><body><h1>{esc(title)}</h1>"
    )


def table_start(heads: tuple[str, ...]) -> str:
    """A table the page's sorter sorts (`table.sortable`), up to its first row: its head of
    `heads`; `TABLE_END` closes it."""
    return (
        "<table class='sortable'><thead><tr>"
        + "".join(f"<th>{h}</th>" for h in heads)
        + "</tr></thead><tbody>"
    )


TABLE_END = "</tbody></table>"


def page_end() -> str:
    """A page's end: the table sorter (the one script, allowed by its hash)."""
    return f"<script>{SORT_JS}</script></body></html>"


def _finite(value: float | None) -> bool:
    return value is not None and isinstance(value, (int, float)) and math.isfinite(value)


@dataclass(frozen=True)
class Bar:
    """One bar of an `interval_chart`: a value with its interval, or a note where there is none."""

    label: str
    value: float | None
    low: float | None = None
    high: float | None = None
    note: str = ""
    """Shown instead of the bar where there is no value (a failed cell: its status)."""
    detail: str = ""
    """Added to the hover text (how many processes the interval covers, ...)."""


def bar_chart(
    title: str,
    labels: list[str],
    series: dict[str, list[float | None]],
    unit: str,
    colors: dict[str, str] | None = None,
) -> str:
    """Grouped horizontal bars, one group per label, one bar per series; an inline <svg>."""
    colors = colors or COLORS
    bar, gap, label_w, plot_w = 12, 8, _label_width(labels), 420
    n = len(series)
    height = len(labels) * (n * bar + gap) + 30
    top = max([v for vals in series.values() for v in vals if _finite(v)] or [1.0]) or 1.0
    parts = [
        f"<h3>{esc(title)} ({esc(unit)})</h3>",
        f'<svg class="chart" role="img" width="{label_w + plot_w + 80}" height="{height}" '
        f'xmlns="http://www.w3.org/2000/svg"><title>{esc(title)}</title>',
    ]
    for i, label in enumerate(labels):
        y0 = i * (n * bar + gap) + 20
        parts.append(f'<text x="0" y="{y0 + n * bar / 2 + 4}" font-size="12">{esc(_short(label))}</text>')
        for j, (name, values) in enumerate(series.items()):
            value = values[i]
            if not _finite(value):
                continue
            w = max(1.0, plot_w * value / top)
            y = y0 + j * bar
            parts.append(
                f'<rect class="bar" data-series="{esc(name)}" x="{label_w}" y="{y}" width="{w:.1f}" '
                f'height="{bar - 2}" fill="{colors.get(name, "#555")}"><title>{esc(label)} {esc(name)}: '
                f"{value:.3f} {esc(unit)}</title></rect>"
                f'<text x="{label_w + w + 4:.1f}" y="{y + bar - 3}" font-size="10">{value:.2f}</text>'
            )
    parts.append("</svg>")
    return "".join(parts)


def interval_chart(title: str, bars: list[Bar], unit: str, reference: float = 1.0) -> str:
    """Horizontal bars from 0 to each value, its interval drawn as a whisker with end caps, and a
    dashed line at `reference` (1: no gain); an inline <svg>. Hovering a bar or its whisker shows
    its label, value and interval; a bar without a value shows its note."""
    bar, gap, label_w, plot_w, top_pad = 14, 6, _label_width([b.label for b in bars]), 420, 24
    ends = [v for b in bars for v in (b.value, b.high) if _finite(v)]
    top = max([*ends, reference]) * 1.08
    height = top_pad + len(bars) * (bar + gap) + 24

    def x(v: float) -> float:
        return label_w + plot_w * max(0.0, v) / top

    parts = [
        f"<h3>{esc(title)} ({esc(unit)})</h3>",
        f'<svg class="chart interval" role="img" width="{label_w + plot_w + 90}" height="{height}" '
        f'xmlns="http://www.w3.org/2000/svg"><title>{esc(title)}</title>',
        f'<text x="{label_w}" y="12" font-size="10">0</text>'
        f'<text x="{label_w + plot_w}" y="12" font-size="10" text-anchor="end">{top:.2f}{esc(unit)}</text>',
    ]
    for i, b in enumerate(bars):
        y = top_pad + i * (bar + gap)
        mid = y + (bar - 2) / 2
        parts.append(f'<text x="0" y="{mid + 4:.1f}" font-size="12">{esc(_short(b.label))}</text>')
        if not _finite(b.value):
            parts.append(
                f'<text class="missing" x="{label_w + 4}" y="{mid + 4:.1f}" font-size="11" fill="#cf222e">'
                f"{esc(b.note or 'no value')}<title>{esc(b.label)}: {esc(b.note or 'no value')}</title></text>"
            )
            continue
        interval = _finite(b.low) and _finite(b.high)
        hover = f"{b.label}: {b.value:.3f}{unit}" + (f" [{b.low:.3f}, {b.high:.3f}]" if interval else "")
        hover += f" {b.detail}" if b.detail else ""
        parts.append(
            f'<rect class="bar" x="{label_w}" y="{y}" width="{max(1.0, x(b.value) - label_w):.1f}" '
            f'height="{bar - 2}" fill="{BAR_COLOR}" fill-opacity="0.75"><title>{esc(hover)}</title></rect>'
        )
        right = x(b.value)
        if interval:
            lo, hi = x(b.low), x(b.high)
            right = max(right, hi)
            parts.append(
                f'<path class="whisker" d="M{lo:.1f},{mid:.1f}H{hi:.1f}M{lo:.1f},{y + 1}V{y + bar - 3}'
                f'M{hi:.1f},{y + 1}V{y + bar - 3}" stroke="{WHISKER_COLOR}" stroke-width="1.5" fill="none">'
                f"<title>{esc(hover)}</title></path>"
            )
        parts.append(f'<text x="{right + 4:.1f}" y="{mid + 4:.1f}" font-size="10">{b.value:.2f}</text>')
    ref = x(reference)
    parts.append(
        f'<line class="reference" x1="{ref:.1f}" y1="{top_pad - 4}" x2="{ref:.1f}" y2="{height - 18}" '
        f'stroke="#cf222e" stroke-dasharray="4 3"/><text x="{ref:.1f}" y="{height - 6}" font-size="10" '
        f'text-anchor="middle">{reference:g}{esc(unit)}</text></svg>'
    )
    return "".join(parts)


@dataclass(frozen=True)
class Point:
    """One run of a trend: its value and interval (None where the run has none)."""

    value: float
    low: float | None = None
    high: float | None = None


def trend_chart(title: str, runs: list[str], points: list[Point | None], unit: str) -> str:
    """One figure over the runs (oldest left): a line with its interval as a band, a point per run
    whose hover text names the run, its value and interval, and a cross at the foot of the chart
    for a run without a value, which cuts the line; an inline <svg>, small enough to sit beside
    the others."""
    left, plot_w, plot_h, top_pad = 44, 260, 90, 10
    ends = [v for p in points if p is not None for v in (p.value, p.low, p.high) if _finite(v)]
    lo, hi = (min(ends), max(ends)) if ends else (0.0, 1.0)
    if hi - lo < 1e-9:
        lo, hi = lo - 0.5, hi + 0.5
    step = plot_w / max(1, len(runs) - 1)
    foot = top_pad + plot_h

    def xy(i: int, v: float) -> tuple[float, float]:
        return left + i * step, top_pad + plot_h * (hi - v) / (hi - lo)

    parts = [
        f'<div><h3>{esc(title)}</h3><svg class="chart trend" role="img" width="{left + plot_w + 16}" '
        f'height="{foot + 30}" xmlns="http://www.w3.org/2000/svg"><title>{esc(title)} ({esc(unit)})</title>',
        f'<path d="M{left},{top_pad}V{foot}H{left + plot_w}" stroke="#999" fill="none"/>',
        f'<text x="0" y="{top_pad + 8}" font-size="10">{hi:.2f}{esc(unit)}</text>',
        f'<text x="0" y="{foot}" font-size="10">{lo:.2f}{esc(unit)}</text>',
        f'<text x="{left}" y="{foot + 14}" font-size="10">{esc(_short(runs[0], 24))}</text>',
        f'<text x="{left + plot_w}" y="{foot + 26}" font-size="10" text-anchor="end">'
        f"{esc(_short(runs[-1], 24))}</text>",
    ]
    for segment in _segments(points):
        band = [(i, p) for i, p in segment if _finite(p.low) and _finite(p.high)]
        if len(band) == len(segment):
            edge = [xy(i, p.high) for i, p in band] + [xy(i, p.low) for i, p in reversed(band)]
            if len(band) == 1:  # a run alone between gaps: its interval as a narrow box
                (x0, top), (_, bottom) = edge
                edge = [(x0 - 3, top), (x0 + 3, top), (x0 + 3, bottom), (x0 - 3, bottom)]
            parts.append(
                f'<polygon class="band" fill="{BAND_COLOR}" fill-opacity="0.6" stroke="none" '
                f'points="{" ".join(f"{a:.1f},{b:.1f}" for a, b in edge)}"/>'
            )
        line = " ".join("{:.1f},{:.1f}".format(*xy(i, p.value)) for i, p in segment)
        parts.append(
            f'<polyline class="line" fill="none" stroke="{LINE_COLOR}" stroke-width="1.5" points="{line}"/>'
        )
    for i, (run, p) in enumerate(zip(runs, points, strict=True)):
        if p is None:
            x0 = left + i * step
            parts.append(
                f'<path class="missing" d="M{x0 - 3:.1f},{foot - 3}l6,6m0,-6l-6,6" stroke="#cf222e">'
                f"<title>{esc(run)}: no ok row</title></path>"
            )
            continue
        cx, cy = xy(i, p.value)
        interval = f" [{p.low:.3f}, {p.high:.3f}]" if _finite(p.low) and _finite(p.high) else ""
        parts.append(
            f'<circle class="point" cx="{cx:.1f}" cy="{cy:.1f}" r="3" fill="{LINE_COLOR}">'
            f"<title>{esc(run)}: {p.value:.3f}{esc(unit)}{interval}</title></circle>"
        )
    parts.append("</svg></div>")
    return "".join(parts)


def _segments(points: list[Point | None]) -> list[list[tuple[int, Point]]]:
    """The runs of consecutive points with a value (a run without one cuts the line)."""
    out: list[list[tuple[int, Point]]] = [[]]
    for i, p in enumerate(points):
        if p is None or not _finite(p.value):
            if out[-1]:
                out.append([])
        else:
            out[-1].append((i, p))
    return [s for s in out if s]


def _label_width(labels: list[str]) -> int:
    return min(330, max([60, *(int(6.6 * len(_short(label))) + 12 for label in labels)]))


def _short(text: str, limit: int = 48) -> str:
    """A label cut to fit the chart (the hover text has it whole)."""
    return text if len(text) <= limit else text[: limit - 1] + "\u2026"
