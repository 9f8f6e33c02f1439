"""The report, presets and regression pages as a person sees them: each rendered in headless
Chromium (driven over DevTools, `tests.pages.Browser`: one launch for the three pages and a
control), screenshotted whole, and judged on its layout and pixels: every speedup axis is
log-scaled with at least four ticks and a 1x line; every bar has its whisker, drawn where the
bar ends; no chart row is empty (a cell without a figure is listed under its chart instead);
doubted timings and intervals that hold 1x carry their marks; classes are named by what they are;
and the page fetches nothing and breaks no rule of its policy.

The pages come from real outputs: one run's rows measured as a job measures them, written by the
result sink (`tests.pages`), with a cell out of memory, one as fast as eager, one whose cores
were shared while it timed (doubted under the project's thresholds, not the suite's trusting
ones), and a CPU class named by its CPU; `report --html` and `presets --html` write the first two
pages, and the third compares three such runs (the last slower on two cells, one cell gone).
Needs Debian's `chromium`; without it every test here is skipped and says why."""

from __future__ import annotations

import json
import math
import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest

from compiler.statistics.thresholds import THRESHOLDS_ENV
from orchestrator.cli import main
from reports.regression import compare_history
from reports.regression.html import render_html, row_facts
from reports.run_cells import run_cells
from store.schema import read_results, rows_to_table
from tests.pages import Browser, browser, measured_rows, png_pixels, png_size, write_output

FAILED, NEAR_ONE, DOUBTED = "A100/resnet/bs4/fp32/ro", "cpu/mlp/bs1/fp32/default", "A100/mlp/bs4/fp32/default"
CPU = "AMD EPYC 7B13 64-Core Processor"
GONE, SLOWER = "cpu/mlp/bs4/fp32/tuned", {"cpu/mlp/bs1/fp32/ro": 1.3, "cpu/resnet/bs4/fp32/tuned": 1.25}

# What a person sees of a page's charts, measured by the browser after layout (CSS pixels).
GEOMETRY = r"""(() => {
  const box = e => { const b = e.getBoundingClientRect(); return {x: b.left, y: b.top, w: b.width, h: b.height}; };
  const seen = e => e && getComputedStyle(e).visibility !== 'hidden' && (box(e).w > 0 || box(e).h > 0);
  const own = e => [...e.childNodes].filter(n => n.nodeType === 3).map(n => n.textContent).join('');
  return [...document.querySelectorAll('svg.chart')].map(svg => ({
    kind: svg.getAttribute('class'), scale: svg.dataset.scale || '', box: box(svg),
    title: svg.querySelector('title').textContent,
    ticks: [...svg.querySelectorAll('text.tick')].map(t => ({v: +t.dataset.v, text: t.textContent, box: box(t)})),
    reference: [...svg.querySelectorAll('line.reference')].map(box),
    rows: [...svg.querySelectorAll('g.row')].map(g => ({
      label: g.dataset.label, shown: own(g.querySelector('text.label')),
      dots: [...g.querySelectorAll('circle.dot')].filter(seen).length,
      marks: [...g.querySelectorAll('g.mark')].map(m => {
        const bar = m.querySelector('rect.bar'), whisker = m.querySelector('path.whisker');
        const center = bar && box(bar);
        const top = center && document.elementFromPoint(center.x + center.w / 2, center.y + 3);
        return {
          bar: bar && seen(bar) ? box(bar) : null,
          value: bar ? bar.querySelector('title').textContent : '',
          on_top: !!top && (top === bar || top.classList.contains('hatch')),
          opacity: bar ? +getComputedStyle(bar).fillOpacity : 0,
          hatched: !!m.querySelector('rect.hatch'),
          whisker: whisker && seen(whisker) ? box(whisker) : null,
          badges: [...m.querySelectorAll('tspan.badge')].filter(seen).map(t => t.textContent.trim()),
        };
      }),
    })),
  }));
})()"""

PAGE_FACTS = r"""({
  text: document.body.innerText,
  headings: [...document.querySelectorAll('h2, h3')].map(h => h.innerText),
  missing: [...document.querySelectorAll('li.missing')].map(li => li.innerText),
  doubts: [...document.querySelectorAll('li.doubt')].map(li => li.innerText),
  width: document.documentElement.scrollWidth,
})"""


@dataclass
class Seen:
    charts: list[dict]
    facts: dict
    shot: Path
    crop: tuple[dict, Path]
    """The first interval chart's geometry and a screenshot of just that chart."""
    requests: list[str]
    messages: list[str]
    uri: str


def _outputs(work: Path, table_jobs, make_result) -> dict[str, Path]:
    """The three pages, written as the commands write them (the regression page with its rows'
    doubts, which the comparison alone does not carry)."""
    marked = dict(near_one=NEAR_ONE, doubted=DOUBTED, cpu_name=CPU)
    out = write_output(work / "run", measured_rows(table_jobs, make_result, 1, failed=FAILED, **marked))
    pages = {name: work / f"{name}.html" for name in ("report", "presets", "regression")}
    assert main(["report", str(out), "--html", str(pages["report"])]) == 0
    sweep = Path(shutil.copytree(out, work / "sweep"))
    assert main(["presets", str(sweep), "--html", str(pages["presets"])]) == 0
    nights = [
        write_output(work / f"night{n}", measured_rows(table_jobs, make_result, 20 + n, cpu_name=CPU))
        for n in range(2)
    ]
    last = measured_rows(table_jobs, make_result, 30, failed=FAILED, slower=SLOWER, drop=(GONE,), **marked)
    nights.append(write_output(work / "night2", last))
    runs = [read_results(n) for n in nights]
    comparison = compare_history(
        runs, labels=["2026-11-20T020000Z", "2026-11-21T020000Z", "2026-11-22T020000Z"]
    )
    pages["regression"].write_text(render_html(comparison, "Nightly", row_facts(runs[-1], runs[-2])))
    return pages


@pytest.fixture(scope="session")  # once a process: tests/conftest.py may part this file's tests
def seen(tmp_path_factory, table_jobs, make_result) -> dict[str, Seen]:
    """The pages and the control, each as the browser showed it (one launch for all)."""
    browser()  # skips here, before anything is rendered, where there is no chromium
    work = tmp_path_factory.mktemp("pages")
    with pytest.MonkeyPatch.context() as patch:
        patch.delenv(THRESHOLDS_ENV, raising=False)  # the project's own limits: DOUBTED is doubted
        pages = _outputs(work, table_jobs, make_result)
        pages["control"] = work / "control.html"
        pages["control"].write_text(CONTROL)
    found = {}
    with Browser(work) as chromium:
        for name, page in pages.items():
            tab = chromium.open(page)
            charts = chromium.see(tab, GEOMETRY)
            first = next((c for c in charts if "interval" in c["kind"]), None)
            crop = work / f"{name}-chart.png"
            if first is not None:
                box = first["box"]
                chromium.clip(
                    tab, crop, {"x": box["x"], "y": box["y"], "width": box["w"], "height": box["h"]}
                )
            found[name] = Seen(
                charts=charts,
                facts=chromium.see(tab, PAGE_FACTS),
                shot=chromium.screenshot(tab, work / f"{name}.png"),
                crop=(first, crop),
                requests=chromium.requests(tab),
                messages=chromium.messages(tab),
                uri=page.as_uri(),
            )
    presets = json.loads((work / "sweep" / "presets.json").read_text())["presets"]
    found["presets"].facts["presets"] = len(presets)
    return found


CONTROL = (
    "<!DOCTYPE html><html><head><meta http-equiv='Content-Security-Policy' content=\"default-src 'none'\">"
    "</head><body><script>document.title = 'ran'</script><p>control</p></body></html>"
)
"""A page whose inline script its policy blocks: the message check below can fail."""

PAGES = ("report", "presets", "regression")


def _interval_charts(page: Seen) -> list[dict]:
    return [c for c in page.charts if "interval" in c["kind"]]


def _rows(page: Seen) -> dict[str, dict]:
    """The rows of a page's interval charts by class and label ("A100/mlp bs1 fp32 ro"): the
    sweep's two classes, A100 (named by its GPU) and cpu (by its CPU)."""
    return {
        f"{'A100' if c['title'].startswith('GPU: ') else 'cpu'}/{r['label']}": r
        for c in _interval_charts(page)
        for r in c["rows"]
    }


def test_every_speedup_axis_is_log_scaled_with_at_least_four_ticks_and_a_1x_line(seen):
    for name in PAGES:
        charts = _interval_charts(seen[name])
        assert charts, name
        for chart in charts:
            ticks = chart["ticks"]
            assert chart["scale"] == "log" and len(ticks) >= 4, (name, chart["title"], ticks)
            assert 1.0 in [t["v"] for t in ticks], (name, chart["title"])
            centers = [(t["v"], t["box"]["x"] + t["box"]["w"] / 2) for t in ticks]
            (v0, x0), (v1, x1) = centers[0], centers[-1]
            per_log = (x1 - x0) / math.log(v1 / v0)
            for v, x in centers:  # where log(value) puts it, to a pixel
                assert x == pytest.approx(x0 + per_log * math.log(v / v0), abs=1.0), (name, chart["title"], v)
            for t in ticks:  # each tick's label reads as its value, and none covers the next
                assert t["text"] == f"{t['v']:g}x" and t["box"]["w"] > 0
            for a, b in zip(ticks, ticks[1:], strict=False):
                assert a["box"]["x"] + a["box"]["w"] < b["box"]["x"], (
                    name,
                    chart["title"],
                    a["text"],
                    b["text"],
                )
            (line,) = chart["reference"]  # the dashed 1x line, where 1 sits on the axis
            assert line["x"] + line["w"] / 2 == pytest.approx(x0 + per_log * math.log(1 / v0), abs=1.5)


def test_every_bar_has_its_whisker_where_the_bar_ends(seen):
    for name in PAGES:
        marks = [m for c in _interval_charts(seen[name]) for r in c["rows"] for m in r["marks"]]
        assert len(marks) >= 14, name
        for m in marks:
            bar, whisker = m["bar"], m["whisker"]
            assert bar is not None and bar["w"] >= 1 and bar["h"] >= 8, (name, m["value"])
            assert m["on_top"] or bar["w"] < 3, (
                name,
                m["value"],
            )  # nothing is drawn over it (its 1x end aside)
            assert whisker is not None and whisker["h"] >= 8, (name, m["value"])
            # the bar runs from 1x to its value: one of its ends is the value, inside the whisker
            ends = (bar["x"], bar["x"] + bar["w"])
            assert any(whisker["x"] - 1.5 <= e <= whisker["x"] + whisker["w"] + 1.5 for e in ends), (name, m)


def test_no_chart_row_is_empty_and_cells_without_a_figure_are_listed_under_it(seen):
    for name in PAGES:
        for chart in seen[name].charts:
            for row in chart["rows"]:
                drawn = sum(m["bar"] is not None for m in row["marks"]) + row["dots"]
                assert row["shown"].strip() and drawn, (name, chart["title"], row["label"])
    failed = "resnet bs4 fp32 ro"
    report = seen["report"]
    assert f"A100/{failed}" not in _rows(report) and f"cpu/{failed}" in _rows(report)
    assert f"not drawn: {failed}: oom" in report.facts["missing"]
    regression = seen["regression"]
    drawn = _rows(regression)
    assert f"A100/{failed}" not in drawn and "cpu/mlp bs4 fp32 tuned" not in drawn  # FAILED, and GONE
    assert len(drawn) == 2 * 12 - 2
    listed = "\n".join(regression.facts["missing"])
    assert f"{failed}: regression: ok -> oom" in listed and "mlp bs4 fp32 tuned: missing" in listed


def test_doubted_timings_and_intervals_that_hold_1x_are_marked_where_a_person_looks(
    seen, table_jobs, make_result
):
    with pytest.MonkeyPatch.context() as patch:  # the report page's cells, as reports.run_cells has them
        patch.delenv(THRESHOLDS_ENV, raising=False)
        marked = dict(near_one=NEAR_ONE, doubted=DOUBTED, cpu_name=CPU)
        cells = run_cells(rows_to_table(measured_rows(table_jobs, make_result, 1, failed=FAILED, **marked)))
    report = seen["report"]
    marks = {key: r["marks"][0] for key, r in _rows(report).items()}
    doubted = marks["A100/mlp bs4 fp32 default"]
    assert "!" in doubted["badges"] and doubted["hatched"] and doubted["opacity"] < 0.5  # pale, hatched
    assert "timing doubted" in doubted["value"] and "other processes took 60%" in doubted["value"]
    assert any(
        "mlp bs4 fp32 default: timing doubted: other processes took 60%" in d for d in report.facts["doubts"]
    )
    crossing = [c for c in cells if c.crosses_one]
    assert NEAR_ONE in [c.name for c in crossing]
    assert sum("\u22481x" in m["badges"] for m in marks.values()) == len(crossing)
    for c in cells:  # every mark is the cell's own
        if c.speedup is not None:
            got = marks[f"{c.row['hardware']}/{c.label}"]
            assert ("!" in got["badges"]) == c.doubted and ("\u22481x" in got["badges"]) == c.crosses_one, (
                c.name
            )
    regression = seen["regression"]
    marked = [key for key, r in _rows(regression).items() if "!" in r["marks"][0]["badges"]]
    assert marked == ["A100/mlp bs4 fp32 default"]
    assert "current: other processes took 60%" in "\n".join(regression.facts["doubts"])


def test_classes_are_named_by_what_they_are(seen):
    for name in ("report", "regression"):
        headings = seen[name].facts["headings"]
        assert "GPU: NVIDIA A100-SXM4-80GB" in headings and f"CPU: {CPU}" in headings, (name, headings)
    # deployed.json names the device of its first preset only: the other class is named as a CPU
    titles = [c["title"] for c in _interval_charts(seen["presets"])]
    assert titles[0].startswith("GPU: NVIDIA A100-SXM4-80GB, ") and titles[1].startswith("CPU"), titles
    assert "gpu NVIDIA" not in seen["presets"].facts["text"]


def test_the_presets_page_charts_the_gain_over_stock_eager_and_over_stock_compile_with_intervals(seen):
    charts = _interval_charts(seen["presets"])
    rows = [r for c in charts for r in c["rows"]]
    assert len(rows) == seen["presets"].facts["presets"] == 7  # DOUBTED's cell has none: undecided
    for row in rows:
        eager, compiled = row["marks"]
        assert "over stock eager" in eager["value"] and "over stock torch.compile" in compiled["value"]
        assert eager["whisker"] and compiled["whisker"]
    assert any(float(m["value"].split(": ")[1].split("x")[0]) > 1.5 for r in rows for m in r["marks"][:1])


def _pixel(rows: list[bytes], origin: dict, x: float, y: float) -> tuple[int, ...]:
    """The RGB of the page's point (x, y) in a screenshot of the part from `origin`."""
    px, py = int(x - origin["x"]), int(y - origin["y"])
    return tuple(rows[py][3 * px : 3 * px + 3])


def test_the_screenshots_show_the_charts_bars_and_whiskers(seen):
    for name in PAGES:
        page = seen[name]
        width, height = png_size(page.shot)
        assert width == 1200 and height > 800 and page.shot.stat().st_size > 30_000, name
        chart, crop = page.crop
        w, _, rows = png_pixels(crop)
        origin = chart["box"]
        for row in chart["rows"]:
            for m in row["marks"]:
                bar, whisker = m["bar"], m["whisker"]
                if bar["w"] >= 4:  # the bar's middle is painted, not page white
                    middle = _pixel(rows, origin, bar["x"] + bar["w"] / 2, bar["y"] + bar["h"] / 2)
                    assert middle != (255, 255, 255), (name, m["value"])
                # the whisker's end caps: dark strokes at its two ends, above its middle line
                cap = whisker["y"] + whisker["h"] / 2 - 3
                for x in (whisker["x"], whisker["x"] + whisker["w"]):
                    near = [x + dx for dx in (-1, 0, 1) if 0 <= x + dx - origin["x"] < w]
                    assert min(sum(_pixel(rows, origin, at, cap)) for at in near) < 300, (name, m["value"], x)


def test_the_pages_fetch_nothing_and_break_no_rule_of_their_policy(seen):
    control = seen["control"]
    assert any("Content Security Policy" in m for m in control.messages), (
        control.messages
    )  # the check can fail
    for name in PAGES:
        page = seen[name]
        assert page.requests == [page.uri], (name, page.requests)
        assert not [m for m in page.messages if "Content Security Policy" in m or "rror" in m], (
            name,
            page.messages,
        )
