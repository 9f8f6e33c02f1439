"""A tune's stages on hand-built rows of an H100 cell under the stock and bf16 budgets: precision
first, the knobs on each budget's fastest base, the stock user confirmed in processes of its own,
and per budget a preset that beats the stock user (or is its choice), with its figures against
stock eager and stock torch.compile. (The real rounds on Ray: tests/integration/test_tune.py.)"""

from __future__ import annotations

import pytest

from compiler.accuracy import AccuracyBudget
from compiler.capabilities import known
from orchestrator.tune import confirm as confirm_stage
from orchestrator.tune import knobs as knobs_stage
from orchestrator.tune import rung0 as rung0_stage
from orchestrator.tune import rung1 as rung1_stage
from orchestrator.tune import search
from orchestrator.tune.cells import Cell, CellRun
from orchestrator.tune.presets import Limits
from orchestrator.tune.space import candidates
from store.rows import make_row
from tests.conftest import _result
from tests.tune.test_tune import RESNET, STOCK, make_job_for, samples

CELL = Cell("H100", "cuda", RESNET, 16, "fp32")
BUDGETS = (AccuracyBudget("stock"), AccuracyBudget("bf16"))
NAMES = {c.name for c in STOCK}
LIMITS = Limits()
PROCS = 2


def accuracy(dtype: str, spread: float = 1.5) -> dict:
    """What a row's job measured of its outputs: TF32 convolutions' error in the stock fp32, more in bf16."""
    err = {"fp32": 1e-3, "tf32": 1.5e-3}.get(dtype, 1e-2)
    return {
        "fp64_max_rel_err": err,
        "eager_fp64_max_rel_err": err,
        "output_spread": spread,
        "output_sensitivity": [1.0, 1.0, 1.0],
        "weights": "random",
    }


def cheap(job, ms: float, spread: float = 1.5):
    """A one-process row of rung 0 or the knobs round."""
    return make_row(job, _result("ok", 10.0, ms, **accuracy(job.dtype, spread)), run_id="r")


def timed(job, ms: float, eager_ms: float, baseline_ms: float | None = None, spread: float = 1.5):
    """A confirmation row: every side's samples from the same `PROCS` processes."""
    extra = {}
    if baseline_ms is not None:
        extra = {"baseline_ms": baseline_ms, "baseline_samples_ms": samples(baseline_ms, procs=PROCS, seed=3)}
    result = _result(
        "ok",
        eager_ms,
        ms,
        compiled_samples_ms=samples(ms, procs=PROCS, seed=1),
        eager_samples_ms=samples(eager_ms, procs=PROCS, seed=2),
        samples_per_repeat=[30] * PROCS,
        repeats=PROCS,
        **accuracy(job.dtype, spread),
        **extra,
    )
    return make_row(job, result, run_id="r")


def tune(
    rung0: dict,
    knobs: dict,
    confirm,
    spread: float = 1.5,
    eager_presets: bool = True,
    precisions: tuple[str, ...] = ("bf16",),
):
    """The stages of one cell: `rung0` and `knobs` map (config, precision) to a latency; `confirm`
    maps a confirmation job's name to its row's (ms, eager ms, baseline ms)."""
    space = candidates(STOCK, RESNET, "cuda", "fp32", precisions, ("freezing",), (), known("H100"))
    by_key = {c.key: c for c in space}
    run = CellRun(CELL, space)
    results0 = [
        (by_key[k], cheap(make_job_for(CELL, by_key[k], None), ms, spread)) for k, ms in rung0.items()
    ]
    asked = rung0_stage.promote(run, results0, BUDGETS, LIMITS)
    assert {c.key for c in asked} == set(knobs)  # the knob on each budget's fastest base
    knob_rows = [(c, cheap(make_job_for(CELL, c, None), knobs[c.key], spread)) for c in asked]
    knobs_stage.promote(run, knob_rows, LIMITS, 20, NAMES)
    assert (
        rung1_stage.to_measure(run, LIMITS, NAMES) == []
    )  # one knob: nothing the confirmation does not time
    rung1_stage.promote(run, rung1_stage.survivor_results(run, []), LIMITS, NAMES)
    jobs = confirm_stage.cell_jobs(run, lambda c, b: make_job_for(CELL, c, b))
    rows2 = {j.job_id: timed(j, *confirm[j.name], spread=spread) for j in jobs}
    return search.decide_cell(run, BUDGETS, rows2, LIMITS, eager_presets, NAMES), {j.name for j in jobs}


RUNG0 = {("default", "fp32"): 10.0, ("ro", "fp32"): 9.0, ("default", "bf16"): 5.0, ("ro", "bf16"): 4.0}
KNOBS = {("ro+freezing", "fp32"): 8.5, ("ro+freezing", "bf16"): 3.5}


def test_bf16_is_deployed_where_it_beats_the_stock_user_and_says_by_how_much():
    confirm = {
        "H100/resnet/bs16/fp32/ro/vs/default": (9.0, 12.0, 10.0),  # the stock user: both modes, eager
        "H100/resnet/bs16/fp32/ro+freezing/vs/ro": (8.5, 12.0, 9.0),
        "H100/resnet/bs16/bf16/ro+freezing/vs/ro": (3.5, 6.0, 4.0),
    }
    decided, ran = tune(RUNG0, KNOBS, confirm)
    assert ran == set(confirm)
    stock, bf16 = decided.entries
    assert (stock["budget"], stock["config"], stock["precision"], stock["source"]) == (
        "stock",
        "ro+freezing",
        "fp32",
        "tuned",
    )
    assert (
        stock["vs_stock_compile"] == pytest.approx(9.0 / 8.5, rel=0.02)
        and stock["vs_stock_compile_ci_low"] > 1
    )
    assert (bf16["budget"], bf16["config"], bf16["precision"], bf16["dtype"]) == (
        "bf16",
        "ro+freezing",
        "bf16",
        "fp32",
    )
    assert (
        bf16["vs_stock_compile"] == pytest.approx(9.0 / 3.5, rel=0.02) and bf16["vs_stock_compile_ci_low"] > 2
    )
    assert bf16["vs_stock_eager"] == pytest.approx(12.0 / 3.5, rel=0.02)
    assert bf16["speedup_vs_stock"] == pytest.approx(4.0 / 3.5, rel=0.02) and bf16["stock_config"] == "ro"
    assert bf16["max_rel_err"] == 1e-2 and bf16["stock_max_rel_err"] == 1e-3
    assert bf16["stock_compile_config"] == "ro" and bf16["accuracy_decision"] == "determined"
    assert "against the stock user" in decided.decisions["H100/resnet/bs16/fp32 (bf16 budget)"]


def test_a_lower_precision_that_does_not_beat_the_stock_user_is_not_deployed():
    confirm = {
        "H100/resnet/bs16/fp32/ro/vs/default": (9.0, 12.0, 10.0),
        "H100/resnet/bs16/fp32/ro+freezing/vs/ro": (8.5, 12.0, 9.0),
        "H100/resnet/bs16/bf16/ro+freezing/vs/ro": (9.2, 12.0, 9.4),  # ranked fast, timed slow
    }
    decided, _ = tune(RUNG0, KNOBS, confirm)
    stock, bf16 = decided.entries
    assert bf16["config"] == stock["config"] == "ro+freezing" and bf16["precision"] == "fp32"
    why = decided.decisions["H100/resnet/bs16/fp32 (bf16 budget)"]
    assert why.startswith("not deployed: ro+freezing (bf16): ") and "does not lie above 1" in why, why


def test_a_lower_precision_close_behind_is_confirmed_and_deployed_where_the_fastest_fails():
    """resnet-50 at batch 1 on an H100: an fp32 knob ranked first and bf16 close behind, both well
    ahead of the stock config. The fp32 one's confirmation could not tell it from the stock config;
    bf16, confirmed too, beats the stock user and is the bf16 budget's preset."""
    knobs = {("ro+freezing", "fp32"): 3.4, ("ro+freezing", "bf16"): 3.5}
    confirm = {
        "H100/resnet/bs16/fp32/ro/vs/default": (9.0, 12.0, 10.0),
        "H100/resnet/bs16/fp32/ro+freezing/vs/ro": (9.0, 12.0, 9.0),  # ranked fast, timed as stock
        "H100/resnet/bs16/bf16/ro+freezing/vs/ro": (3.5, 6.0, 4.0),
    }
    decided, ran = tune(RUNG0, knobs, confirm)
    assert ran == set(confirm)  # bf16 confirmed although fp32 ranked first
    stock, bf16 = decided.entries
    assert (stock["config"], stock["source"], stock["precision"]) == ("ro", "stock", "fp32")
    assert (bf16["config"], bf16["precision"]) == ("ro+freezing", "bf16")
    assert bf16["vs_stock_compile"] == pytest.approx(9.0 / 3.5, rel=0.02)
    # where both beat the stock user, the faster is served, and the decision names the other
    confirm["H100/resnet/bs16/fp32/ro+freezing/vs/ro"] = (3.0, 12.0, 9.0)
    decided, _ = tune(RUNG0, knobs, confirm)
    stock, bf16 = decided.entries
    assert (bf16["config"], bf16["precision"]) == ("ro+freezing", "fp32")
    why = decided.decisions["H100/resnet/bs16/fp32 (bf16 budget)"]
    assert "ro+freezing (bf16), which beats the stock user too, is slower at" in why, why
    # a lower precision ranked slower than the stock config is not confirmed
    knobs = {("ro+freezing", "fp32"): 3.4}  # on the fastest base only: fp32's
    rung0 = {**RUNG0, ("default", "bf16"): 11.0, ("ro", "bf16"): 10.0}
    del confirm["H100/resnet/bs16/bf16/ro+freezing/vs/ro"]
    _, ran = tune(rung0, knobs, confirm)
    assert ran == set(confirm)


def test_the_stock_users_choice_is_the_faster_stock_mode_or_eager():
    # default beat reduce-overhead in the stock user's own processes, and no candidate beats it
    confirm = {
        "H100/resnet/bs16/fp32/ro/vs/default": (9.0, 12.0, 8.0),
        "H100/resnet/bs16/fp32/ro+freezing/vs/ro": (8.9, 12.0, 9.0),
        "H100/resnet/bs16/bf16/ro+freezing/vs/ro": (8.7, 12.0, 9.0),
    }
    decided, _ = tune(RUNG0, KNOBS, confirm)
    for entry in decided.entries:
        assert (entry["config"], entry["source"], entry["precision"]) == ("default", "stock", "fp32")
        assert entry["vs_stock_compile"] == 1.0 and entry["stock_compile_config"] == "default"
    # eager beat both stock modes: the stock user runs eager, and so does the preset
    confirm["H100/resnet/bs16/fp32/ro/vs/default"] = (9.0, 6.0, 8.0)
    decided, _ = tune(RUNG0, KNOBS, confirm)
    for entry in decided.entries:
        assert entry["config"] == "eager" and entry["compile"] is None and entry["vs_stock_eager"] == 1.0
        assert entry["vs_stock_compile"] == pytest.approx(8.0 / 6.0, rel=0.02)
    # --no-eager: a preset is never eager, the stock user's choice included
    decided, _ = tune(RUNG0, KNOBS, confirm, eager_presets=False)
    for entry in decided.entries:
        assert (entry["config"], entry["source"]) == ("default", "stock")


def test_an_undetermined_cell_keeps_its_precision_under_every_budget():
    confirm = {
        "H100/resnet/bs16/fp32/ro/vs/default": (9.0, 12.0, 10.0),
        "H100/resnet/bs16/fp32/ro+freezing/vs/ro": (8.5, 12.0, 9.0),
    }
    knobs = {("ro+freezing", "fp32"): 8.5}  # bf16 fits no budget: no knob turned on it
    decided, ran = tune(RUNG0, knobs, confirm, spread=1e-3)  # an output nearly constant
    assert ran == set(confirm)
    for entry in decided.entries:
        assert (entry["config"], entry["precision"]) == ("ro+freezing", "fp32")
    stock, bf16 = decided.entries
    assert stock["accuracy_decision"] == bf16["accuracy_decision"] == "undetermined"
    assert "nearly constant" in bf16["accuracy_why"] and "keeps its own precision" in bf16["accuracy_why"]


def test_a_budget_that_allows_more_error_never_deploys_a_slower_preset():
    """detr on an H100: its bf16 budget could not judge precision (an output nearly constant, less
    than bf16's 5% could erase) and kept fp32 at 1.00x, while the stock budget, judged at its
    tighter tolerance, deployed tf32 at 1.23x. What is within the tighter tolerance is within the
    looser one: the bf16 budget deploys the stock budget's tf32 preset."""
    rung0 = {**RUNG0, ("default", "tf32"): 8.0, ("ro", "tf32"): 7.0}
    knobs = {("ro+freezing", "fp32"): 8.5, ("ro+freezing", "tf32"): 6.5}
    confirm = {
        "H100/resnet/bs16/fp32/ro/vs/default": (9.0, 12.0, 10.0),
        "H100/resnet/bs16/fp32/ro+freezing/vs/ro": (8.5, 12.0, 9.0),
        "H100/resnet/bs16/tf32/ro+freezing/vs/ro": (6.5, 10.0, 7.0),
    }
    spread = 0.02  # judges the stock budget's 2e-3, not bf16's 5e-2
    decided, ran = tune(rung0, knobs, confirm, spread=spread, precisions=("tf32", "bf16"))
    assert ran == set(confirm)
    stock, bf16 = decided.entries
    assert (stock["budget"], stock["config"], stock["precision"]) == ("stock", "ro+freezing", "tf32")
    assert stock["accuracy_decision"] == "determined"
    assert stock["vs_stock_compile"] == pytest.approx(9.0 / 6.5, rel=0.02)
    # the bf16 budget alone would keep fp32 (undetermined); it takes the stock budget's preset
    assert (bf16["budget"], bf16["config"], bf16["precision"]) == ("bf16", "ro+freezing", "tf32")
    assert bf16["vs_stock_compile"] == pytest.approx(stock["vs_stock_compile"])
    assert bf16["accuracy_decision"] == "determined" and bf16["accuracy_rule"] == stock["accuracy_rule"]
    assert bf16["accuracy_why"].startswith("judged under the stock budget: ")
    why = decided.decisions["H100/resnet/bs16/fp32 (bf16 budget)"]
    assert why.startswith("bf16 budget as the stock budget, which allows less error: ro+freezing (tf32)"), why
    assert "beats its own choice, ro+freezing (fp32)" in why, why


def test_a_sweeps_presets_are_chosen_per_budget_and_state_their_gain_over_the_stock_user():
    from orchestrator.tune.presets import derive_presets
    from reports.speedup import render
    from store.schema import rows_to_table

    space = {c.key: c for c in candidates(STOCK, RESNET, "cuda", "fp32", ("bf16",), (), (), known("H100"))}

    def swept(key, ms, eager_ms, err=None):
        job = make_job_for(CELL, space[key], None)
        got = timed(job, ms, eager_ms)
        if err is not None:
            got["fp64_max_rel_err"] = err
        return got

    rows = [
        swept(("default", "fp32"), 10.0, 12.0),
        swept(("ro", "fp32"), 9.0, 12.0),  # the stock user's torch.compile
        swept(("ro", "bf16"), 4.0, 6.0),
        swept(("default", "bf16"), 3.0, 6.0, err=0.2),  # the fastest, but over the bf16 budget
    ]
    data = derive_presets(rows_to_table(rows), accuracy=BUDGETS)
    stock, bf16 = sorted(data["presets"], key=lambda p: p["budget"] != "stock")
    assert (stock["budget"], stock["config"], stock["precision"], stock["dtype"]) == (
        "stock",
        "ro",
        "fp32",
        "fp32",
    )
    assert stock["vs_stock_compile"] == 1.0 and stock["vs_stock_eager"] == pytest.approx(12.0 / 9.0, rel=0.02)
    assert (bf16["config"], bf16["precision"], bf16["dtype"]) == ("ro", "bf16", "fp32")
    assert (
        bf16["vs_stock_compile"] == pytest.approx(9.0 / 4.0, rel=0.02) and bf16["vs_stock_compile_ci_low"] > 2
    )
    assert bf16["max_rel_err"] == 1e-2 and bf16["stock_max_rel_err"] == 1e-3
    assert bf16["accuracy_decision"] == "determined" and bf16["stock_compile_config"] == "ro"
    # without budgets: a preset per precision swept, each against the same stock user where it has one
    plain = {p["dtype"]: p for p in derive_presets(rows_to_table(rows))["presets"]}
    assert plain["bf16"]["config"] == "default" and plain["fp32"]["vs_stock_compile"] == 1.0
    text = render(rows_to_table(rows))
    assert "# Against a stock PyTorch user" in text
    section = text.split("# Against a stock PyTorch user")[1]
    line = next(x for x in section.splitlines() if x.startswith("| resnet | 16 |"))
    assert "| ro 9.000 |" in line and "| default 3.00x (err 0.2) |" in line, line


def test_a_stock_mode_chosen_within_precision_defers_to_the_stock_users_own_timing():
    """Within the precision, the knob did not beat reduce-overhead, so that stock mode stood; the
    stock user's processes timed both stock modes side by side and found default faster. The preset
    is the stock user's choice, decided so, not a reduce-overhead 'not deployed' against it."""
    confirm = {
        "H100/resnet/bs16/fp32/ro/vs/default": (9.0, 12.0, 8.0),
        "H100/resnet/bs16/fp32/ro+freezing/vs/ro": (9.0, 12.0, 9.0),
        "H100/resnet/bs16/bf16/ro+freezing/vs/ro": (8.7, 12.0, 9.0),
    }
    decided, _ = tune(RUNG0, KNOBS, confirm)
    stock = decided.entries[0]
    assert (stock["budget"], stock["config"], stock["source"]) == ("stock", "default", "stock")
    why = decided.decisions["H100/resnet/bs16/fp32 (stock budget)"]
    assert why.startswith("stock: ") and "not deployed" not in why, why


def test_the_published_deployed_summary_has_the_fields_the_results_page_reads():
    """docs/results/deployed-summary.json is a tune's deployed.json, unedited: one entry per cell and
    budget with the figures against the stock user, and geometric means that follow from them."""
    import json
    import math
    from pathlib import Path

    doc = json.loads((Path(__file__).parents[2] / "docs/results/deployed-summary.json").read_text())
    assert doc["gpu"] and doc["torch"]
    keys = {
        "cell",
        "budget",
        "preset",
        "policy",
        "vs_stock_eager",
        "vs_stock_compile",
        "max_rel_err",
        "weights",
    }
    for entry in doc["cells"]:
        assert keys <= entry.keys(), entry["cell"]
        assert entry["budget"] in doc["budgets"]
    for name, summary in doc["budgets"].items():
        mine = [e for e in doc["cells"] if e["budget"] == name]
        assert summary["cells"] == len(mine) == len({e["cell"] for e in mine})
        geomean = math.exp(sum(math.log(e["vs_stock_compile"]) for e in mine) / len(mine))
        assert geomean == pytest.approx(summary["geomean_vs_stock_compile"])
        assert summary["below_1"] == [e["cell"] for e in mine if e["vs_stock_compile"] < 1.0]


def test_an_export_of_a_sweep_with_budgets_serves_each_cell_the_precision_its_budget_chose(tmp_path):
    """A sweep under `accuracy: [stock]` measures fp32 and tf32 rows of one fp32 cell; its export
    (straight from the results, no tune) serves that cell one preset, tf32 where it fits the budget
    and is faster, not a preset per precision that a float32 model would find fp32's first of."""
    from compiler.serving import ExportError
    from orchestrator.spec.sweep import parse_spec
    from orchestrator.tune.export import plan_export
    from store.runlog import start_run
    from store.sink import ResultSink

    space = {c.key: c for c in candidates(STOCK, RESNET, "cuda", "fp32", ("tf32",), (), (), known("H100"))}
    sink = ResultSink(tmp_path)
    for key, ms in [(("ro", "fp32"), 9.0), (("ro", "tf32"), 5.0)]:
        sink.add(timed(make_job_for(CELL, space[key], None), ms, 12.0))
    sink.close()
    yaml = "name: t\nmodels: [python:workers.toy:mlp]\nbatch_sizes: [16]\ndtypes: [fp32]\nconfigs: {ro: {}}\n"
    start_run(tmp_path, "r1", parse_spec(yaml + "accuracy: [stock]\n"), [], {}, 1, 0)
    (entry,), _, _ = plan_export(tmp_path, "H100")
    assert (entry["dtype"], entry["precision"], entry["budget"]) == ("fp32", "tf32", "stock")
    assert entry["vs_stock_compile"] == pytest.approx(9.0 / 5.0, rel=0.02)
    assert plan_export(tmp_path, "H100", budget="stock")[0] == [entry]
    with pytest.raises(ExportError, match="--budget bf16: the sweep under .* decided under stock"):
        plan_export(tmp_path, "H100", budget="bf16")
    start_run(tmp_path, "r2", parse_spec(yaml), [], {}, 1, 0)  # the latest run declared no budget
    assert {e["dtype"] for e in plan_export(tmp_path, "H100")[0]} == {"fp32", "tf32"}
    with pytest.raises(ExportError, match="--budget stock: .* decided under no accuracy budget"):
        plan_export(tmp_path, "H100", budget="stock")


def test_a_budgeted_sweep_whose_cells_are_all_undecided_refuses_its_export_naming_them(tmp_path, monkeypatch):
    """A budgeted sweep whose only cell's timing is doubted has no preset under its budget: the
    export refuses, naming the cell and why, as for a sweep without budgets."""
    from compiler.serving import ExportError
    from compiler.statistics.thresholds import THRESHOLDS_ENV
    from orchestrator.spec.sweep import parse_spec
    from orchestrator.tune.export import plan_export
    from store.runlog import start_run
    from store.sink import ResultSink

    monkeypatch.delenv(THRESHOLDS_ENV)  # the project's own doubt of a busy host (tests/conftest.py)
    space = {c.key: c for c in candidates(STOCK, RESNET, "cuda", "fp32", ("tf32",), (), (), known("H100"))}
    sink = ResultSink(tmp_path)
    for key, ms in [(("ro", "fp32"), 9.0), (("ro", "tf32"), 5.0)]:
        row = timed(make_job_for(CELL, space[key], None), ms, 12.0)
        sink.add({**row, "host_other_share": [0.6, 0.1]})  # another sweep took its cores while it timed
    sink.close()
    yaml = "name: t\nmodels: [python:workers.toy:mlp]\nbatch_sizes: [16]\ndtypes: [fp32]\nconfigs: {ro: {}}\n"
    start_run(tmp_path, "r1", parse_spec(yaml + "accuracy: [stock]\n"), [], {}, 1, 0)
    with pytest.raises(ExportError, match=r"H100/resnet/bs16/fp32: undecided, .*other processes took 60%"):
        plan_export(tmp_path, "H100", budget="stock")
