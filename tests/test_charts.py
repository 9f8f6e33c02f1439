"""The report pages' charts on real outputs (rows measured as a job measures them, written by the
result sink): `report OUT --html` of one run (per hardware class, each cell's speedup over eager
with the 95% interval of `compiler.statistics` as whiskers, and its compile time), `presets OUT
--html` (the deployed gain over a stock PyTorch user, of a sweep's presets and of a tune's
deployed.json), the flags' refusals, and the pages in headless Chromium: their charts in the DOM,
no network request, no script the page's policy blocks."""

from __future__ import annotations

import html.parser
import json
import shutil
from pathlib import Path

import pytest

from compiler import statistics as cstats
from orchestrator.cli import main
from orchestrator.commands.targets import PAGE_STARTS
from reports.run_html import render_run_html
from store.schema import rows_to_table
from tests.pages import HOSTILE, load, measured_rows, write_output

ROOT = Path(__file__).resolve().parents[1]
FAILED = "A100/resnet/bs4/fp32/ro"


class Marks(html.parser.HTMLParser):
    """Counts of a page's chart marks, and the hover text of each."""

    def __init__(self, page: str):
        super().__init__()
        self.charts: list[str] = []
        self.marks: dict[str, int] = {}
        self.titles: list[str] = []
        self._tag = ""
        self.feed(page)

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "svg":
            self.charts.append(attrs.get("class", ""))
        if attrs.get("class") in ("bar", "whisker", "missing", "reference", "band", "point", "line"):
            self.marks[attrs["class"]] = self.marks.get(attrs["class"], 0) + 1
        self._tag = tag

    def handle_data(self, data):
        if self._tag == "title":
            self.titles.append(data)


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
    # per class: the speedup chart with whiskers, the compile-time chart
    assert marks.charts == ["chart interval", "chart", "chart interval", "chart"]
    ok = [r for r in rows if r["status"] == "ok"]
    assert marks.marks["whisker"] == len(ok) and marks.marks["missing"] == 1  # the oom cell: its status
    compiled = [r for r in rows if r.get("compile_s") is not None]  # the oom cell's compile too
    warm = [r for r in rows if r.get("warm_compile_s") is not None]
    assert len(warm) == len(ok) < len(compiled) == len(rows)
    assert marks.marks["bar"] == len(ok) + len(compiled) + len(warm)  # speedup, cold and warm compile
    assert marks.marks["reference"] == 2  # 1x, on each speedup chart
    for row in ok[:3] + ok[-3:]:  # the interval is the statistics module's, from the row's samples
        iv = cstats.paired_speedup(
            row["eager_samples_ms"], row["compiled_samples_ms"], row["samples_per_repeat"]
        )
        label = f"{row['model']} bs{row['batch_size']} {row['dtype']} {row['config']}"
        hover = f"{label}: {iv.estimate:.3f}x [{iv.low:.3f}, {iv.high:.3f}] (95% interval over 3 processes)"
        assert hover in marks.titles, hover
        assert iv.low < iv.estimate < iv.high
    assert "resnet bs4 fp32 ro: oom" in marks.titles  # FAILED, on the A100 chart


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
    assert marks.charts == ["chart interval"]  # one budget: per precision swept
    assert marks.marks["bar"] == marks.marks["whisker"] == len(gains)
    for p in gains:
        cell = f"{p['hardware']}/{p['model']}/bs{p['batch_size']}/{p['dtype']}"
        hover = (
            f"{cell} {p['config']}: {p['vs_stock_compile']:.3f}x [{p['vs_stock_compile_ci_low']:.3f}, "
            f"{p['vs_stock_compile_ci_high']:.3f}] over stock torch.compile ({p['stock_compile_config']}), "
            f"precision {p['precision']}"
        )
        assert hover in marks.titles, hover
    assert any(p["vs_stock_compile_ci_low"] > 1 for p in gains)  # a tuned config beat the stock user


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
    assert marks.charts == ["chart interval"] * len(deployed["budgets"])  # a chart per budget
    assert marks.marks["bar"] == len(deployed["cells"]) == 40
    assert marks.marks["whisker"] == sum(c["vs_stock_compile_ci"][0] is not None for c in deployed["cells"])
    first = deployed["cells"][0]
    low, high = first["vs_stock_compile_ci"]
    assert (
        f"{first['cell']} {first['preset']}: {first['vs_stock_compile']:.3f}x [{low:.3f}, {high:.3f}]"
        in " ".join(marks.titles)
    )
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
    assert dom.count("<svg") == 4 and dom.count('class="reference"') == 2


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
    assert dom.count('class="chart interval"') == 2 and dom.count('class="bar"') == 40
