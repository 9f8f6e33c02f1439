"""Presets (fastest ok config per cell) and the speedup report, from a hand-built results table."""

from __future__ import annotations

import json
from contextlib import closing

import pytest

from compiler import statistics as cstats
from compiler.statistics.thresholds import THRESHOLDS_ENV
from orchestrator.tune.presets import PRESET_FORMAT, derive_presets, write_presets
from reports.speedup import REPORT_FILE, render, speedup_tables, write_report
from store.rows import make_row
from store.schema import read_results, rows_to_table
from store.sink import ResultSink

# (job name, status, eager_ms, compiled_ms)
CELLS = [
    # A100/resnet/bs1: ro is fastest among ok; tuned is faster still but failed its accuracy check.
    ("A100/resnet/bs1/fp32/default", "ok", 20.0, 10.0),
    ("A100/resnet/bs1/fp32/ro", "ok", 20.0, 8.0),
    ("A100/resnet/bs1/fp32/tuned", "accuracy_fail", 20.0, 4.0),
    # A100/resnet/bs4: nothing ok.
    ("A100/resnet/bs4/fp32/default", "timeout", None, None),
    ("A100/resnet/bs4/fp32/ro", "oom", 30.0, None),
    ("A100/resnet/bs4/fp32/tuned", "compile_error", 30.0, None),
    # A100/mlp/bs1: only a non-default config is ok, so there is no speedup over default.
    ("A100/mlp/bs1/fp32/default", "crash", None, None),
    ("A100/mlp/bs1/fp32/ro", "runtime_error", 6.0, None),
    ("A100/mlp/bs1/fp32/tuned", "ok", 6.0, 2.0),
    # cpu/resnet/bs1: tuned wins.
    ("cpu/resnet/bs1/fp32/default", "ok", 50.0, 40.0),
    ("cpu/resnet/bs1/fp32/ro", "ok", 50.0, 45.0),
    ("cpu/resnet/bs1/fp32/tuned", "ok", 50.0, 25.0),
    # cpu/mlp/bs4: default wins; no tuned row at all.
    ("cpu/mlp/bs4/fp32/default", "ok", 5.0, 5.0),
    ("cpu/mlp/bs4/fp32/ro", "ok", 5.0, 6.0),
]


@pytest.fixture
def rows(table_jobs, make_result):
    return [
        make_row(table_jobs[name], make_result(status, eager_ms, compiled_ms), run_id="run-1")
        for name, status, eager_ms, compiled_ms in CELLS
    ]


@pytest.fixture
def table(rows):
    return rows_to_table(rows)


def by_cell(entries):
    return {(e["hardware"], e["model"], e["batch_size"], e["dtype"]): e for e in entries}


# --- presets --------------------------------------------------------------------------------------


def test_class_defaults_and_stacks(table):
    data = derive_presets(table)
    # A100: each config is ok on one cell, so the best geomean wins (tuned 3.0x on mlp)
    assert data["defaults"]["A100"]["fp32"]["config"] == "tuned"
    # cpu: default and ro are ok on both cells, tuned on one; default's geomean sqrt(1.25 x 1.0)
    # beats ro's sqrt(1.11 x 0.83)
    cpu = data["defaults"]["cpu"]["fp32"]
    assert cpu["config"] == "default" and cpu["cells"] == 2
    assert cpu["geomean_speedup_vs_eager"] == pytest.approx((50 / 40 * 5 / 5) ** 0.5)
    assert cpu["compile"]["mode"] is None and cpu["compile"]["options"] == {}
    assert set(data["stacks"]) == {"A100", "cpu"} and len(data["stacks"]["cpu"]) == 1


def test_derive_presets_picks_the_fastest_ok_config(table, table_jobs):
    data = derive_presets(table)
    assert data["format"] == PRESET_FORMAT
    presets = by_cell(data["presets"])
    assert set(presets) == {
        ("A100", "resnet", 1, "fp32"),
        ("A100", "mlp", 1, "fp32"),
        ("cpu", "resnet", 1, "fp32"),
        ("cpu", "mlp", 4, "fp32"),
    }

    p = presets["A100", "resnet", 1, "fp32"]
    assert p["config"] == "ro"  # not the failed 'tuned' at 4 ms
    assert p["compiled_ms"] == 8.0 and p["eager_ms"] == 20.0
    assert p["speedup_vs_eager"] == pytest.approx(20.0 / 8.0)
    assert p["speedup_vs_default"] == pytest.approx(10.0 / 8.0)
    assert p["default_config"] == "default"
    assert p["candidates"] == 2
    assert p["compile"] == {
        "backend": "inductor",
        "mode": "reduce-overhead",
        "fullgraph": False,
        "dynamic": None,
        "options": {},
        "freezing": False,
        "channels_last": False,
        "runtime": {},
    }
    assert p["job_id"] == table_jobs["A100/resnet/bs1/fp32/ro"].job_id
    assert p["model_id"] == "hf:microsoft/resnet-50"

    p = presets["A100", "mlp", 1, "fp32"]
    assert p["config"] == "tuned"
    assert p["compile"]["options"] == {"max_autotune": True}
    assert p["speedup_vs_eager"] == pytest.approx(3.0)
    assert p["speedup_vs_default"] is None and p["default_config"] is None
    assert p["candidates"] == 1

    p = presets["cpu", "resnet", 1, "fp32"]
    assert p["config"] == "tuned"
    assert p["speedup_vs_eager"] == pytest.approx(2.0)
    assert p["speedup_vs_default"] == pytest.approx(40.0 / 25.0)
    assert p["candidates"] == 3

    p = presets["cpu", "mlp", 4, "fp32"]
    assert p["config"] == "default"
    assert p["speedup_vs_eager"] == pytest.approx(1.0)
    assert p["speedup_vs_default"] == pytest.approx(1.0)


def test_cell_without_ok_config_is_listed_with_statuses(table):
    missing = by_cell(derive_presets(table)["no_preset"])
    assert list(missing) == [("A100", "resnet", 4, "fp32")]
    assert missing["A100", "resnet", 4, "fp32"]["statuses"] == {
        "default": "timeout",
        "ro": "oom",
        "tuned": "compile_error",
    }


def test_non_default_settings_are_not_taken_as_default(table_jobs, make_result):
    # A config with fullgraph=True is not the plain torch.compile(model) baseline.
    spec_rows = [
        make_row(
            table_jobs["cpu/resnet/bs4/fp32/ro"], make_result(eager_ms=10.0, compiled_ms=4.0), run_id="r"
        ),
        make_row(
            table_jobs["cpu/resnet/bs4/fp32/tuned"], make_result(eager_ms=10.0, compiled_ms=5.0), run_id="r"
        ),
    ]
    (p,) = derive_presets(rows_to_table(spec_rows))["presets"]
    assert p["config"] == "ro"
    assert p["default_config"] is None and p["speedup_vs_default"] is None


def test_write_presets(tmp_path, rows, table):
    with closing(ResultSink(tmp_path)) as sink:
        for row in rows:
            sink.add(row)
    path, data = write_presets(tmp_path)
    assert path == tmp_path / "presets.json"
    on_disk = json.loads(path.read_text())
    assert on_disk == data
    expected = derive_presets(table)
    assert by_cell(on_disk["presets"]) == by_cell(json.loads(json.dumps(expected["presets"])))
    assert by_cell(on_disk["no_preset"]) == by_cell(expected["no_preset"])
    assert not list(tmp_path.glob(".presets*"))


def test_write_presets_without_results(tmp_path):
    with pytest.raises(FileNotFoundError, match="orchestrate sweep"):
        write_presets(tmp_path)
    (tmp_path / "results").mkdir()
    with pytest.raises(FileNotFoundError):
        write_presets(tmp_path)
    assert not (tmp_path / "presets.json").exists()


# --- report ---------------------------------------------------------------------------------------


def sections(markdown: str) -> dict[str, str]:
    """The speedup tables' sections, by hardware class (the stock user's tables come after them)."""
    parts = markdown.split("# Against a stock PyTorch user")[0].split("\n## ")[1:]
    return {p.split("\n", 1)[0].strip(): p for p in parts}


def table_line(section: str, model: str, batch: int) -> list[str]:
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if cells[:2] == [model, str(batch)]:
            return cells
    raise AssertionError(f"no row for {model} bs{batch} in:\n{section}")


def test_render_has_a_section_per_hardware(table):
    text = render(table)
    assert text.startswith("# Speedup of torch.compile over eager")
    assert f"{len(CELLS)} results: " in text
    assert "8 ok" in text and "1 timeout" in text
    secs = sections(text)
    assert list(secs) == ["A100", "cpu"]
    assert "| model | batch | dtype | eager ms | default | ro | tuned |" in secs["A100"]


def test_render_shows_status_instead_of_number_for_failed_cells(table):
    secs = sections(render(table))
    assert table_line(secs["A100"], "resnet", 1) == [
        "resnet",
        "1",
        "fp32",
        "20.000",
        "2.00x",
        "2.50x",
        "accuracy_fail",
        "ro",  # the fastest config, which presets picks
    ]
    assert "5.00x" not in secs["A100"]  # the failed tuned cell's would-be speedup is not shown
    assert table_line(secs["A100"], "resnet", 4)[4:] == ["timeout", "oom", "compile_error", "-"]
    assert table_line(secs["A100"], "mlp", 1)[4:] == ["crash", "runtime_error", "3.00x", "tuned"]
    assert table_line(secs["cpu"], "resnet", 1) == [
        "resnet",
        "1",
        "fp32",
        "50.000",
        "1.25x",
        "1.11x",
        "2.00x",
        "tuned",
    ]
    assert table_line(secs["cpu"], "mlp", 4) == [
        "mlp",
        "4",
        "fp32",
        "5.000",
        "1.00x",
        "0.83x",
        "-",
        "default",
    ]
    for status in ("accuracy_fail", "timeout", "oom", "crash"):
        assert status not in secs["cpu"]


def test_render_plain_text(table):
    text = render(table, markdown=False)
    assert "[A100]" in text and "[cpu]" in text
    assert "|" not in text and "## " not in text
    a100, cpu = text.split("[A100]")[1].split("[cpu]")
    assert "accuracy_fail" in a100 and "2.50x" in a100
    assert "accuracy_fail" not in cpu and "1.25x" in cpu


def test_speedup_tables(table):
    tables = speedup_tables(table)
    assert list(tables) == ["A100", "cpu"]
    header, body, doubts = tables["cpu"]
    assert header == ["model", "batch", "dtype", "eager ms", "default", "ro", "tuned", "fastest"]
    assert [r[:2] for r in body] == [["mlp", "4"], ["resnet", "1"]]
    assert doubts == []


def test_a_cells_speedups_share_one_eager_reference_and_doubted_rows_are_marked(
    table_jobs, make_result, monkeypatch
):
    """Two configs of one cell timed their own eager at 20 and 40 ms (a busy host for the second):
    both speedups are over one reference, so the faster config shows the higher speedup, and the
    doubted row (other processes took its cores) is marked, listed with its reason, and leaves the
    cell undecided; the same rows trusted decide it."""
    monkeypatch.delenv(THRESHOLDS_ENV)  # the project's limits, not the suite's trusting ones
    fast = make_row(table_jobs["cpu/resnet/bs1/fp32/default"], make_result("ok", 40.0, 10.0), run_id="r")
    slow = make_row(table_jobs["cpu/resnet/bs1/fp32/ro"], make_result("ok", 20.0, 8.0), run_id="r")
    fast["host_other_share"], slow["host_other_share"] = [0.6], [0.01]
    fast["speedup_ci_low"] = fast["speedup_ci_high"] = slow["speedup_ci_low"] = slow["speedup_ci_high"] = None
    header, body, doubts = speedup_tables(rows_to_table([fast, slow]))["cpu"]
    line = dict(zip(header, body[0], strict=True))
    # reference 20 ms: the trusted job's eager alone (the doubted one's is left out of the pool)
    assert line["eager ms"] == "20.000"
    assert line["default"] == f"2.00x {cstats.MARK}" and line["ro"] == "2.50x"
    assert line["fastest"] == f"undecided {cstats.MARK}"
    assert doubts == ["resnet bs1 fp32 default: other processes took 60% of its cores while it timed"]
    fast["host_other_share"] = [0.02]
    header, body, doubts = speedup_tables(rows_to_table([fast, slow]))["cpu"]
    line = dict(zip(header, body[0], strict=True))
    assert line["eager ms"] == "30.000" and line["default"] == "3.00x" and line["ro"] == "3.75x"
    assert line["fastest"] == "ro" and doubts == []


def test_write_report(tmp_path, table, rows):
    path = write_report(tmp_path, table)
    assert path == tmp_path / REPORT_FILE
    assert path.read_text() == render(table, markdown=True)
    with closing(ResultSink(tmp_path)) as sink:
        for row in rows:
            sink.add(row)
    from_disk = read_results(tmp_path)
    assert sections(render(from_disk)) == sections(render(table))
