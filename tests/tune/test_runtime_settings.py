"""Runtime settings (`compiler.runtime`, e.g. cudnn_benchmark) through the whole loop on hand-built
data: validation, job identity, rows, the tuner's space and its confirmation apart, presets, the
per-class "what won" table and knob pruning; and what `compile_tuned` sets in a real process."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from compiler import runtime
from compiler.config import CompileConfig, config_problems
from compiler.job import MeasureSpec
from orchestrator.spec.sweep import SpecError, parse_spec
from orchestrator.tune.cells import Cell
from orchestrator.tune.decide import within_precision
from orchestrator.tune.effects import (
    CellEffect,
    SettingEffect,
    dropped_knobs,
    effects_document,
    preset_settings,
    setting_effects,
    setting_label,
    what_won,
    what_won_markdown,
)
from orchestrator.tune.knobs import combine_helping_knobs
from orchestrator.tune.plan import make_job
from orchestrator.tune.presets import Limits, derive_presets
from orchestrator.tune.space import BASE_MODES, candidates
from store.schema import rows_to_table
from tests.tune.test_tune import MLP, RESNET, STOCK, row, samples

ROOT = Path(__file__).resolve().parents[2]
SPEC = """\
name: rt
models: ["python:workers.toy:mlp"]
batch_sizes: [4]
configs:
  plain: {{}}
  bench: {{runtime: {{cudnn_benchmark: true}}}}
  same: {{runtime: {{cudnn_benchmark: false}}}}
{extra}"""


def test_sweep_files_validate_runtime_settings_with_the_line_and_the_fix():
    spec = parse_spec(SPEC.format(extra=""), "rt.yaml")
    cfg = {c.name: c for c in spec.configs}
    assert cfg["bench"].runtime == {"cudnn_benchmark": True}
    assert cfg["same"].runtime == {}  # torch's default written out is no setting
    with pytest.raises(SpecError) as err:
        parse_spec(
            SPEC.format(
                extra="  typo: {runtime: {cudnn_bench: true}}\n  wrong: {runtime: {cudnn_benchmark: 1}}\n"
            ),
            "rt.yaml",
        )
    text = str(err.value)
    assert "rt.yaml:8:" in text and "did you mean 'cudnn_benchmark'" in text
    assert "rt.yaml:9:" in text and "must be bool, got 1" in text
    assert config_problems(CompileConfig("x", runtime={"cudnn_benchmark": True})) == []


def test_job_ids_change_only_with_a_real_setting(table_jobs):
    job = table_jobs["A100/resnet/bs1/fp32/default"]
    import dataclasses

    same = dataclasses.replace(job, config=dataclasses.replace(job.config, runtime={}))
    bench = dataclasses.replace(
        job, config=dataclasses.replace(job.config, runtime={"cudnn_benchmark": True})
    )
    assert same.job_id == job.job_id  # outputs written before runtime settings existed still resume
    assert bench.job_id != job.job_id


def test_every_row_records_the_settings_it_ran_under(table_jobs):
    import dataclasses

    job = table_jobs["A100/resnet/bs1/fp32/default"]
    plain = row(job)
    assert json.loads(plain["runtime"]) == {"cudnn_benchmark": False, "cudnn_enabled": True}
    assert plain["cudnn_benchmark"] is False
    bench_job = dataclasses.replace(
        job, config=dataclasses.replace(job.config, runtime={"cudnn_benchmark": True})
    )
    assert row(bench_job, "crash", ms=None)["cudnn_benchmark"] is True  # a job that never reported
    # what the job process read back wins over the config (it is what the timings ran under)
    assert row(job, runtime=json.dumps({"cudnn_benchmark": True}))["cudnn_benchmark"] is True


def test_apply_sets_torch_defaults_for_what_a_config_leaves_out():
    before = runtime.current()
    try:
        torch.backends.cudnn.benchmark = True  # left behind by someone else
        CompileConfig("stock").apply_runtime()
        assert torch.backends.cudnn.benchmark is False
        CompileConfig("b", runtime={"cudnn_benchmark": True}).apply_runtime()
        assert runtime.current() == {"cudnn_benchmark": True, "cudnn_enabled": True}
        CompileConfig("off", runtime={"cudnn_enabled": False}).apply_runtime()
        assert torch.backends.cudnn.enabled is False and torch.backends.cudnn.benchmark is False
        CompileConfig("stock").apply_runtime()
        assert torch.backends.cudnn.enabled is True  # torch's default again
    finally:
        runtime.restore(before)


def test_cudnn_off_is_a_setting_of_its_own_a_job_id_and_a_rows_runtime_tell_apart(table_jobs):
    """`cudnn_enabled: false` (every convolution on PyTorch's own kernels, no cuDNN plan built
    per new shape) is validated, changes the job id and is what the row records."""
    import dataclasses

    job = table_jobs["A100/resnet/bs1/fp32/default"]
    off = dataclasses.replace(job, config=dataclasses.replace(job.config, runtime={"cudnn_enabled": False}))
    assert off.job_id != job.job_id
    assert json.loads(row(off)["runtime"]) == {"cudnn_benchmark": False, "cudnn_enabled": False}
    assert runtime.explicit({"cudnn_enabled": True}) == {}  # torch's default: nothing to write down
    assert runtime.setting_problems({"cudnn_enabled": "no"}) == [
        ("runtime.cudnn_enabled", "runtime setting 'cudnn_enabled' must be bool, got 'no'")
    ]


def test_the_space_turns_cudnn_benchmark_on_gpu_only_and_adds_the_autotuning_modes():
    gpu = {c.config.name: c for c in candidates(STOCK, RESNET, "cuda", "fp32", bases=BASE_MODES)}
    bench = gpu["ro+cudnn_benchmark"].config
    assert (
        bench.mode == "reduce-overhead" and bench.options == {} and bench.runtime == {"cudnn_benchmark": True}
    )
    assert {"max-autotune", "max-autotune-no-cudagraphs"} <= set(gpu) and not gpu["max-autotune"].stock
    assert "max-autotune+conv_aten" in gpu and "max-autotune+cudnn_benchmark" in gpu
    assert "default+conv_aten" not in gpu  # backends only where max-autotune is on
    assert "max-autotune-no-cudagraphs+cudagraphs" not in gpu  # that is max-autotune again
    cpu = {c.config.name for c in candidates(STOCK, RESNET, "cpu", "fp32")}
    assert not any("cudnn" in n or "max-autotune" in n for n in cpu)


def cell_and_jobs():
    cell = Cell("A100", "cuda", RESNET, 1, "fp32")
    cands = {c.config.name: c for c in candidates(STOCK, RESNET, "cuda", "fp32")}
    measure = MeasureSpec(repeats=3)
    jobs = {n: make_job(_spec(), cell, c, measure, None, stack={"torch": "x"}) for n, c in cands.items()}
    return cell, cands, jobs


def _spec():
    return parse_spec(SPEC.format(extra=""), "rt.yaml")


def test_knobs_that_each_helped_are_also_tried_together():
    cell, cands, jobs = cell_and_jobs()
    results = [
        (cands["ro"], row(jobs["ro"], ms=8.0)),
        (cands["default"], row(jobs["default"], ms=9.0)),
        (cands["ro+cudnn_benchmark"], row(jobs["ro+cudnn_benchmark"], ms=6.0)),
        (cands["ro+freezing"], row(jobs["ro+freezing"], ms=7.0)),
        (cands["ro+channels_last"], row(jobs["ro+channels_last"], ms=9.5)),  # slower: left out
    ]
    combined = combine_helping_knobs(cands["ro"], results, Limits())
    assert (
        combined.config.name == "ro+freezing+cudnn_benchmark"
        or combined.config.name == "ro+cudnn_benchmark+freezing"
    )
    assert combined.config.freezing and combined.config.runtime == {"cudnn_benchmark": True}
    assert combined.config.options == {"triton.cudagraphs": True} and not combined.stock
    assert combined.turned == ("freezing", "cudnn_benchmark") and combined.base_name == "ro"
    assert (
        combine_helping_knobs(cands["ro"], results[:3], Limits()) is None
    )  # one knob helped: nothing to combine
    assert combine_helping_knobs(cands["default"], results, Limits()) is None  # no knob measured on it


def test_a_runtime_setting_is_confirmed_in_processes_of_its_own():
    cell, cands, jobs = cell_and_jobs()
    cand, stock = cands["ro+cudnn_benchmark"], cands["ro"]
    rung1 = [(stock, row(jobs["ro"], ms=8.0)), (cand, row(jobs["ro+cudnn_benchmark"], ms=6.0))]

    def own(job, ms, seed):
        return row(job, ms=ms, compiled_samples_ms=samples(ms, seed=seed), samples_per_repeat=[30] * 3)

    entry, why = within_precision(
        cell,
        rung1,
        (cand, stock, own(jobs["ro+cudnn_benchmark"], 6.0, 2), own(jobs["ro"], 8.0, 1)),
        Limits(),
    )
    assert entry["source"] == "tuned" and "apart" in why and entry["speedup_vs_stock_ci_low"] > 1
    assert entry["compile"]["runtime"] == {"cudnn_benchmark": True}
    assert entry["stock_ms"] == pytest.approx(8.0, rel=0.02)
    entry, why = within_precision(
        cell,
        rung1,
        (cand, stock, own(jobs["ro+cudnn_benchmark"], 8.0, 2), own(jobs["ro"], 8.0, 1)),
        Limits(),
    )
    assert entry["source"] == "stock" and entry["compile"]["runtime"] == {}
    entry, why = within_precision(
        cell,
        rung1,
        (cand, stock, own(jobs["ro+cudnn_benchmark"], 6.0, 2), row(jobs["ro"], "crash", ms=None)),
        Limits(),
    )
    assert entry["source"] == "stock" and "failed" in why


def effect_rows():
    """Two models on A100: cudnn_benchmark helps resnet and hurts vit; freezing changes nothing."""
    out = []
    for model, spec_model in (("resnet", RESNET), ("vit", MLP)):
        cell = Cell("A100", "cuda", spec_model, 1, "fp32")
        cands = {c.config.name: c for c in candidates(STOCK, spec_model, "cuda", "fp32")}
        figures = {"ro": 8.0, "ro+cudnn_benchmark": 6.0 if model == "resnet" else 9.0, "ro+freezing": 8.0}
        for i, (name, ms) in enumerate(figures.items()):
            job = make_job(_spec(), cell, cands[name], MeasureSpec(), None, stack={"torch": "x"})
            r = row(job, ms=ms, compiled_samples_ms=samples(ms, seed=i), samples_per_repeat=[90])
            r["model"] = model
            out.append(r)
    return out


def test_what_won_says_which_setting_helped_which_model_and_pruning_follows():
    rows = effect_rows()
    effects = setting_effects(rows)
    bench, freezing = effects["A100"]["cudnn_benchmark"], effects["A100"]["freezing"]
    assert (
        bench.models("helps") == ["resnet"] and bench.models("hurts") == ["vit"] and bench.verdict == "keep"
    )
    assert freezing.models("helps") == [] and freezing.verdict == "drop"
    doc = effects_document(effects)
    assert dropped_knobs(doc) == {"A100": {"freezing": doc["A100"]["freezing"]["why"]}}
    assert "no gain on any cell" in doc["A100"]["freezing"]["why"]
    assert "slower on vit" in doc["A100"]["cudnn_benchmark"]["why"]

    data = derive_presets(rows_to_table(rows), Limits())
    won = {r["setting"]: r for r in data["what_won"]}
    assert won["cudnn_benchmark"]["presets"] == 1 and won["cudnn_benchmark"]["helps_models"] == ["resnet"]
    assert won["mode reduce-overhead"]["presets"] == 2
    assert preset_settings(
        {"compile": {"options": {"triton.cudagraphs": True}, "runtime": {"cudnn_benchmark": True}}}
    ) == [
        "mode reduce-overhead",
        "cudnn_benchmark",
    ]
    assert what_won([], effects)[0]["presets"] == 0


def test_compile_tuned_sets_the_presets_runtime_settings_in_a_fresh_process(tmp_path):
    """A real export directory whose preset sets cudnn_benchmark: compile_tuned in a fresh process
    turns the setting on before the first call and says so (on CPU cuDNN is not called, but what
    is applied is the same)."""
    from tests.tune.test_export_apply import compile_tuned_in_fresh_process, edit_presets, write_export

    def bench(presets):
        presets["presets"][0]["compile"]["runtime"] = {"cudnn_benchmark": True}

    dest = edit_presets(write_export(tmp_path / "export"), bench)
    got = compile_tuned_in_fresh_process(
        dest,
        "use_package=False",
        "{'flag': torch.backends.cudnn.benchmark, 'runtime': applied.runtime, 'match': applied.match, 'warned': warned}",
    )
    assert (
        got["match"] == "exact"
        and got["flag"] is True
        and got["runtime"] == {"cudnn_benchmark": True, "cudnn_enabled": True}
    )
    assert any("cudnn_benchmark: False -> True" in w for w in got["warned"])


def test_tune_refuses_an_unknown_base_and_a_missing_prune_source_before_any_work(tmp_path, capsys):
    from orchestrator.cli import main

    sweep = ROOT / "sweeps" / "tune-smoke.yaml"
    assert main(["tune", str(sweep), "--out", str(tmp_path / "a"), "--bases", "max-autotun"]) == 2
    assert "--bases: unknown mode 'max-autotun'" in capsys.readouterr().err
    code = main(["tune", str(sweep), "--out", str(tmp_path / "b"), "--prune-from", str(tmp_path / "none")])
    err = capsys.readouterr().err
    assert code == 2 and "--prune-from" in err and "does not exist" in err, err
    assert not (tmp_path / "b" / "tune.json").exists()


def test_a_knob_too_noisy_to_judge_is_kept_and_the_verdicts_use_the_one_threshold():
    from compiler import statistics as cstats

    th = cstats.load_thresholds()
    tight_same = cstats.ratio_interval([samples(8.0, seed=1)], [samples(8.0, seed=2)], paired=False)
    noisy = cstats.ratio_interval(
        [samples(8.0, spread=0.3, seed=1)], [samples(8.0, spread=0.3, seed=2)], paired=False
    )
    assert cstats.gain_verdict(tight_same, th) == "no gain" and tight_same.high < 1 + th.latency_change
    assert cstats.gain_verdict(noisy, th) == "unclear"
    rows = effect_rows()
    for r in rows:  # the same figures, far noisier: nothing can be ruled out any more
        if r["config"] == "ro+freezing":
            r["compiled_samples_ms"] = samples(8.0, spread=0.3, seed=7)
    freezing = setting_effects(rows)["A100"]["freezing"]
    assert {c.verdict for c in freezing.cells} == {"unclear"} and freezing.verdict == "keep"
    assert "too noisy to tell" in freezing.why


def resnet_rows(figures: dict[str, float]) -> list[dict]:
    """One A100 resnet cell's rows: candidate name -> its compiled median (ms), with samples."""
    cell = Cell("A100", "cuda", RESNET, 1, "fp32")
    cands = {c.config.name: c for c in candidates(STOCK, RESNET, "cuda", "fp32")}
    return [
        row(
            make_job(_spec(), cell, cands[name], MeasureSpec(), None, stack={"torch": "x"}),
            ms=ms,
            compiled_samples_ms=samples(ms, seed=i),
            samples_per_repeat=[90],
        )
        for i, (name, ms) in enumerate(figures.items())
    ]


def test_a_mode_is_named_alike_where_it_is_measured_and_where_a_preset_uses_it():
    rows = resnet_rows({"default": 9.0, "ro": 6.0})
    data = derive_presets(rows_to_table(rows), Limits())
    (won,) = data["what_won"]  # reduce-overhead's option is also the cudagraphs knob's: one line
    assert (
        won["setting"] == "mode reduce-overhead" and won["presets"] == 1 and won["helps_models"] == ["resnet"]
    )


def test_only_a_knob_is_said_to_be_dropped_from_the_next_search():
    """--prune-from leaves out knobs only: a mode (here the options of max-autotune-no-cudagraphs
    over reduce-overhead, as an H100 tune of ViT measured them) that hurt everywhere is not said to
    be dropped."""
    hurt = CellEffect("A100/vit/bs1/fp32", "vit", "reduce-overhead", "max-autotune", 0.9, 0.87, 0.95, "hurts")
    mode = SettingEffect("A100", "mode max-autotune-no-cudagraphs", [hurt])
    knob = SettingEffect("A100", "freezing", [hurt])
    assert mode.verdict == knob.verdict == "drop"
    assert mode.why.endswith("slower on vit; no gain on any cell")
    assert knob.why.endswith("no gain on any cell: dropped from this class's next search")
    doc = effects_document({"A100": {mode.setting: mode, knob.setting: knob}})
    assert dropped_knobs(doc) == {"A100": {"freezing": knob.why}}


def test_knobs_that_turn_an_inductor_default_off_have_an_effect_of_their_own():
    """no_epilogue_fusion and no_shape_padding set an option to False: their pairs are labelled
    (so "what won" shows them and --prune-from can drop them), and only in the knob's direction."""
    assert setting_label({}, {"options.epilogue_fusion": False}, None) == "no_epilogue_fusion"
    assert setting_label({}, {"options.shape_padding": False}, None) == "no_shape_padding"
    no_trees = {"options.triton.cudagraphs": True, "options.triton.cudagraph_trees": False}
    assert setting_label({}, no_trees, None) == "cudagraphs_no_trees"
    on = {"options.epilogue_fusion": True}
    assert setting_label(on, {"options.epilogue_fusion": False}, None) is None  # the base set it
    assert setting_label({"options.epilogue_fusion": False}, {}, None) is None  # the other way round
    assert setting_label({"freezing": True}, {"freezing": False}, None) is None
    assert setting_label({}, {"options.triton.cudagraphs": True}, "reduce-overhead") == "mode reduce-overhead"
    assert preset_settings({"compile": {"options": {"epilogue_fusion": False}}}) == ["no_epilogue_fusion"]


def test_what_won_counts_comparisons_and_the_cells_they_are_in_apart():
    """A tune's cell compares a knob on each base (and again in rung 1): two comparisons of
    freezing in one cell are "2 comparisons in 1 cell", not "2 cells"."""
    rows = resnet_rows({"default": 9.0, "default+freezing": 8.0, "ro": 6.0, "ro+freezing": 5.0})
    effects = setting_effects(rows)
    freezing = effects["A100"]["freezing"]
    assert len(freezing.cells) == 2 and freezing.measured_in == "2 comparisons in 1 cell"
    assert freezing.why.startswith("2 comparisons in 1 cell, geomean gain 1.1")
    won = {r["setting"]: r for r in what_won([], effects)}
    assert (won["freezing"]["comparisons"], won["freezing"]["cells_measured"]) == (2, 1)
    table = what_won_markdown(list(won.values()))
    assert "| comparisons faster / slower |" in table
    assert "x over 2 comparisons in 1 cell | 2 / 0 | resnet |" in table
