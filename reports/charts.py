"""The charts and the frame of every HTML page the reports write: inline SVG, no plotting library
and no script for the charts. Here the geometry (axes, bars, whiskers, marks) is computed into
plain values; the markup is `reports/templates/` (jinja2 with autoescaping: every string from
the data, model names, run labels, errors and reasons, is escaped by the template engine, none
by hand).

Why hand-written SVG and not a plotting library (docs/reports.md): a page is kilobytes and opens
offline in a browser, a CI artifact viewer or a mail client; hover text is each mark's SVG
`<title>`, so the charts need no JavaScript; the page's Content-Security-Policy forbids every
fetch (`default-src 'none'`) and allows the one inline script (the table sorter) by its hash.

The speedup charts (`interval_chart`) draw on a log axis with 1-2-5 ticks (or finer, at least
four) and a dashed line at 1x; a bar grows from 1x to its value, its 95% interval a whisker. A
doubted figure (`compiler.statistics.timing_doubts`) is drawn pale and hatched with the
`compiler.statistics.MARK` beside it, and its reasons listed under the chart; an interval that
holds 1x gets a "≈1x" mark. A row without a value is not drawn: it is listed under the chart.
"""

from __future__ import annotations

import base64
import hashlib
import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

import jinja2
from markupsafe import Markup

from compiler import statistics as cstats
from compiler.hardware import CPU_CLASS
from reports.axes import LogAxis, Tick, linear_ticks

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
"""How every page begins (orchestrator/commands/targets.py replaces only a file that begins so;
templates/page.html.j2 begins so)."""

TEMPLATES = Path(__file__).with_name("templates")
COLORS = {"baseline": "#9aa5b1", "current": "#1f6feb"}
BAR_COLOR, WHISKER_COLOR, BAND_COLOR, LINE_COLOR = "#1f6feb", "#1f2328", "#b6d4fe", "#1f6feb"
CROSSES = "\u22481x"
"""The mark beside a figure whose 95% interval holds 1x."""


@cache
def environment() -> jinja2.Environment:
    """The pages' template engine: autoescaping on every template, undefined names an error."""
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(TEMPLATES),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.globals.update(CSP=CSP, SORT_JS=Markup(SORT_JS), MARK=cstats.MARK, CROSSES=CROSSES)
    env.globals.update(WHISKER_COLOR=WHISKER_COLOR, BAND_COLOR=BAND_COLOR, LINE_COLOR=LINE_COLOR)
    return env


def render(template: str, **context: object) -> str:
    """A page from its template (`reports/templates/`), every value escaped by the engine."""
    return environment().get_template(template).render(**context)


def class_label(hardware: str, device_names: Iterable[str | None] = ()) -> str:
    """A hardware class as what it is: "CPU: AMD EPYC 7B13" or "GPU: NVIDIA H100 80GB HBM3" (the
    class's name added where the device's does not hold it, the class alone where no row names
    its device)."""
    kind = "CPU" if str(hardware) == CPU_CLASS else "GPU"
    names = sorted({str(n).strip() for n in device_names if n and str(n).strip()})
    if not names:
        return kind if kind == "CPU" else f"GPU: {hardware}"
    text = f"{kind}: {', '.join(names)}"
    return text if kind == "CPU" or any(str(hardware) in n for n in names) else f"{text} (class {hardware})"


def _finite(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def fmt_x(value: float) -> str:
    """A ratio as a chart labels it: 0.97, 4.95, 19.3, 193."""
    return f"{value:.2f}" if abs(value) < 10 else f"{value:.1f}" if abs(value) < 100 else f"{value:.0f}"


# --- bars with intervals ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Bar:
    """One bar of an `interval_chart`: a value with its interval, or a note where there is none
    (the row is then listed under the chart, not drawn)."""

    label: str
    value: float | None
    low: float | None = None
    high: float | None = None
    note: str = ""
    """Why there is no value (a failed cell: its status)."""
    detail: str = ""
    """Added to the hover text (how many processes the interval covers, ...)."""
    doubts: tuple[str, ...] = ()
    """Why the figure's timing is doubted (`compiler.statistics.timing_doubts`); empty: trusted."""
    series: str = ""
    """Which series of a chart of several (its legend name); "" for a chart of one."""
    color: str = ""
    """The bar's colour where not its series' (a verdict's)."""


@dataclass(frozen=True)
class DrawnBar:
    series: str
    x: float
    y: float
    width: float
    height: float
    color: str
    hover: str
    whisker: str
    """The whisker's SVG path ("" where the bar has no interval)."""
    text: str
    text_x: float
    text_y: float
    doubted: bool
    crosses: bool


@dataclass(frozen=True)
class Row:
    label: str
    short: str
    y: float
    text_y: float
    bars: list[DrawnBar]


@dataclass
class Frame:
    """What every chart with an axis has: its title and unit, its size, the plot's top and bottom,
    and the axis ticks."""

    title: str
    unit: str
    width: int
    height: int
    top: float
    bottom: float
    ticks: list[Tick]


@dataclass
class IntervalChart(Frame):
    """An `interval_chart`'s geometry: what templates/charts.html.j2 draws."""

    reference: float
    reference_label: str
    rows: list[Row]
    hatch: str
    legend: dict[str, str] = field(default_factory=dict)
    doubted: list[tuple[str, str]] = field(default_factory=list)
    """(label, reasons) of every doubted bar, listed under the chart."""
    missing: list[tuple[str, str]] = field(default_factory=list)
    """(label, why) of every bar without a value, listed under the chart, not drawn."""
    crosses: int = 0
    """How many bars have an interval that holds 1x."""

    @property
    def bars(self) -> int:
        return sum(len(r.bars) for r in self.rows)


def _hover(b: Bar, unit: str, crosses: bool) -> str:
    interval = _finite(b.low) and _finite(b.high)
    text = f"{b.label}: {b.value:.3f}{unit}" + (
        f" [{b.low:.3f}, {b.high:.3f}]" if interval else " (no interval)"
    )
    text += f" {b.detail}" if b.detail else ""
    if crosses:
        text += f"; {CROSSES}: the interval holds 1x"
    if b.doubts:
        text += f"; {cstats.MARK} timing doubted: {cstats.doubt_text(list(b.doubts))}"
    return text


def _drawn(b: Bar, axis: LogAxis, y: float, height: float, unit: str, colors: dict[str, str]) -> DrawnBar:
    """One bar from 1x to its value, its whisker with end caps, and its value's text."""
    one, at = axis.x(1.0), axis.x(b.value)
    interval = _finite(b.low) and _finite(b.high) and b.low > 0
    crosses = bool(interval and b.low <= 1.0 <= b.high)
    whisker, right = "", max(at, one)
    if interval:
        lo, hi = axis.x(b.low), axis.x(b.high)
        right = max(right, hi)
        caps = f"V{y + height - 1:.1f}"  # each end's cap, top to bottom
        whisker = f"M{lo},{y + height / 2:.1f}H{hi}M{lo},{y + 1:.1f}{caps}M{hi},{y + 1:.1f}{caps}"
    return DrawnBar(
        series=b.series,
        x=min(one, at),
        y=round(y, 1),
        width=round(max(1.0, abs(at - one)), 1),
        height=height,
        color=b.color or colors.get(b.series, BAR_COLOR),
        hover=_hover(b, unit, crosses),
        whisker=whisker,
        text=f"{fmt_x(b.value)}{unit}",
        text_x=round(right + 4, 1),
        text_y=round(y + height / 2 + 3.5, 1),
        doubted=bool(b.doubts),
        crosses=crosses,
    )


def interval_chart(
    title: str, bars: list[Bar], unit: str = "x", legend: dict[str, str] | None = None
) -> IntervalChart:
    """Horizontal bars on a log axis, one row per label (bars of one label, one per series, in a
    row), each from 1x to its value with its interval as a whisker; a dashed line at 1x (no gain).
    Bars without a value are listed (`missing`), not drawn; a row is drawn where it has one."""
    legend = legend or {}
    drawn = [b for b in bars if _finite(b.value) and b.value > 0]
    missing = [b for b in bars if not (_finite(b.value) and b.value > 0)]
    labels = list(dict.fromkeys(b.label for b in drawn))
    per_row = max(1, max((sum(b.label == label for b in drawn) for label in labels), default=1))
    bar_h, gap, top, label_w, plot_w = 12, 8, 30.0, _label_width(labels), 440
    axis = LogAxis.over([v for b in drawn for v in (b.value, b.low, b.high)], label_w + 8, plot_w)
    rows, y = [], top
    for label in labels:
        mine = [b for b in drawn if b.label == label]
        row_bars = [_drawn(b, axis, y + i * (bar_h + 2), bar_h, unit, legend) for i, b in enumerate(mine)]
        rows.append(Row(label, _short(label), y, round(y + len(mine) * (bar_h + 2) / 2 + 3, 1), row_bars))
        y += per_row * (bar_h + 2) + gap
    bottom = y
    return IntervalChart(
        title=title,
        unit=unit,
        width=int(label_w + 8 + plot_w + 150),
        height=int(bottom + 20),
        top=top,
        bottom=bottom,
        ticks=axis.ticks(unit),
        reference=axis.x(1.0),
        reference_label=f"1{unit}",
        rows=rows,
        hatch="hatch-" + hashlib.sha1(title.encode()).hexdigest()[:10],
        legend=legend,
        doubted=[(_named(b), cstats.doubt_text(list(b.doubts))) for b in drawn if b.doubts],
        missing=[(_named(b), b.note or "no value") for b in missing],
        crosses=sum(d.crosses for r in rows for d in r.bars),
    )


def _named(b: Bar) -> str:
    return f"{b.label} ({b.series})" if b.series else b.label


# --- single measurements: dots ----------------------------------------------------------------------


@dataclass(frozen=True)
class Dot:
    series: str
    cx: float
    color: str
    hover: str
    ring: bool = False
    """Drawn as a ring (the first series of several: a later dot on the same spot stays seen)."""


@dataclass(frozen=True)
class DotRow:
    label: str
    short: str
    y: float
    dots: list[Dot]
    link: tuple[float, float] | None
    """The line between a row's first and last dot (baseline to current), where it has two."""


@dataclass
class DotChart(Frame):
    """A `dot_chart`'s geometry: once-a-run figures as dots, no interval."""

    rows: list[DotRow]
    legend: dict[str, str]
    missing: list[tuple[str, str]]


def dot_chart(
    title: str, labels: list[str], series: dict[str, list[float | None]], unit: str, colors: dict[str, str]
) -> DotChart:
    """Figures measured once per cell (a compile time): a dot per series on a row per label, on a
    linear axis from 0, with no interval to draw; a label with no figure is listed, not drawn."""
    label_w, plot_w, top, step = _label_width(labels), 440, 26.0, 18
    values = [v for vals in series.values() for v in vals if _finite(v)]
    end, ticks = linear_ticks(max(values, default=1.0), unit, label_w + 8, plot_w)
    rows, missing, y = [], [], top
    for i, label in enumerate(labels):
        dots = [
            Dot(
                name,
                round(label_w + 8 + plot_w * vals[i] / end, 1),
                colors.get(name, "#555"),
                f"{label} {name}: {vals[i]:.2f} {unit}",
                ring=n == 0 and len(series) > 1,
            )
            for n, (name, vals) in enumerate(series.items())
            if _finite(vals[i])
        ]
        if not dots:
            missing.append((label, "not measured"))
            continue
        link = (dots[0].cx, dots[-1].cx) if len(dots) > 1 else None
        rows.append(DotRow(label, _short(label), round(y + step / 2, 1), dots, link))
        y += step
    return DotChart(
        title, unit, int(label_w + 8 + plot_w + 40), int(y + 12), top, y, ticks, rows, colors, missing
    )


# --- trends -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Point:
    """One run of a trend: its value and interval (None where the run has none)."""

    value: float
    low: float | None = None
    high: float | None = None


@dataclass
class TrendChart:
    title: str
    unit: str
    left: int
    width: int
    top: int
    foot: int
    plot_w: int
    high_label: str
    low_label: str
    first_run: str
    last_run: str
    bands: list[str]
    lines: list[str]
    points: list[tuple[float, float, str]]
    crosses: list[tuple[float, str]]


def trend_chart(title: str, runs: list[str], points: list[Point | None], unit: str) -> TrendChart:
    """One figure over the runs (oldest left): a line with its interval as a band, a point per run
    whose hover text names the run, its value and interval, and a cross at the foot of the chart
    for a run without a value, which cuts the line; small enough to sit beside the others."""
    left, plot_w, plot_h, top_pad = 44, 260, 90, 10
    ends = [v for p in points if p is not None for v in (p.value, p.low, p.high) if _finite(v)]
    lo, hi = (min(ends), max(ends)) if ends else (0.0, 1.0)
    if hi - lo < 1e-9:
        lo, hi = lo - 0.5, hi + 0.5
    step = plot_w / max(1, len(runs) - 1)
    foot = top_pad + plot_h

    def xy(i: int, v: float) -> tuple[float, float]:
        return left + i * step, top_pad + plot_h * (hi - v) / (hi - lo)

    bands, lines = [], []
    for segment in _segments(points):
        band = [(i, p) for i, p in segment if _finite(p.low) and _finite(p.high)]
        if len(band) == len(segment):
            edge = [xy(i, p.high) for i, p in band] + [xy(i, p.low) for i, p in reversed(band)]
            if len(band) == 1:  # a run alone between gaps: its interval as a narrow box
                (x0, up), (_, down) = edge
                edge = [(x0 - 3, up), (x0 + 3, up), (x0 + 3, down), (x0 - 3, down)]
            bands.append(" ".join(f"{a:.1f},{b:.1f}" for a, b in edge))
        lines.append(" ".join("{:.1f},{:.1f}".format(*xy(i, p.value)) for i, p in segment))
    drawn, crosses = [], []
    for i, (run, p) in enumerate(zip(runs, points, strict=True)):
        if p is None:
            crosses.append((round(left + i * step, 1), f"{run}: no ok row"))
            continue
        interval = f" [{p.low:.3f}, {p.high:.3f}]" if _finite(p.low) and _finite(p.high) else ""
        cx, cy = xy(i, p.value)
        drawn.append((round(cx, 1), round(cy, 1), f"{run}: {p.value:.3f}{unit}{interval}"))
    return TrendChart(
        title=title,
        unit=unit,
        left=left,
        width=left + plot_w + 16,
        top=top_pad,
        foot=foot,
        plot_w=plot_w,
        high_label=f"{hi:.2f}{unit}",
        low_label=f"{lo:.2f}{unit}",
        first_run=_short(runs[0], 24),
        last_run=_short(runs[-1], 24),
        bands=bands,
        lines=lines,
        points=drawn,
        crosses=crosses,
    )


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


# --- tables -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Td:
    """One cell of a page's table: its text, the value it sorts by, its hover text, its colour."""

    text: object = "-"
    sort: object = None
    title: str = ""
    color: str = ""


def _label_width(labels: list[str]) -> int:
    return min(330, max([60, *(int(6.6 * len(_short(label))) + 12 for label in labels)]))


def _short(text: str, limit: int = 48) -> str:
    """A label cut to fit the chart (the hover text has it whole)."""
    return text if len(text) <= limit else text[: limit - 1] + "\u2026"
