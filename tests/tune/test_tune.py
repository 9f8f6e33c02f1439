"""The tuner's decisions on hand-built rows: the search space, promotion between rungs, the
statistics-gated winner, budgets and accuracy gating, and the presets table. (The real search on
a Ray cluster is tests/integration/test_tune.py.)"""

from __future__ import annotations

import json

import numpy as np
import pytest

from compiler import statistics as cstats
from compiler.config import CompileConfig
from compiler.job import MeasureSpec, ModelSpec
from orchestrator.tune.cells import Cell
from orchestrator.tune.decide import within_precision
from orchestrator.tune.knobs import best_fraction
from orchestrator.tune.plan import make_job, rung_measure
from orchestrator.tune.presets import (
    Limits,
    derive_presets,
    read_presets_table,
    stack_key,
    write_preset_files,
)
from orchestrator.tune.space import KNOB_NAMES, candidates, expanded_options, is_base, knobs_on
from store.rows import make_row
from store.schema import PRESETS_SCHEMA, rows_to_table

RESNET = ModelSpec(id="hf:microsoft/resnet-50", name="resnet")
MLP = ModelSpec(id="python:workers.toy:mlp", name="mlp")
STOCK = (CompileConfig("default"), CompileConfig("ro", mode="reduce-overhead"))


# --- the search space -----------------------------------------------------------------------------


def names(cands):
    return {(c.config.name, c.dtype, c.stock) for c in cands}


def test_cpu_space_leaves_out_gpu_knobs_and_layout_for_non_image_models():
    cands = candidates(STOCK, MLP, "cpu", "fp32")
    got = {n for n, _, _ in names(cands)}
    assert {"default", "ro", "default+freezing", "ro+no_epilogue_fusion"} <= got
    assert not any("coordinate_descent" in n or "cudagraphs" in n or "channels_last" in n for n in got)
    assert all(c.stock == (c.config.name in ("default", "ro")) for c in cands)


def test_gpu_space_expands_modes_into_options_and_skips_knobs_the_mode_sets():
    cands = {c.config.name: c for c in candidates(STOCK, RESNET, "cuda", "fp32")}
    ro_cd = cands["ro+coordinate_descent"].config
    assert ro_cd.mode is None and ro_cd.options == {
        "triton.cudagraphs": True,
        "coordinate_descent_tuning": True,
    }
    # reduce-overhead sets them, and default+cudagraphs is reduce-overhead (the stock "ro") written out
    assert "ro+cudagraphs" not in cands and "default+cudagraphs" not in cands
    assert cands["default+channels_last"].config.channels_last
    assert "default+gemm_triton" not in cands  # only for max-autotune bases
    # CUDA graphs without trees: once per set of settings (ro+cudagraphs_no_trees is the same config)
    assert cands["default+cudagraphs_no_trees"].config.options == {
        "triton.cudagraphs": True,
        "triton.cudagraph_trees": False,
    }
    assert "ro+cudagraphs_no_trees" not in cands
    ma = (CompileConfig("ma", mode="max-autotune-no-cudagraphs"),)
    ma_cands = {c.config.name for c in candidates(ma, RESNET, "cuda", "fp32")}
    assert "ma+gemm_triton" in ma_cands and "ma+coordinate_descent" not in ma_cands
    assert "ma+cudagraphs_no_trees" in ma_cands
    assert expanded_options(ma[0]) == {"max_autotune": True, "coordinate_descent_tuning": True}


def test_precisions_only_when_allowed_and_knobs_on_every_base_of_each():
    assert {c.dtype for c in candidates(STOCK, MLP, "cpu", "fp32")} == {"fp32"}
    cands = candidates(STOCK, MLP, "cpu", "fp32", precisions=("fp32", "bf16"), knobs=("freezing",))
    assert names(cands) == {
        ("default", "fp32", True),
        ("ro", "fp32", True),
        ("default+freezing", "fp32", False),
        ("ro+freezing", "fp32", False),
        ("default", "bf16", False),
        ("ro", "bf16", False),
        ("default+freezing", "bf16", False),
        ("ro+freezing", "bf16", False),
    }
    by = {(c.config.name, c.dtype): c for c in cands}
    assert is_base(by["ro", "bf16"]) and not is_base(by["ro+freezing", "bf16"])
    assert knobs_on(cands, by["ro", "bf16"]) == [by["ro+freezing", "bf16"]]
    assert by["ro+freezing", "bf16"].turned == ("freezing",) and by["ro+freezing", "bf16"].base_name == "ro"
    assert set(KNOB_NAMES) >= {"freezing", "channels_last", "coordinate_descent"}


def test_rung_measures_and_jobs():
    m = MeasureSpec(warmup=5, iterations=100, rounds=10, repeats=1)
    assert rung_measure(m, "rung0").iterations == 25 and rung_measure(m, "rung0").rounds == 4
    assert rung_measure(m, "rung1").iterations == 100 and not rung_measure(m, "rung1").flops
    assert rung_measure(m, "confirm", 1).repeats == 2  # an interval across processes needs two
    cell = Cell("cpu", "cpu", MLP, 4, "fp32")
    cand, base = (
        next(
            c for c in candidates(STOCK, MLP, "cpu", "fp32", precisions=("bf16",)) if c.key == ("ro", "bf16")
        ),
        candidates(STOCK, MLP, "cpu", "fp32")[0],
    )
    job = make_job_for(cell, cand, base)
    assert job.dtype == "bf16" and job.baseline.dtype == "fp32" and job.baseline.config.name == "default"
    assert job.name == "cpu/mlp/bs4/bf16/ro/vs/default"
    plain = make_job_for(cell, cand, None)
    assert plain.job_id != job.job_id and plain.baseline is None


def test_a_tunes_options_are_its_sweep_options_and_its_own(tmp_path, monkeypatch):
    """`orchestrate tune`'s flags that `sweep` has too set the tune's `SweepOptions`; its rounds run
    with them into their folders, resuming, on the tune's cache, with --only and --timeout-cap left
    to the tune (it applies them to its candidates' jobs)."""
    from orchestrator.cli import build_parser
    from orchestrator.commands.tune import _tune_options
    from orchestrator.fleet.options import SweepOptions
    from orchestrator.spec.sweep import parse_spec
    from orchestrator.tune.plan import round_sweep_options
    from store.storage import checked

    flags = ["--only", "mlp", "--cpus-per-job", "1", "--timeout-cap", "90", "--no-overlap", "--eta", "4"]
    argv = ["tune", "t.yaml", "--out", str(tmp_path / "o"), *flags, "--max-compile-s", "60", "--no-eager"]
    monkeypatch.setattr("sys.argv", ["orchestrate", *argv])
    spec = parse_spec("name: t\nmodels: [python:workers.toy:mlp]\nbatch_sizes: [4]\nconfigs: {default: {}}\n")
    opts = _tune_options(build_parser().parse_args(argv), spec, deadline=None)
    sweep = opts.sweep
    assert isinstance(sweep, SweepOptions) and sweep.out_dir == checked(tmp_path / "o")
    assert (sweep.only, sweep.cpus_per_job, sweep.timeout_cap_s, sweep.overlap) == ("mlp", 1, 90, False)
    assert sweep.shared_cache and not sweep.resume and sweep.resume_command.endswith("--resume")
    assert (opts.eta, opts.limits.max_compile_s, opts.eager_presets) == (4, 60, False)
    where = checked(tmp_path / "o")
    rounds = round_sweep_options(opts, where, "RESUME", None)
    assert rounds == SweepOptions(
        out_dir=where,
        cpus_per_job=1,
        overlap=False,
        argv=sweep.argv,
        resume=True,
        resume_command="RESUME",
    )


def make_job_for(cell, cand, base):
    from orchestrator.spec.sweep import parse_spec

    spec = parse_spec("name: t\nmodels: [python:workers.toy:mlp]\nbatch_sizes: [4]\nconfigs: {default: {}}\n")
    return make_job(spec, cell, cand, MeasureSpec(), None, baseline=base, stack={"torch": "x"})


# --- rows -----------------------------------------------------------------------------------------


def row(job, status="ok", ms=5.0, **extra):
    from tests.conftest import _result

    return make_row(job, _result(status, 10.0, ms, **extra), run_id="r")


@pytest.fixture
def cell_rows():
    """Candidates of a cpu/resnet/bs1 cell and a real job for each, by config name."""
    cell = Cell("cpu", "cpu", RESNET, 1, "fp32")
    cands = {c.config.name: c for c in candidates(STOCK, RESNET, "cpu", "fp32", knobs=("freezing",))}
    return cands, {name: make_job_for(cell, c, None) for name, c in cands.items()}


def test_promote_keeps_the_fastest_third_and_the_best_stock(cell_rows):
    cands, jobs = cell_rows
    results = [
        (cands["default"], row(jobs["default"], ms=9.0)),
        (cands["ro"], row(jobs["ro"], ms=8.0)),
        (cands["default+freezing"], row(jobs["default+freezing"], ms=3.0)),
        (cands["ro+freezing"], row(jobs["ro+freezing"], "accuracy_fail", ms=1.0)),  # fastest, but wrong
    ]
    kept = best_fraction(results, 3, Limits())
    assert [c.config.name for c in kept] == ["default+freezing", "ro"]
    # a budget takes the fast one out; failed and missing rows never go on
    fast = row(jobs["default+freezing"], ms=3.0, compile_s=50.0)
    kept = best_fraction(
        [*results[:2], (cands["default+freezing"], fast), (cands["ro+freezing"], None)],
        3,
        Limits(max_compile_s=20.0),
    )
    assert [c.config.name for c in kept] == ["ro", "default"]
    # the stock config on top and room for one: the best other candidate still goes on
    kept = best_fraction([(cands["ro"], row(jobs["ro"], ms=2.0)), *results[2:]], 4, Limits())
    assert [c.config.name for c in kept] == ["ro", "default+freezing"]


def paired_job(cands):
    return make_job_for(Cell("cpu", "cpu", RESNET, 1, "fp32"), cands["default+freezing"], cands["ro"])


def samples(center, n=30, procs=3, spread=0.01, seed=0):
    rng = np.random.default_rng(seed)
    return [float(x) for x in center * (1 + spread * rng.standard_normal(n * procs))]


def confirm_row(job, stock_ms, cand_ms, procs=3, n=30):
    return row(
        job,
        ms=cand_ms,
        baseline_ms=stock_ms,
        baseline_samples_ms=samples(stock_ms, n, procs, seed=1),
        compiled_samples_ms=samples(cand_ms, n, procs, seed=2),
        samples_per_repeat=[n] * procs,
        compile_s=3.0,
    )


def test_a_candidate_wins_only_by_a_margin_the_statistics_support(cell_rows):
    cands, jobs = cell_rows
    cell = Cell("cpu", "cpu", RESNET, 1, "fp32")
    rung1 = [
        (cands["ro"], row(jobs["ro"], ms=8.0)),
        (cands["default+freezing"], row(jobs["default"], ms=6.0)),
    ]
    pair = (cands["default+freezing"], cands["ro"])

    entry, why = within_precision(cell, rung1, (*pair, confirm_row(paired_job(cands), 8.0, 6.0)), Limits())
    assert entry["source"] == "tuned" and entry["config"] == "default+freezing" and why.startswith("tuned")
    assert entry["speedup_vs_stock_ci_low"] > 1 and entry["stock_config"] == "ro"
    assert entry["compile_s"] == 12.5  # from its own cold job, not the paired one

    # as fast as each other (1% noise): the interval straddles 1, so the stock mode stays
    entry, why = within_precision(cell, rung1, (*pair, confirm_row(paired_job(cands), 8.0, 8.0)), Limits())
    assert entry["source"] == "stock" and entry["config"] == "ro" and "does not lie above 1" in why
    iv = cstats.paired_speedup(samples(8.0, seed=1), samples(8.0, seed=2), [30, 30, 30])
    assert not cstats.beats(iv) and iv.low < 1 < iv.high

    # a failed confirmation keeps the stock config
    entry, why = within_precision(cell, rung1, (*pair, row(paired_job(cands), "crash", ms=None)), Limits())
    assert entry["config"] == "ro" and "confirmation" in why


def test_stock_stays_when_no_candidate_leads_and_budgets_gate(cell_rows):
    cands, jobs = cell_rows
    cell = Cell("cpu", "cpu", RESNET, 1, "fp32")
    rung1 = [
        (cands["ro"], row(jobs["ro"], ms=5.0)),
        (cands["default+freezing"], row(jobs["default+freezing"], ms=6.0)),
    ]
    entry, why = within_precision(cell, rung1, None, Limits())
    assert entry["config"] == "ro" and entry["source"] == "stock"
    # over the memory budget the stock config is out: the only eligible candidate is the preset
    big = row(jobs["ro"], ms=5.0, peak_mem_bytes=8 * 2**30)
    entry, why = within_precision(cell, [(cands["ro"], big), rung1[1]], None, Limits(max_memory_mb=6 * 1024))
    assert entry["config"] == "default+freezing" and "no stock config" in why
    entry, why = within_precision(cell, [(cands["ro"], big)], None, Limits(max_memory_mb=1024))
    assert entry is None and "budgets" in why


# --- presets from a sweep's rows, with budgets; the presets table ---------------------------------


def test_derive_presets_with_budgets_and_the_presets_table(tmp_path, table_jobs):
    rows = [
        row(table_jobs["cpu/resnet/bs1/fp32/default"], ms=9.0, compile_s=20.0),
        row(table_jobs["cpu/resnet/bs1/fp32/ro"], ms=7.0, compile_s=90.0),  # fastest, slow to compile
        row(table_jobs["cpu/resnet/bs1/fp32/tuned"], "accuracy_fail", ms=2.0),
        row(table_jobs["cpu/mlp/bs1/fp32/tuned"], ms=1.0, compile_s=200.0),
    ]
    data = derive_presets(rows_to_table(rows))
    assert [(p["model"], p["config"]) for p in data["presets"]] == [("mlp", "tuned"), ("resnet", "ro")]
    data = derive_presets(rows_to_table(rows), Limits(max_compile_s=60.0))
    (p,) = data["presets"]
    assert p["config"] == "default" and p["over_budget"] == 1 and p["source"] == "swept"
    (missing,) = data["no_preset"]
    assert missing["statuses"] == {"tuned": "ok, compile 200.0 s over the 60 s budget"}
    assert data["budgets"] == {"max_compile_s": 60.0, "max_memory_mb": None}
    (key,) = data["classes"]["cpu"]
    assert key == stack_key(data["classes"]["cpu"][key]["stack"]) and "torch 2.13.0" in key
    assert data["classes"]["cpu"][key]["presets"] == data["presets"]
    assert data["classes"]["cpu"][key]["defaults"]["fp32"]["config"] == "default"

    write_preset_files(tmp_path, data)
    table = read_presets_table(tmp_path)
    assert table.schema == PRESETS_SCHEMA and table.num_rows == 1
    got = table.to_pylist()[0]
    assert got["config"] == "default" and json.loads(got["compile"])["mode"] is None
    assert json.loads((tmp_path / "presets.json").read_text())["format"] == 5
    assert read_presets_table(tmp_path / "nothing") is None


def test_a_presets_serving_peak_counts_the_search_its_eager_phase_ran(tmp_path, table_jobs):
    # With cudnn_benchmark, cuDNN's algorithm search runs on the first call, in the job's eager
    # phase, and the compiled phase's peak leaves it out (maskformer bs16 on an H100: 38.6 GB
    # eager, 3.2 GB compiled; a fresh compile_tuned process held 36.0 GiB).
    searched = row(table_jobs["cpu/resnet/bs1/fp32/ro"], ms=7.0, eager_peak_mem_bytes=36 * 2**30)
    plain = row(table_jobs["cpu/mlp/bs1/fp32/tuned"], ms=1.0, eager_peak_mem_bytes=2**30)
    data = derive_presets(rows_to_table([searched, plain]))
    got = {p["model"]: p for p in data["presets"]}
    assert got["resnet"]["peak_mem_bytes"] == 5 * 2**30
    assert got["resnet"]["serving_peak_mem_bytes"] == 36 * 2**30
    assert got["mlp"]["serving_peak_mem_bytes"] == 5 * 2**30  # the compiled phase's, the larger
    write_preset_files(tmp_path, data)
    back = {r["model"]: r for r in read_presets_table(tmp_path).to_pylist()}
    assert back["resnet"]["serving_peak_mem_bytes"] == 36 * 2**30
    assert json.loads((tmp_path / "presets.json").read_text())["presets"][0]["serving_peak_mem_bytes"]
