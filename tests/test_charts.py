"""The report pages' charts on real outputs (rows measured as a job measures them, written by the
result sink): `report OUT --html` of one run (per hardware class, each cell's speedup over its
eager reference with the 95% interval of `compiler.statistics` as whiskers on a log axis, and its
compile times as dots), `presets OUT --html` (the deployed gain over a stock PyTorch user, over
stock eager and over stock torch.compile, of a sweep's presets and of a tune's deployed.json), the
flags' refusals, and the pages in headless Chromium: their charts in the DOM, no network request,
no script the page's policy blocks. What a person sees of the pages (layout, marks, pixels):
tests/test_pages_browser.py."""

from __future__ import annotations

import html.parser
import json
import shutil
from pathlib import Path

import pytest

from orchestrator.cli import main
from orchestrator.commands.targets import PAGE_STARTS
from reports.run_cells import run_cells
from reports.run_html import render_run_html
from store.schema import read_results, rows_to_table
from tests.pages import HOSTILE, load, measured_rows, write_output

ROOT = Path(__file__).resolve().parents[1]
FAILED = "A100/resnet/bs4/fp32/ro"


class Marks(html.parser.HTMLParser):
    """Counts of a page's chart marks (by each of their classes), the hover text of each, and the
    cells listed under a chart as not drawn."""

    KINDS = ("bar", "whisker", "missing", "reference", "band", "point", "line", "dot", "tick", "badge")

    def __init__(self, page: str):
        super().__init__()
        self.charts: list[str] = []
        self.marks: dict[str, int] = {}
        self.titles: list[str] = []
        self.listed: list[str] = []
        self._tag, self._item = "", False
        self.feed(page)

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "svg":
            self.charts.append(attrs.get("class", ""))
        for kind in set((attrs.get("class") or "").split()) & set(self.KINDS):
            self.marks[kind] = self.marks.get(kind, 0) + 1
        self._tag, self._item = tag, tag == "li" and attrs.get("class") == "missing"

    def handle_endtag(self, tag):
        self._item = self._item and tag != "li"

    def handle_data(self, data):
        if self._tag == "title":
            self.titles.append(data)
        elif self._item:
            self.listed.append(data)


@pytest.fixture(scope="module")
def run_out(tmp_path_factory, table_jobs, make_result):
    """One run's output: 24 cells on two classes (A100 and cpu), one of them out of memory."""
    rows = measured_rows(table_jobs, make_result, 1, failed=FAILED)
    return write_output(tmp_path_factory.mktemp("run") / "out", rows), rows


def test_report_html_of_one_run_draws_per_class_a_speedup_chart_with_its_intervals_and_compile_times(
    run_out, tmp_path, capsys
):
    out, rows = run_out
    page = tmp_path / "run.html"
    assert main(["report", str(out), "--html", str(page)]) == 0
    printed = capsys.readouterr().out
    assert f"wrote {page}" in printed and "[cpu]" in printed  # the table, as without --html
    text = page.read_text()
    assert text.encode().startswith(PAGE_STARTS["--html"])  # a later run may replace it
    marks = Marks(text)
    # per class: the speedup chart with whiskers, the compile times as dots (measured once)
    assert marks.charts == ["chart interval", "chart dots", "chart interval", "chart dots"]
    ok = [r for r in rows if r["status"] == "ok"]
    assert marks.marks["bar"] == marks.marks["whisker"] == len(ok)
    assert marks.listed == ["not drawn: resnet bs4 fp32 ro: oom"]  # FAILED, on the A100 chart: listed
    compiled = [r for r in rows if r.get("compile_s") is not None]  # the oom cell's compile too
    warm = [r for r in rows if r.get("warm_compile_s") is not None]
    assert len(warm) == len(ok) < len(compiled) == len(rows)
    assert marks.marks["dot"] == len(compiled) + len(warm)  # cold and warm compile
    assert marks.marks["reference"] == 2  # 1x, on each speedup chart
    cells = run_cells(read_results(out))  # the interval is the statistics module's, over the cell's reference
    shown = [c for c in cells if c.speedup is not None]
    assert len(shown) == len(ok)
    for c in shown[:3] + shown[-3:]:
        s = c.speedup
        hover = f"{c.label}: {s.estimate:.3f}x [{s.low:.3f}, {s.high:.3f}] (95% interval over 3 processes)"
        assert any(t.startswith(hover) for t in marks.titles), hover
        assert s.low < s.estimate < s.high


def test_the_run_page_shows_text_from_the_data_as_text(table_jobs, make_result):
    """A model name is the sweep author's text (an output's integrity check keeps a written row's
    name its job's, so the page is rendered from the rows here)."""
    rows = measured_rows(table_jobs, make_result, 2, failed=FAILED, hostile=True)
    rows[0]["config"] = '"><img src=x onerror=alert(2)>'
    text = render_run_html(rows_to_table(rows), title="<i>run</i>")
    assert HOSTILE not in text and "&lt;script&gt;alert(1)&lt;/script&gt;" in text
    assert "<img" not in text and "&lt;img src=x onerror=alert(2)&gt;" in text
    assert "<i>run" not in text and "&lt;i&gt;run&lt;/i&gt;" in text
    assert text.count("<script>") == 1  # the table sorter, and nothing from the data
    assert "http://" not in text.replace('xmlns="http://www.w3.org/2000/svg"', "")


def test_report_flags_are_refused_with_the_fix_before_anything_is_written(run_out, tmp_path, capsys):
    out, _ = run_out
    foreign = tmp_path / "notes.json"
    foreign.write_text('{"mine": true}')
    cases = [
        (["--md", str(tmp_path / "r.md")], "give --baseline RUN or --history DIR"),
        (["--json", str(tmp_path / "r.json")], "add --json-format pytorch"),
        (["--json-format", "pytorch"], "give --json FILE too"),
        (
            ["--json", str(foreign), "--json-format", "pytorch"],
            "exists and is not a JSON page this tool wrote",
        ),
        (["--html", str(out / "results" / "page.html")], "own data"),
        (["--html", str(tmp_path / "nowhere" / "page.html")], "does not exist; create it first"),
    ]
    for flags, says in cases:
        assert main(["report", str(out), *flags]) == 2, flags
        err = capsys.readouterr().err
        assert says in err, (flags, err)
    assert foreign.read_text() == '{"mine": true}'
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.json"]


def test_new_flags_have_help(capsys):
    for command, flags in (
        ("report", ["--html", "--json-format", "pytorch"]),
        ("presets", ["--html", "deployed.json"]),
    ):
        assert main([command, "--help"]) == 0
        shown = capsys.readouterr().out
        assert all(flag in shown for flag in flags), (command, shown)


def test_presets_html_charts_each_presets_gain_over_the_stock_user_with_its_interval(
    run_out, tmp_path, capsys
):
    out = Path(shutil.copytree(run_out[0], tmp_path / "out"))
    page = tmp_path / "presets.html"
    assert main(["presets", str(out), "--html", str(page)]) == 0
    assert f"wrote {page}" in capsys.readouterr().out
    presets = json.loads((out / "presets.json").read_text())["presets"]
    gains = [p for p in presets if p.get("vs_stock_compile") is not None]
    assert len(gains) == len(presets) == 8  # a cell per hardware class, model and batch size
    marks = Marks(page.read_text())
    assert marks.charts == ["chart interval"] * 2  # one budget (per precision swept), a chart per class
    assert marks.marks["bar"] == marks.marks["whisker"] == 2 * len(gains)  # over stock eager and compile
    for p in gains:
        label = f"{p['model']}/bs{p['batch_size']}/{p['dtype']} {p['config']}"
        for key, over in (
            ("vs_stock_compile", f"stock torch.compile ({p['stock_compile_config']})"),
            ("vs_stock_eager", "stock eager"),
        ):
            hover = (
                f"{label}: {p[key]:.3f}x [{p[key + '_ci_low']:.3f}, {p[key + '_ci_high']:.3f}] over {over}, "
                f"precision {p['precision']}"
            )
            assert any(t.startswith(hover) for t in marks.titles), hover
    assert any(p["vs_stock_compile_ci_low"] > 1 for p in gains)  # a tuned config beat the stock user
    assert all(p["vs_stock_eager_ci_low"] > 1 for p in gains)  # and every preset, stock eager


def test_presets_html_of_a_tune_output_charts_its_deployed_json_and_writes_nothing_there(tmp_path, capsys):
    """docs/results/deployed-summary.json is an H100 tune's deployed.json, unedited."""
    tune = tmp_path / "tune"
    tune.mkdir()
    shutil.copy(ROOT / "docs/results/deployed-summary.json", tune / "deployed.json")
    deployed = json.loads((tune / "deployed.json").read_text())
    page = tmp_path / "deployed.html"
    assert main(["presets", str(tune), "--html", str(page)]) == 0
    printed = capsys.readouterr().out
    assert "stock budget: 20 cells, geomean 1.296x over stock torch.compile" in printed
    assert sorted(p.name for p in tune.iterdir()) == ["deployed.json"]
    marks = Marks(page.read_text())
    assert marks.charts == ["chart interval"] * len(deployed["budgets"])  # a chart per budget (one class)
    assert marks.marks["bar"] == 2 * len(deployed["cells"]) == 80  # over stock eager and torch.compile
    assert marks.marks["whisker"] == sum(
        c[f"{key}_ci"][0] is not None
        for c in deployed["cells"]
        for key in ("vs_stock_eager", "vs_stock_compile")
    )
    first = deployed["cells"][0]
    low, high = first["vs_stock_compile_ci"]
    label = f"{first['cell'].split('/', 1)[1]} {first['preset']}"
    assert f"{label}: {first['vs_stock_compile']:.3f}x [{low:.3f}, {high:.3f}]" in " ".join(marks.titles)
    for flags, says in (
        ([], "Give --html FILE (alone)"),
        (["--html", str(page), "--accuracy", "bf16"], "--accuracy"),
    ):
        assert main(["presets", str(tune), *flags]) == 2
        assert says in capsys.readouterr().err


# --- in a real browser ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def chromium_catches_a_fetch(tmp_path_factory):
    """The net log check can fail: a page with an image from the network is caught."""
    work = tmp_path_factory.mktemp("control")
    page = work / "fetches.html"
    page.write_text("<!DOCTYPE html><html><body><img src='http://127.0.0.1:9/pixel.png'></body></html>")
    _, requests, _ = load(page, work)
    assert requests == ["http://127.0.0.1:9/pixel.png"]


def test_the_run_page_renders_in_headless_chromium_and_fetches_nothing(
    run_out, tmp_path, chromium_catches_a_fetch
):
    out, rows = run_out
    page = tmp_path / "run.html"
    assert main(["report", str(out), "--html", str(page)]) == 0
    dom, requests, log = load(page, tmp_path)
    assert requests == []
    assert "Content Security Policy" not in log  # the table sorter is the script its hash allows
    assert dom.count('class="chart interval"') == 2 and dom.count('class="whisker"') == len(rows) - 1
    assert dom.count("<svg") == 4 and dom.count('class="reference"') == 2 and dom.count('class="dot"') > 0


def test_the_presets_page_renders_in_headless_chromium_and_fetches_nothing(
    tmp_path, chromium_catches_a_fetch
):
    tune = tmp_path / "tune"
    tune.mkdir()
    shutil.copy(ROOT / "docs/results/deployed-summary.json", tune / "deployed.json")
    page = tmp_path / "deployed.html"
    assert main(["presets", str(tune), "--html", str(page)]) == 0
    dom, requests, log = load(page, tmp_path)
    assert requests == [] and "Content Security Policy" not in log
    assert dom.count('class="chart interval"') == 2 and dom.count('<rect class="bar') == 80
