"""Two runs compared (reports.regression) on hand-built tables: an A/A pair has no regression, a
10% slowdown on one hardware class is flagged there and nowhere else, status and graph-break
changes come with their reasons, and the CLI's --fail-on exit code."""

from __future__ import annotations

import json
from contextlib import closing

import numpy as np
import pytest

from compiler import statistics as cstats
from orchestrator.cli import main
from reports.regression import compare, compare_history, to_markdown
from reports.regression.html import render_html
from store.rows import make_row
from store.schema import rows_to_table
from store.sink import ResultSink

PROCESSES, CALLS = 3, 30


def timed(center: float, rng: np.random.Generator, slow: float = 1.0) -> dict:
    """Samples of 3 processes: each process off by a few percent (its clocks, its placement),
    each call by 1-2% around it, as the H100 rows show."""
    samples = []
    for _ in range(PROCESSES):
        process = center * slow * (1 + 0.02 * rng.standard_normal())
        samples += [float(x) for x in process * (1 + 0.015 * rng.standard_normal(CALLS))]
    return {
        "compiled_samples_ms": samples,
        "samples_per_repeat": [CALLS] * PROCESSES,
        "compiled_ms": float(np.median(samples)),
        "repeats": PROCESSES,
    }


def run_rows(
    table_jobs, make_result, seed: int, slow: dict[str, float] | None = None, **changes
) -> list[dict]:
    """One row per job of the conftest sweep (A100 and cpu, 2 models x 2 batch sizes x 3 configs)."""
    rng = np.random.default_rng(seed)
    rows = []
    for i, (name, job) in enumerate(sorted(table_jobs.items())):
        extra = timed(2.0 + i % 5, rng, (slow or {}).get(job.hardware, 1.0))
        extra.update(changes.get(name, {}))
        result = make_result(extra.pop("status", "ok"), 10.0, extra.pop("compiled_ms"), **extra)
        rows.append(make_row(job, result, run_id=f"run-{seed}"))
    return rows


def test_an_a_a_pair_has_no_regression(table_jobs, make_result):
    for seed in range(5):  # five A/A pairs of 24 cells each
        got = compare(
            rows_to_table(run_rows(table_jobs, make_result, 100 + seed)),
            rows_to_table(run_rows(table_jobs, make_result, 200 + seed)),
        )
        assert got.counts()["regression"] == 0, [c.reasons for c in got.cells if c.verdict == "regression"]
        assert got.counts()["unchanged"] == len(table_jobs)


def test_a_ten_percent_slowdown_on_one_class_is_flagged_there_only(table_jobs, make_result):
    got = compare(
        rows_to_table(run_rows(table_jobs, make_result, 1, slow={"cpu": 1.10})),
        rows_to_table(run_rows(table_jobs, make_result, 2)),
    )
    cpu = [c for c in got.cells if c.hardware == "cpu"]
    flagged = [c for c in cpu if c.verdict == "regression"]
    # with 3 processes a side, a cell whose processes happen to disagree gets an interval too wide
    # to clear the 3% threshold: most cells are flagged, and none of the other class
    assert len(flagged) >= 10, [(c.name, c.latency_ci) for c in cpu]
    assert all(c.verdict == "unchanged" for c in got.cells if c.hardware == "A100")
    assert all(c.latency_ci[0] > 1.03 for c in flagged)
    assert all(c.latency_ratio == pytest.approx(1.10, abs=0.08) for c in cpu)
    assert got.by_model() == {
        "mlp": {"regression": ["cpu"], "improvement": []},
        "resnet": {"regression": ["cpu"], "improvement": []},
    }
    assert "regressed on" in to_markdown(got) and "| resnet | cpu | - |" in to_markdown(got)


def test_status_and_graph_break_changes_come_with_their_reasons(table_jobs, make_result):
    oom = "A100/resnet/bs1/fp32/default"
    broke = "cpu/mlp/bs1/fp32/ro"
    current = run_rows(
        table_jobs,
        make_result,
        3,
        **{
            oom: {"status": "oom", "error": "CUDA out of memory. Tried to allocate 2.00 GiB"},
            broke: {"graph_breaks": 1, "break_reasons": ["call_function print"], "graph_count": 2},
        },
    )
    got = {
        c.name: c
        for c in compare(rows_to_table(current), rows_to_table(run_rows(table_jobs, make_result, 4))).cells
    }
    assert got[oom].verdict == "regression" and got[oom].status == ("ok", "oom")
    assert got[oom].reasons == ["regression: ok -> oom: CUDA out of memory. Tried to allocate 2.00 GiB"]
    assert got[broke].verdict == "regression"
    assert "regression: graph breaks 0 -> 1: call_function print" in got[broke].reasons
    fixed = {
        c.name: c
        for c in compare(rows_to_table(run_rows(table_jobs, make_result, 4)), rows_to_table(current)).cells
    }
    assert fixed[oom].verdict == "improvement" and fixed[oom].reasons == ["improvement: oom -> ok"]


def test_new_missing_environment_and_thresholds(table_jobs, make_result, tmp_path):
    current = run_rows(table_jobs, make_result, 5)
    baseline = [r for r in run_rows(table_jobs, make_result, 6) if r["model"] != "mlp"]
    for r in current:
        r["torch_version"] = "2.14.0"
    got = compare(rows_to_table(current[:-1]), rows_to_table(baseline))
    counts = got.counts()
    assert counts["new"] == 12 and counts["missing"] == 1 and counts["regression"] == 0
    assert got.environment["A100"]["torch_version"] == (["2.13.0"], ["2.14.0"])
    bad = tmp_path / "t.json"
    bad.write_text(json.dumps({**vars(cstats.load_thresholds()), "version": 9}))
    with pytest.raises(ValueError, match="t.json: version 9"):
        cstats.load_thresholds(bad)


def test_report_baseline_cli_writes_markdown_and_json_and_fails_on_regression(
    tmp_path, table_jobs, make_result, capsys
):
    runs = {
        "before": run_rows(table_jobs, make_result, 7),
        "after": run_rows(table_jobs, make_result, 8, slow={"A100": 1.2}),
    }
    for name, rows in runs.items():
        with closing(ResultSink(tmp_path / name)) as sink:
            for row in rows:
                sink.add(row)
    args = ["report", str(tmp_path / "after"), "--baseline", str(tmp_path / "before")]
    md, js = tmp_path / "r.md", tmp_path / "r.json"
    assert main([*args, "--md", str(md), "--json", str(js)]) == 0
    assert main([*args, "--fail-on", "regression"]) == 1
    assert (
        main(
            [
                "report",
                str(tmp_path / "before"),
                "--baseline",
                str(tmp_path / "before"),
                "--fail-on",
                "regression",
            ]
        )
        == 0
    )
    data = json.loads(js.read_text())
    assert data["counts"]["regression"] == 12 and data["by_model"]["resnet"]["regression"] == ["A100"]
    assert "## Regression report" in md.read_text()
    assert main(["report", str(tmp_path / "after"), "--md", str(md)]) == 2
    assert "give --baseline" in capsys.readouterr().err


# --- the HTML page --------------------------------------------------------------------------------


def hostile_comparison(table_jobs, make_result):
    current = run_rows(table_jobs, make_result, 9, slow={"cpu": 1.2})
    baseline = run_rows(table_jobs, make_result, 10)
    for rows in (current, baseline):
        for r in rows:
            if r["model"] == "mlp":
                r["model"] = "<script>alert(1)</script>"
    current[0]["status"], current[0]["error"] = "crash", '<img src=x onerror="alert(2)">'
    return compare(rows_to_table(current), rows_to_table(baseline))


def hostile_history(table_jobs, make_result):
    """Three nights, the last slower on cpu, with a hostile model name and run label."""
    runs = []
    for night in range(3):
        rows = run_rows(table_jobs, make_result, 400 + night, slow={"cpu": 1.2 if night == 2 else 1.0})
        for r in rows:
            if r["model"] == "mlp":
                r["model"] = "<script>alert(1)</script>"
        for r in rows:  # the interval a job writes beside its speedup (workers/repeats.py)
            r["speedup_ci_low"], r["speedup_ci_high"] = r["speedup"] * 0.97, r["speedup"] * 1.02
        if night == 1:
            rows[0]["status"], rows[0]["error"] = "crash", "x"  # a gap in that cell's line
        runs.append(rows_to_table(rows))
    return compare_history(runs, labels=["2026-11-20T020000Z", "2026-11-21T020000Z", "<b>night</b>"])


def test_history_html_draws_a_trend_chart_per_cell_with_its_band_and_every_night_on_hover(
    table_jobs, make_result
):
    import html.parser

    comparison = hostile_history(table_jobs, make_result)
    assert len(comparison.trend) == len(table_jobs)
    assert all(len(points) == 3 for points in comparison.trend.values())
    (crashed,) = [name for name, points in comparison.trend.items() if points[1][1] is None]
    assert comparison.trend_ci[crashed][1] == (None, None)
    low, high = comparison.trend_ci[crashed][0]
    assert low == pytest.approx(comparison.trend[crashed][0][1] * 0.97)
    assert high == pytest.approx(comparison.trend[crashed][0][1] * 1.02)
    page = render_html(comparison)
    assert "<b>night</b>" not in page and "&lt;b&gt;night&lt;/b&gt;" in page
    assert "<script>alert(1)</script>" not in page

    class Count(html.parser.HTMLParser):
        def __init__(self):
            super().__init__()
            self.trends, self.lines, self.points, self.bands, self.crosses = 0, 0, 0, 0, 0
            self.tag, self.titles = "", []

        def handle_starttag(self, tag, attrs):
            self.trends += tag == "svg" and ("class", "chart trend") in attrs
            self.lines += tag == "polyline"
            self.points += tag == "circle" and ("class", "point") in attrs
            self.bands += tag == "polygon" and ("class", "band") in attrs
            self.crosses += tag == "path" and ("class", "missing") in attrs
            self.tag = tag

        def handle_data(self, data):
            if self.tag == "title":
                self.titles.append(data)

    counted = Count()
    counted.feed(page)
    assert counted.trends == len(table_jobs)  # one chart per cell: model, batch size, precision, config
    assert counted.points == 3 * len(table_jobs) - 1  # a point per run and cell, but the crash
    assert counted.crosses == 1  # where the crashed night is
    assert counted.lines == len(table_jobs) + 1  # the crashed cell's line is cut in two
    assert counted.bands == len(table_jobs) + 1  # and so is its band
    for night in ("2026-11-20T020000Z", "2026-11-21T020000Z", "<b>night</b>"):  # every night on hover
        assert sum(t.startswith(f"{night}: ") for t in counted.titles) == len(table_jobs), night
    assert "2026-11-21T020000Z: no ok row" in counted.titles


def test_html_report_escapes_every_string_and_draws_its_charts(table_jobs, make_result):
    import html.parser

    from markupsafe import escape

    comparison = hostile_comparison(table_jobs, make_result)
    page = render_html(comparison)
    assert "<script>alert(1)</script>" not in page and "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert "<img" not in page and str(escape('<img src=x onerror="alert(2)">')) in page
    assert "http://" not in page.replace('xmlns="http://www.w3.org/2000/svg"', "")  # nothing fetched
    assert page.count("<svg") == 4  # latency ratio and compile time, for each of the 2 classes
    assert page.count("<script>") == 1  # the table sorter, and nothing from the data

    class Count(html.parser.HTMLParser):
        def __init__(self):
            super().__init__()
            self.rects, self.whiskers, self.dots, self.rows, self.listed = 0, 0, 0, 0, 0

        def handle_starttag(self, tag, attrs):
            classes = (dict(attrs).get("class") or "").split()
            self.rects += tag == "rect" and "bar" in classes
            self.whiskers += tag == "path" and "whisker" in classes
            self.dots += tag == "circle" and "dot" in classes
            self.listed += tag == "li" and "missing" in classes
            self.rows += tag == "tr"

    counted = Count()
    counted.feed(page)
    # a bar with its whisker per cell with both latencies; the crashed cell is listed, not drawn
    ratios = [c for c in comparison.cells if c.latency_ratio is not None]
    assert counted.rects == counted.whiskers == len(ratios) == len(table_jobs) - 1 and counted.listed == 1
    assert counted.dots == 2 * len(table_jobs)  # the cold compile, baseline and current
    assert counted.rows == 1 + len(table_jobs) + 1 + 2  # header + cells, header + 2 models


def test_html_report_renders_in_headless_chromium(table_jobs, make_result, tmp_path):
    """The page in a real browser: the charts are in the DOM with their bars, bands and points, the
    hostile model name is text in the DOM, not an element, and the page makes no network request
    (Chromium's net log; tests/test_charts.py checks that the log catches one). Needs Debian's
    `chromium`; without it the test is skipped and says why."""
    import subprocess

    from tests.pages import QUIET, browser, load

    page = tmp_path / "report.html"
    page.write_text(render_html(hostile_history(table_jobs, make_result)))
    dom, requests, log = load(page, tmp_path)
    assert requests == [] and "Content Security Policy" not in log
    # latency ratio and compile time per class, a trend per cell
    assert dom.count("<svg") == 4 + len(table_jobs) and '<rect class="bar' in dom
    assert (
        dom.count('class="chart trend"') == len(table_jobs) and dom.count("<polyline") == len(table_jobs) + 1
    )
    assert dom.count('class="band"') == len(table_jobs) + 1
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in dom
    shot = tmp_path / "shot.png"
    subprocess.run(
        [browser(), *QUIET, f"--user-data-dir={tmp_path / 'profile'}", f"--screenshot={shot}", page.as_uri()],
        capture_output=True,
        timeout=120,
        check=True,
    )
    assert shot.stat().st_size > 10_000


# --- history mode ---------------------------------------------------------------------------------


def nights(table_jobs, make_result, slow_from: int | None, n: int = 5, only_night: int | None = None):
    tables = []
    for night in range(n):
        slow = 1.1 if (slow_from is not None and night >= slow_from) or night == only_night else 1.0
        tables.append(rows_to_table(run_rows(table_jobs, make_result, 300 + night, slow={"cpu": slow})))
    return tables


def test_history_rules_a_step_change_fires_a_single_noisy_night_does_not(table_jobs, make_result):
    quiet = compare_history(nights(table_jobs, make_result, None))
    assert quiet.counts()["regression"] == 0

    step = compare_history(nights(table_jobs, make_result, slow_from=3))  # the last two nights slower
    flagged = [c for c in step.cells if c.verdict == "regression"]
    assert flagged and {c.hardware for c in flagged} == {"cpu"}
    assert all("rule fired: the last 2 runs against the 3 runs before them" in c.reasons[-1] for c in flagged)

    blip = compare_history(nights(table_jobs, make_result, None, only_night=4))  # the last night only
    assert blip.counts()["regression"] == 0
    assert any(
        r.startswith("watch: over the threshold on 1 of the last 2 runs")
        for c in blip.cells
        for r in c.reasons
    )


def test_history_rules_a_failure_counts_at_once(table_jobs, make_result):
    runs = nights(table_jobs, make_result, None, n=4)
    rows = runs[-1].to_pylist()
    rows[0]["status"], rows[0]["error"] = "oom", "CUDA out of memory"
    runs[-1] = rows_to_table(rows)
    got = compare_history(runs)
    (cell,) = [c for c in got.cells if c.verdict == "regression"]
    assert cell.status == ("ok", "oom") and cell.reasons[-1].startswith("rule fired: a failure")
    with pytest.raises(ValueError, match="at least two runs"):
        compare_history(runs[:1])


def test_report_history_cli(tmp_path, table_jobs, make_result, capsys):
    history = tmp_path / "nightly"
    names = [f"2026-11-0{d}T013000Z" for d in range(1, 5)]
    for i, name in enumerate(names):  # the last two nights 15% slower on A100
        with closing(ResultSink(history / name)) as sink:
            for row in run_rows(table_jobs, make_result, 400 + i, slow={"A100": 1.15 if i >= 2 else 1.0}):
                sink.add(row)
    newest, third = str(history / names[3]), str(history / names[2])
    assert main(["report", newest, "--history", str(history), "--fail-on", "regression"]) == 1
    assert "| resnet | A100 | - |" in capsys.readouterr().out
    # the third night alone is one night over the threshold: a watch, not a regression
    out = tmp_path / "third.json"
    assert (
        main(["report", third, "--history", str(history), "--fail-on", "regression", "--json", str(out)]) == 0
    )
    reasons = [
        r for c in json.loads(out.read_text())["cells"] if c["hardware"] == "A100" for r in c["reasons"]
    ]
    assert any(r.startswith("watch: over the threshold on 1 of the last 2 runs") for r in reasons), reasons
    assert main(["report", newest, "--history", str(history), "--baseline", third]) == 2
    assert main(["report", newest, "--history", str(tmp_path / "empty")]) == 2


def test_autotune_winner_changes_are_reasons_and_the_latest_row_wins(table_jobs, make_result):
    import pyarrow as pa

    from store.rows import latest_rows

    current, baseline = run_rows(table_jobs, make_result, 11), run_rows(table_jobs, make_result, 12)

    def winners(rows, choice):
        job = next(r["job_id"] for r in rows if r["job_name"] == "A100/resnet/bs1/fp32/tuned")
        return pa.Table.from_pylist(
            [
                {
                    "job_id": job,
                    "op": "mm",
                    "input_shapes": ["16x768", "768x3072"],
                    "choice": choice,
                    "is_winner": True,
                }
            ]
        )

    got = compare(
        rows_to_table(current),
        rows_to_table(baseline),
        None,
        winners(current, "mm"),
        winners(baseline, "triton_mm_4"),
    )
    (cell,) = [c for c in got.cells if c.name == "A100/resnet/bs1/fp32/tuned"]
    assert "autotune winner for mm (16x768, 768x3072): triton_mm_4 -> mm" in cell.reasons

    lost = {**current[0], "started_at": None, "status": "hardware_lost"}
    kept = latest_rows([current[0], lost, {**lost}], lambda r: r["job_name"])
    assert kept[current[0]["job_name"]]["status"] == "ok"  # a row without a start time is the oldest


def test_the_markdown_summary_shows_hostile_text_as_text_and_the_terminal_as_it_is(
    tmp_path, table_jobs, make_result, capsys
):
    """A CI comment renders the summary: an error text with a link, an image and HTML must come
    out as literal text under CommonMark; the terminal gets the text unescaped."""
    from markdown_it import MarkdownIt

    evil = "[click me](https://evil.example/phish) ![pixel](https://evil.example/p.png) <b>bold</b> a|b"
    current = run_rows(table_jobs, make_result, 11)
    current[0]["status"], current[0]["error"] = "crash", evil
    got = compare(rows_to_table(current), rows_to_table(run_rows(table_jobs, make_result, 12)))
    html = MarkdownIt("commonmark").enable("table").render(to_markdown(got))
    assert "<a " not in html and "<img" not in html and "<b>" not in html
    assert "[click me](https://evil.example/phish)" in html.replace("&quot;", '"')
    assert "a|b" in html  # the pipe stayed inside its cell
    terminal = to_markdown(got, terminal=True)
    assert evil in terminal and "&gt;" not in terminal and "\\[" not in terminal
    for name, rows in (("before", run_rows(table_jobs, make_result, 12)), ("after", current)):
        with closing(ResultSink(tmp_path / name)) as sink:
            for row in rows:
                sink.add(row)
    md = tmp_path / "r.md"
    assert (
        main(["report", str(tmp_path / "after"), "--baseline", str(tmp_path / "before"), "--md", str(md)])
        == 0
    )
    out = capsys.readouterr().out
    assert evil in out and " -> " in out and "&gt;" not in out
    assert "\\[click me\\]" in md.read_text()
