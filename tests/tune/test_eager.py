"""Eager presets (`orchestrator.tune.eager`): where the compiled preset chosen for a cell ran slower
than eager in its own processes, the cell's preset is eager. The rule on hand-built rows (the
tuner's confirmation, a runtime setting confirmed apart, a sweep), the presets files and the
"what won" table, and `compile_tuned` serving an eager preset in a fresh process. (Export of an
eager preset: tests/tune/test_export_apply.py.)"""

from __future__ import annotations

import json
from contextlib import closing

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from compiler.capabilities import CPU, check_preset_supported, known
from orchestrator.cli import main
from orchestrator.tune.cells import Cell
from orchestrator.tune.decide import within_precision
from orchestrator.tune.effects import EAGER_SETTING, preset_settings
from orchestrator.tune.presets import PRESETS_TABLE_FILE, Limits, read_presets_table
from orchestrator.tune.space import candidates
from store.rows import make_row
from store.schema import PRESETS_SCHEMA
from store.sink import ResultSink
from tests.conftest import _result
from tests.tune.test_export_apply import (
    compile_tuned_in_fresh_process,
    edit_presets,
    local_stack_fields,
    write_export,
)
from tests.tune.test_runtime_settings import cell_and_jobs
from tests.tune.test_tune import MLP, RESNET, STOCK, make_job_for, paired_job, row, samples


def timed(job, eager_ms, compiled_ms, procs=3, eager_spread=0.01, **extra):
    """A results row of `job` whose eager and compiled calls were timed interleaved in `procs`
    processes of 30 calls each; `eager_ms=None`: no eager samples (as rows that cannot be judged)."""
    if eager_ms is not None:
        extra["eager_samples_ms"] = samples(eager_ms, 30, procs, eager_spread, seed=3)
    extra.update(compiled_samples_ms=samples(compiled_ms, 30, procs, seed=2), samples_per_repeat=[30] * procs)
    return make_row(job, _result("ok", eager_ms or 10.0, compiled_ms, **extra), run_id="r")


# --- the rule, in the tuner's decision ------------------------------------------------------------


@pytest.fixture
def tuned_cell():
    """cpu/resnet/bs1: default+freezing beat the stock ro (6 against 8 ms) in their confirmation."""
    cell = Cell("cpu", "cpu", RESNET, 1, "fp32")
    cands = {c.config.name: c for c in candidates(STOCK, RESNET, "cpu", "fp32", knobs=("freezing",))}
    rung1 = [
        (cands["ro"], row(make_job_for(cell, cands["ro"], None), ms=8.0)),
        (cands["default+freezing"], row(make_job_for(cell, cands["default+freezing"], None), ms=6.0)),
    ]
    job = paired_job(cands)

    def decided(eager_ms, procs=3, eager_spread=0.01, judged=True, eager_presets=True):
        """(entry, why, the eager check) of a confirmation that timed eager at `eager_ms`; with
        `judged=False` the same row without its eager samples, which no rule can judge."""
        confirm = timed(
            job,
            eager_ms,
            6.0,
            procs,
            eager_spread,
            baseline_ms=8.0,
            baseline_samples_ms=samples(8.0, 30, procs, seed=1),
        )
        if not judged:
            confirm["eager_samples_ms"] = None
        log: dict = {}
        pair = (cands["default+freezing"], cands["ro"], confirm)
        entry, why = within_precision(cell, rung1, pair, Limits(), log, eager_presets)
        return entry, why, log.get("eager_check")

    return decided


def test_eager_clearly_faster_than_the_tuned_preset_becomes_the_preset(tuned_cell):
    entry, why, check = tuned_cell(5.0)
    assert entry["config"] == "eager" and entry["compile"] is None and entry["source"] == "eager"
    assert entry["runtime"] == {} and entry["precision"] == entry["dtype"] == "fp32"
    assert (
        entry["eager_over_config"] == "default+freezing" and entry["eager_over_compile"]["freezing"] is True
    )
    assert entry["eager_gain"] == pytest.approx(6.0 / 5.0, rel=0.02) and entry["eager_gain_ci_low"] > 1
    assert entry["eager_gain_processes"] == 3 and entry["eager_over_ms"] == 6.0
    assert entry["eager_ms"] == 5.0 and entry["compiled_ms"] is None and entry["compile_s"] is None
    # against the best stock mode: the same processes timed ro, the candidate and eager in turn
    assert entry["stock_config"] == "ro" and entry["speedup_vs_stock"] == pytest.approx(8.0 / 5.0, rel=0.02)
    assert entry["speedup_vs_stock_ci_low"] > 1
    assert entry["speedup_vs_stock_from"].startswith(
        "paired: eager and ro interleaved in the same 3 processes"
    )
    assert why.startswith("eager: compiled default+freezing took 1.2") and "had been chosen: tuned:" in why
    assert why == entry["decision"] and check["verdict"] == "eager" and check["effect"] == "helps"
    # `tune --no-eager`: the compiled preset stays, and the check says why
    kept, why, check = tuned_cell(5.0, eager_presets=False)
    assert kept == tuned_cell(5.0, judged=False)[0] and why.startswith("tuned:")
    assert check["verdict"] == "kept" and check["why"].endswith("eager presets are off (--no-eager)")


def test_eager_faster_within_the_noise_or_slower_changes_nothing(tuned_cell):
    entry, _, check = tuned_cell(5.0, judged=False)
    assert entry["config"] == "default+freezing" and check["verdict"] == "not judged"
    # faster by its median, but an interval that reaches below 1
    entry, why, check = tuned_cell(5.9, eager_spread=0.10)
    assert check["gain"] > 1 and check["ci_low"] < 1 < check["ci_high"] and check["verdict"] == "kept"
    assert (entry, why) == tuned_cell(5.9, eager_spread=0.10, judged=False)[:2] and why.startswith("tuned:")
    # slower: the compiled preset is faster, and stays
    entry, why, check = tuned_cell(7.0)
    assert check["ci_high"] < 1 and check["effect"] == "hurts"
    assert (entry, why) == tuned_cell(7.0, judged=False)[:2]
    # clearly faster, but in one process: its interval cannot cover the spread between processes
    entry, why, check = tuned_cell(5.0, procs=1)
    assert check["ci_low"] > 1 and check["verdict"] == "kept" and "fewer than 2 processes" in check["why"]
    assert (entry, why) == tuned_cell(5.0, procs=1, judged=False)[:2]


def test_a_confirmation_that_timed_eager_in_another_precision_is_not_judged():
    # the stock ro kept against a bf16 candidate; their job ran eager in bf16, the candidate's
    # precision: eager of this fp32 cell was not timed there, however fast it was
    cell = Cell("cpu", "cpu", MLP, 4, "fp32")
    cands = {f"{c.config.name}@{c.dtype}": c for c in candidates(STOCK, MLP, "cpu", "fp32", ("bf16",), ())}
    stock, bf16 = cands["ro@fp32"], cands["ro@bf16"]
    rung1 = [
        (stock, row(make_job_for(cell, stock, None), ms=8.0)),
        (bf16, row(make_job_for(cell, bf16, None), ms=7.0)),
    ]
    job = make_job_for(cell, bf16, stock)
    confirm = timed(job, 5.0, 8.0, baseline_ms=8.0, baseline_samples_ms=samples(8.0, 30, 3, seed=1))
    log: dict = {}
    entry, why = within_precision(cell, rung1, (bf16, stock, confirm), Limits(), log)
    assert entry["config"] == "ro" and entry["source"] == "stock" and why.startswith("stock:")
    assert log["eager_check"] == {
        "hardware": "cpu",
        "model": "mlp",
        "cell": "cpu/mlp/bs4/fp32",
        "config": "ro",
        "job_id": job.job_id,
        "verdict": "not judged",
        "why": f"eager in job {job.job_id} ran in bf16, not in the cell's fp32",
    }


def test_a_runtime_setting_confirmed_apart_is_eagers_too_and_the_stock_comparison_is_unpaired():
    cell, cands, jobs = cell_and_jobs()  # A100/resnet/bs1
    cand, stock = cands["ro+cudnn_benchmark"], cands["ro"]
    rung1 = [(stock, row(jobs["ro"], ms=8.0)), (cand, row(jobs["ro+cudnn_benchmark"], ms=6.0))]
    own, apart = timed(jobs["ro+cudnn_benchmark"], 5.0, 6.0), timed(jobs["ro"], 7.5, 8.0)
    entry, why = within_precision(cell, rung1, (cand, stock, own, apart), Limits())
    assert entry["config"] == "eager" and entry["runtime"] == {"cudnn_benchmark": True}
    assert entry["eager_over_compile"]["runtime"] == {"cudnn_benchmark": True}
    assert (
        entry["speedup_vs_stock"] == pytest.approx(8.0 / 5.0, rel=0.02)
        and entry["speedup_vs_stock_ci_low"] > 1
    )
    assert entry["speedup_vs_stock_from"] == (
        f"unpaired: ro in the 3 processes of job {jobs['ro'].job_id}, eager in the 3 processes of job "
        f"{jobs['ro+cudnn_benchmark'].job_id} (they differ in a runtime setting)"
    )
    assert preset_settings(entry) == [EAGER_SETTING, "cudnn_benchmark"]


def test_the_capability_check_accepts_an_eager_preset():
    eager = {"config": "eager", "compile": None, "runtime": {}, "precision": "fp32"}
    assert check_preset_supported(CPU, eager) is None and check_preset_supported(known("H100"), eager) is None
    v100_bf16 = check_preset_supported(known("V100"), {**eager, "precision": "bf16"})
    assert "bf16 is emulated there" in v100_bf16 and "Inductor" not in v100_bf16  # nothing compiles


# --- a sweep's presets, the files and the "what won" table ----------------------------------------


def test_orchestrate_presets_writes_and_reports_an_eager_preset(tmp_path, table_jobs, capsys):
    out = tmp_path / "out"
    with closing(ResultSink(out)) as sink:
        for name, eager_ms, compiled_ms in (
            ("cpu/mlp/bs4/fp32/default", 3.0, 5.0),
            ("cpu/mlp/bs4/fp32/ro", 3.0, 4.0),  # the fastest compiled config, and eager faster still
            ("cpu/resnet/bs1/fp32/default", 50.0, 40.0),  # compiled faster: kept
        ):
            sink.add(timed(table_jobs[name], eager_ms, compiled_ms, **local_stack_fields()))
    assert main(["presets", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "cpu/mlp/bs4/fp32: eager (do not compile; runtime torch defaults): compiled ro took 1.3" in printed
    assert "over 3 processes (1.67x vs default)" in printed
    assert "| cpu | eager (do not compile) | 1 of 2 | " in printed and "| mlp | resnet |" in printed

    data = json.loads((out / "presets.json").read_text())
    assert data["format"] == 5
    mlp, resnet = data["presets"]
    assert mlp["config"] == "eager" and mlp["compile"] is None and mlp["eager_over_config"] == "ro"
    assert mlp["decision"].startswith("eager: compiled ro took") and resnet["config"] == "default"
    assert mlp["speedup_vs_default"] == pytest.approx(5.0 / 3.0) and "stock_config" not in mlp
    table = {r["model"]: r for r in read_presets_table(out).to_pylist()}
    assert table["mlp"]["compile"] is None and json.loads(table["mlp"]["runtime"]) == {}
    assert json.loads(table["mlp"]["eager_over_compile"])["mode"] == "reduce-overhead"
    assert table["mlp"]["eager_gain_ci_low"] > 1 and table["mlp"]["eager_gain_processes"] == 3
    assert json.loads(table["resnet"]["compile"])["mode"] is None and table["resnet"]["eager_gain"] is None

    # a presets.parquet of format 3 (no eager columns) reads on, those columns null
    old = PRESETS_SCHEMA.names[: PRESETS_SCHEMA.get_field_index("runtime")] + ["source", "decision"]
    pq.write_table(pa.Table.from_pylist([{k: table["resnet"][k] for k in old}]), out / PRESETS_TABLE_FILE)
    (got,) = read_presets_table(out).to_pylist()
    assert got["config"] == "default" and got["runtime"] is None and got["eager_over_config"] is None


# --- compile_tuned ---------------------------------------------------------------------------------


def test_compile_tuned_serves_an_eager_preset_uncompiled_under_its_runtime_settings(tmp_path):
    """A real export whose mlp preset is eager with cudnn_benchmark: in a fresh process,
    compile_tuned returns the model itself, with the setting on, and compiles nothing (Dynamo and
    Inductor never imported)."""

    def eager(presets):
        entry = presets["presets"][0]
        entry.update(
            config="eager",
            compile=None,
            runtime={"cudnn_benchmark": True},
            precision="fp32",
            hardware="cpu",
            eager_over_config="reduce-overhead+freezing",
            eager_gain=1.27,
            eager_gain_ci_low=1.262,
            eager_gain_ci_high=1.279,
            eager_gain_processes=3,
        )

    dest = edit_presets(write_export(tmp_path / "export"), eager)
    got = compile_tuned_in_fresh_process(
        dest,
        "strict=True",
        "{'same': served is model, 'flag': torch.backends.cudnn.benchmark, 'summary': applied.summary(),"
        " 'config': applied.config, 'runtime': applied.runtime, 'compile_s': applied.compile_s, 'warned': warned,"
        " 'compilers': sorted(m for m in ('torch._dynamo', 'torch._inductor') if m in sys.modules)}",
    )
    assert (
        got["same"] is True
        and got["flag"] is True
        and got["runtime"] == {"cudnn_benchmark": True, "cudnn_enabled": True}
    )
    assert got["summary"] == (
        "cpu: exact eager preset, not compiled: compiled reduce-overhead+freezing was 1.27x slower "
        "[1.26, 1.28] over 3 processes on cpu"
    )
    assert got["config"] is None and got["compile_s"] is None and got["compilers"] == []
    assert [w for w in got["warned"] if "cudnn_benchmark: False -> True" in w]
