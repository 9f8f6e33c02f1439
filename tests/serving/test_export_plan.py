"""An export's preset for a model with a serving profile: the bundle job decides the plan (the
padding check on the real model) and compiles every graph of it before writing the bundle, and a
fresh serving process prepares the plan from that bundle and serves every size of the range
without compiling. Real job processes, real Inductor compiles on the CPU."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from compiler.config import CompileConfig
from compiler.hardware import hardware_class, software_stack
from compiler.job import Job, MeasureSpec, ModelSpec
from compiler.serving import EXPORT_FORMAT, SERVING_FILE
from compiler.serving.plan_packages import STEPS
from orchestrator.tune.sweep_models import serving_line, serving_profiles
from store.runlog import read_runs, start_run
from tests.tune.test_export_apply import ROOT, edit_presets, rehash, write_export
from workers.runner import build_bundle
from workers.toy import mlp as toy_mlp

pytestmark = pytest.mark.integration

PROFILE = {"batch": {"min": 1, "max": 8}}
SERVE = """
import json, sys, warnings, torch
from compiler.serving import compile_tuned
from compiler.serving.served import graph_count
from workers import toy
model, inputs = getattr(toy, sys.argv[2])(3)
with warnings.catch_warnings():
    warnings.simplefilter("error", UserWarning)  # nothing falls back
    served, applied = compile_tuned(model, inputs, sys.argv[1], model_name=sys.argv[2])
before, worst = graph_count(), 0.0
for n in range(1, 9):
    x = torch.randn(n, inputs["x"].shape[1])
    with torch.no_grad():
        worst = max(worst, float((served(x=x) - model(x=x)).abs().max()))
print(json.dumps({"applied": applied.to_dict(), "compiles": graph_count() - before, "worst": worst}))
"""


def _serve(dest, factory: str) -> dict:
    """`compile_tuned` on the export `dest` in a fresh process (`SERVE`): what it applied, the
    Dynamo graphs compiled after it returned, the largest difference from eager over sizes 1..8."""
    proc = subprocess.run(
        [sys.executable, "-c", SERVE, str(dest), factory],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _packaged_bundle(tmp_path, factory: str, profile: dict, stock: dict | None = None) -> dict:
    """The bundle job of `factory` with packages and the serving `profile`, into tmp_path/export."""
    dest = tmp_path / "export"
    (dest / "bundles").mkdir(parents=True, exist_ok=True)
    (dest / "packages").mkdir(exist_ok=True)
    return build_bundle(
        _job(factory),
        dest / "bundles" / f"{factory}.bin",
        1,
        str(tmp_path),
        dest / "packages" / f"{factory}.pt2",
        profile,
        stock,
    )


def _job(factory: str, overrides: dict | None = None) -> Job:
    return Job(
        sweep="export",
        hardware="cpu",
        device="cpu",
        model=ModelSpec(id=f"python:workers.toy:{factory}", name=factory, overrides=overrides or {}),
        batch_size=4,
        dtype="fp32",
        config=CompileConfig(name="default"),
        measure=MeasureSpec(),
        timeout_s=300,
    )


def test_the_bundle_job_prepares_the_plan_and_a_fresh_process_serves_it_from_the_bundle(tmp_path):
    dest = tmp_path / "export"
    (dest / "bundles").mkdir(parents=True)
    entries = []
    chosen = {}
    for factory, allowed in (("mlp", {"buckets", "dynamic"}), ("batch_centered", {"dynamic"})):
        result = build_bundle(
            _job(factory), dest / "bundles" / f"{factory}.bin", 1, str(tmp_path), serving=PROFILE
        )
        assert result["status"] == "ok", result.get("error")
        s = result["serving"]
        # the plans the padding check allows, each prepared and timed at every size; the faster is taken
        assert set(s["plans"]) == allowed and s["padding"]["ok"] == ("buckets" in allowed), s
        assert s["plan"] == min(s["plans"], key=lambda p: s["plans"][p]["weighted_ms"]), s
        assert all(sorted(map(int, p["ms"])) == list(range(1, 9)) for p in s["plans"].values()), s
        graphs = {"buckets": 6, "dynamic": 2}  # a graph per bucket; the dynamic one and batch 1's
        assert {p: v["graphs"] for p, v in s["plans"].items()} == {p: graphs[p] for p in allowed}, s
        chosen[factory] = s["plan"]
        entries.append(
            {
                "model": factory,
                "batch_size": 4,
                "dtype": "fp32",
                "config": "default",
                "compile": {
                    "backend": "inductor",
                    "mode": None,
                    "fullgraph": False,
                    "dynamic": None,
                    "options": {},
                },
                "bundle": f"bundles/{factory}.bin",
                "package": None,
                "serving": s,
            }
        )
    (dest / SERVING_FILE).write_text(json.dumps({"format": 1, "presets": entries, "defaults": {}}))
    manifest = {"format": EXPORT_FORMAT, "hardware": hardware_class(), "stack": software_stack(), "files": {}}
    rehash(dest, manifest)

    for factory, plan in chosen.items():
        got = _serve(dest, factory)
        applied = got["applied"]
        assert applied["match"] == "serving" and applied["bundle"] == "loaded", applied
        assert applied["serving"]["plan"] == plan and applied["serving"]["plan_from"] == "export"
        assert got["compiles"] == 0 and got["worst"] < 1e-4, got
        # the bundle held the graphs: the fresh process's compiles of them were cache hits
        assert applied["cache_artifacts"].get("inductor", 0) >= (6 if plan == "buckets" else 2), applied


def test_a_plan_the_model_cannot_take_is_recorded_with_its_error_and_the_other_serves(tmp_path):
    # batch_branching's graph is guarded on its batch size (as DETR's is): the dynamic plan's
    # compile fails; that is the plan's error, not the preset's
    result = build_bundle(_job("batch_branching"), tmp_path / "b.bin", 1, str(tmp_path), serving=PROFILE)
    assert result["status"] == "ok", result.get("error")
    s = result["serving"]
    assert s["plan"] == "buckets" and s["padding"]["ok"], s
    assert s["plans"]["dynamic"]["error"].startswith("ConstraintViolationError"), s["plans"]["dynamic"]
    assert sorted(map(int, s["plans"]["buckets"]["ms"])) == list(range(1, 9)), s
    line = serving_line(s)
    assert "on buckets" in line and "dynamic failed: ConstraintViolationError" in line, line


def test_a_model_that_can_take_neither_plan_fails_its_bundle_job_saying_why(tmp_path):
    # rows that interact rule the buckets plan out; a batch-guarded graph, the dynamic one
    result = build_bundle(
        _job("batch_branching", {"centered": True}), tmp_path / "b.bin", 1, str(tmp_path), serving=PROFILE
    )
    assert result["status"] == "compile_error", result
    assert "no serving plan prepared: dynamic: ConstraintViolationError" in result["error"], result["error"]


SERVING_SWEEP = (
    "name: s\nserving: {batch: {min: 1, max: 32}}\nmodels:\n"
    "  - {id: python:workers.toy:mlp, name: mlp, serving: {batch: {min: 2, max: 8}}}\n"
    "  - {id: python:workers.toy:linear, name: lin}\n"
    "batch_sizes: [4]\nconfigs: {default: {}}\n"
)


def test_the_export_reads_each_models_profile_from_the_run_log(tmp_path):
    from orchestrator.spec.sweep import parse_spec

    spec = parse_spec(SERVING_SWEEP)
    assert {k: v.describe() for k, v in spec.serving.items()} == {
        "mlp": "batch 2..8, traffic uniform",
        "lin": "batch 1..32, traffic uniform",
    }
    start_run(tmp_path, "r1", spec, [], {}, 1, 0)
    assert serving_profiles(read_runs(tmp_path)) == spec.serving


def test_the_export_line_says_which_plan_a_preset_serves_on_and_why(monkeypatch):
    from compiler.statistics.thresholds import THRESHOLDS_ENV
    from orchestrator.tune.sweep_models import serving_line

    monkeypatch.delenv(THRESHOLDS_ENV)  # the project's own doubt of a busy node (tests/conftest.py)

    plans = {"buckets": {"weighted_ms": 0.2}, "dynamic": {"weighted_ms": 0.25}}
    buckets = {
        "profile": PROFILE,
        "plan": "buckets",
        "buckets": [1, 2, 4, 8],
        "padding": {"ok": True},
        "plans": plans,
    }
    assert serving_line(buckets) == (
        ", serves batch 1..8, traffic uniform on buckets [1, 2, 4, 8] (weighted buckets 0.200 ms, dynamic 0.250 ms)"
    )
    dynamic = {
        **buckets,
        "plan": "dynamic",
        "buckets": [],
        "padding": {"ok": False},
        "plans": {"dynamic": plans["dynamic"]},
    }
    assert serving_line(dynamic).endswith(
        "on dynamic (padding refused: rows interact) (weighted dynamic 0.250 ms)"
    )
    assert serving_line(None) == ""
    packed = {**buckets, "packages": {"1": {"compile_s": 10.0}, "2": {"compile_s": 12.4}}}
    assert serving_line(packed).endswith(", a package per bucket (22 s)")
    build = {"buckets": 16, "wall_s": 172.4, "processes": 8, "gpus": 1}
    assert serving_line({**packed, "package_build": build}).endswith(
        ", a package per bucket (16 built in 172 s by 8 processes on 1 GPU)"
    )
    stock = {"mode": "reduce-overhead", "dtype": "fp32", "weighted_ms": 0.5, "stall_s": 31.2}
    assert serving_line({**buckets, "stock": stock, "vs_stock": 2.5}).endswith(
        "; 2.50x the stock user (torch.compile reduce-overhead, fp32: 0.500 ms, stalls 31.2 s apart)"
    )
    assert serving_line({**buckets, "stock": stock, "vs_stock": 0.9}).endswith(": LOSES to stock")
    assert serving_line({**buckets, "package_error": "bucket 4: boom"}).endswith(
        ", no bucket packages (bucket 4: boom)"
    )
    budget = {**PROFILE, "prepare_budget_s": 10}
    cold = {**packed, "profile": budget, "plans": {"buckets": {"weighted_ms": 0.2, "cold_prepare_s": 8.04}}}
    assert serving_line(cold).endswith(", a package per bucket (22 s), prepared cold in 8.0 s (budget 10 s)")
    cold["plans"]["buckets"]["cold_prepare_s"] = 12.5
    assert serving_line(cold).endswith("prepared cold in 12.5 s (budget 10 s): OVER BUDGET")
    cold["plans"]["buckets"].update(cold_prepare_s=9.1, cold_prepare_tries=2)
    assert serving_line(cold).endswith("prepared cold in 9.1 s (budget 10 s, the second set tried)")
    cold["plans"]["buckets"].update(cold_prepare_runs=[8.2, 9.1, 8.7])
    assert serving_line(cold).endswith(
        "prepared cold in 9.1 s (the slowest of 3 fresh processes; budget 10 s, the second set tried)"
    )
    cold["plans"]["buckets"].update(cold_prepare_bound_s=9.63)  # what their spread predicts of a new one
    assert serving_line(cold).endswith(
        "prepared cold in 9.1 s (the slowest of 3 fresh processes, a new one predicted within 9.6 s; "
        "budget 10 s, the second set tried)"
    )
    cold["plans"]["buckets"].update(cold_prepare_bound_s=10.8)  # each fit; a new one is predicted not to
    assert serving_line(cold).endswith(
        "predicted within 10.8 s; budget 10 s, the second set tried): OVER BUDGET"
    )
    cold["plans"]["buckets"].update(cold_prepare_bound_s=None)
    cold["plans"]["buckets"].update(cold_prepare_other_shares=[0.02, 0.1, None])  # a quiet node
    assert serving_line(cold).endswith("budget 10 s, the second set tried)")
    cold["plans"]["buckets"].update(cold_prepare_other_shares=[0.02, 0.41, None])  # a busy one
    assert serving_line(cold).endswith(
        "the second set tried) (doubted: other processes took 41% of its cores while it prepared; "
        "export again on a quiet node)"
    )
    cold["plans"]["buckets"] = {"weighted_ms": 0.2, "cold_prepare_error": "exit 1"}
    assert serving_line(cold).endswith(", prepare budget not applied (no cold prepare: exit 1)")
    assert serving_line({**buckets, "profile": budget}).endswith("this plan has none)")


def test_the_export_says_what_one_config_for_the_range_misses_at_the_other_swept_sizes():
    from orchestrator.tune.sweep_models import config_miss, serving_line

    def row(bs, config, ms, **kw):
        return {
            "model": "m",
            "dtype": "bf16",
            "batch_size": bs,
            "config": config,
            "compiled_ms": ms,
            "status": "ok",
            **kw,
        }

    rows = [
        *(row(1, "ro", ms) for ms in (0.50, 0.52, 0.51)),
        *(row(1, "default", ms) for ms in (0.60, 0.61)),
        *(row(4, "ro", ms) for ms in (0.70, 0.72)),
        *(row(4, "max-autotune", ms) for ms in (0.60, 0.64)),
        row(16, "ro", 1.2),
        row(16, "default", 9.0, status="timeout"),  # not ok: not a candidate
        row(16, "default", 1.1, dtype="fp32"),  # another dtype
        row(32, "default", 2.0),  # the preset's config never ran there: nothing to say
    ]
    miss = config_miss(rows, {"model": "m", "dtype": "bf16", "config": "ro"})
    assert sorted(miss) == ["1", "16", "4"], miss
    assert miss["1"]["best"] == "ro" and miss["1"]["ratio"] == 1.0
    assert miss["4"]["best"] == "max-autotune" and miss["4"]["ratio"] == pytest.approx(0.71 / 0.62)
    assert miss["4"]["ratio_low"] is None and not miss["4"]["beyond_noise"]  # no samples: no interval
    assert miss["16"] == {
        "best": "ro",
        "best_ms": 1.2,
        "preset_ms": 1.2,
        "ratio": 1.0,
        "ratio_low": 1.0,
        "ratio_high": 1.0,
        "beyond_noise": False,
    }
    plans = {"buckets": {"weighted_ms": 1.0}}
    line = serving_line(
        {
            "profile": {"batch": {"min": 1, "max": 8}},
            "plan": "buckets",
            "buckets": [8],
            "padding": {"ok": True},
            "plans": plans,
            "config_miss": miss,
        }
    )
    assert line.endswith(
        "its config at the swept sizes: bs1 1.00x the fastest (ro), bs4 1.15x the fastest "
        "(max-autotune), no samples to judge it, bs16 1.00x the fastest (ro)"
    ), line


def test_what_one_config_misses_at_a_size_carries_its_interval_and_says_whether_it_is_noise():
    """Rows with their processes' samples: a config 20% slower in three tight processes is beyond
    noise; 10% slower in two processes that spread 30% apart is within it."""
    import random

    from orchestrator.tune.sweep_models import config_miss, serving_line

    rng = random.Random(0)

    def row(bs, config, centres):
        samples = [c * (1 + rng.uniform(-0.01, 0.01)) for c in centres for _ in range(20)]
        return {
            "model": "m",
            "dtype": "bf16",
            "batch_size": bs,
            "config": config,
            "compiled_ms": sorted(samples)[len(samples) // 2],
            "compiled_samples_ms": samples,
            "samples_per_repeat": [20] * len(centres),
            "status": "ok",
        }

    rows = [
        row(1, "ro+freezing", [1.20, 1.21, 1.19]),
        row(1, "ro", [1.00, 1.01, 0.99]),
        row(32, "ro+freezing", [2.2, 2.9]),
        row(32, "ro", [2.0, 2.6]),
        row(16, "ro+freezing", [1.5, 1.5]),
        row(16, "ro", [1.7, 1.7]),
    ]
    miss = config_miss(rows, {"model": "m", "dtype": "bf16", "config": "ro+freezing"})
    assert miss["1"]["best"] == "ro" and miss["1"]["beyond_noise"], miss["1"]
    assert 1.0 < miss["1"]["ratio_low"] <= miss["1"]["ratio"] <= miss["1"]["ratio_high"], miss["1"]
    assert miss["32"]["best"] == "ro" and not miss["32"]["beyond_noise"], miss["32"]
    assert miss["32"]["ratio_low"] < 1.0 < miss["32"]["ratio_high"], miss["32"]
    assert miss["16"]["ratio"] == 1.0 and not miss["16"]["beyond_noise"]
    line = serving_line(
        {
            "profile": {"batch": {"min": 1, "max": 32}},
            "plan": "buckets",
            "buckets": [32],
            "padding": {"ok": True},
            "plans": {"buckets": {"weighted_ms": 1.0}},
            "config_miss": miss,
        }
    )
    m1, m32 = miss["1"], miss["32"]
    assert (
        f"bs1 {m1['ratio']:.2f}x the fastest (ro) [{m1['ratio_low']:.2f}, {m1['ratio_high']:.2f}], bs16 1.00x"
        in line
    ), line
    assert line.endswith(
        f"bs32 {m32['ratio']:.2f}x the fastest (ro) [{m32['ratio_low']:.2f}, {m32['ratio_high']:.2f}], within noise"
    ), line


def test_rows_record_each_models_profile_and_job_ids_do_not_depend_on_it():
    from orchestrator.spec.matrix import expand
    from orchestrator.spec.sweep import parse_spec
    from store.rows import failure_row

    jobs = expand(parse_spec(SERVING_SWEEP), {"cpu": "cpu"}, stack={})
    rows = {j.model.name: failure_row(j, "crash", "x", run_id="r1") for j in jobs}
    assert json.loads(rows["mlp"]["serving_profile"])["batch"] == {"min": 2, "max": 8}
    assert json.loads(rows["lin"]["serving_profile"])["batch"] == {"min": 1, "max": 32}
    plain = "\n".join(line for line in SERVING_SWEEP.splitlines() if not line.startswith("serving"))
    plain = plain.replace(", serving: {batch: {min: 2, max: 8}}", "")
    unlabelled = expand(parse_spec(plain + "\n"), {"cpu": "cpu"}, stack={})
    assert [j.job_id for j in unlabelled] == [j.job_id for j in jobs]  # a label, not identity: --resume holds
    assert failure_row(unlabelled[0], "crash", "x", run_id="r1")["serving_profile"] is None


def test_a_buckets_plan_with_a_package_per_bucket_is_served_without_dynamo(tmp_path):
    """Each bucket's AOTInductor package loaded with the caller's weights and checked against
    eager at load: the plan is prepared without tracing or compiling anything (0 Dynamo graphs),
    and every size of the range served from the packages."""
    from compiler import aoti
    from compiler.serving.packaged import PackagedModel

    packages = {}
    for bucket in (2, 4, 8):
        model, inputs = toy_mlp(bucket)
        info = aoti.build_package(model, inputs, CompileConfig(name="default"), tmp_path / f"p{bucket}.pt2")
        packages[str(bucket)] = {
            "file": f"packages/mlp-b{bucket}.pt2",
            "inputs": info["package_inputs"],
            "cudagraphs": False,
        }
    dest = write_export(tmp_path / "export", package=(tmp_path / "p4.pt2").read_bytes())
    for bucket in (2, 4, 8):
        (dest / "packages" / f"mlp-b{bucket}.pt2").write_bytes((tmp_path / f"p{bucket}.pt2").read_bytes())
    plan = {
        "profile": PROFILE,
        "plan": "buckets",
        "buckets": [2, 4, 8],
        "padding": {"ok": True},
        "packages": packages,
    }
    rehash(edit_presets(dest, lambda p: p["presets"][0].update(serving=plan)))
    got = _serve(dest, "mlp")
    applied = got["applied"]
    assert applied["package"] == "loaded" and applied["serving"]["plan_from"] == "export", applied
    assert applied["serving"]["prepare_graphs"] == 0 and applied["bundle"] == "none", (
        applied
    )  # no Dynamo at all
    assert got["compiles"] == 0 and got["worst"] < 1e-4, got
    assert set(applied["serving"]["prepare_steps"]) == set(STEPS)
    per_bucket = applied["serving"]["bucket_prepare_s"]
    assert set(per_bucket) == {"2", "4", "8"} and all(s > 0 for s in per_bucket.values()), per_bucket
    assert sum(per_bucket.values()) <= applied["serving"]["prepare_s"], applied["serving"]

    # the buckets' packages run on the caller's weights, not on a copy each
    import torch

    model, inputs = toy_mlp(2)
    loaded = [
        PackagedModel.load(tmp_path / f"p{b}.pt2", model, packages[str(b)]["inputs"], False, lambda: model)
        for b in (2, 4)
    ]
    bias = model.layers[4].bias
    assert all(p.constants["layers.4.bias"].data_ptr() == bias.data_ptr() for p in loaded)
    x4 = {"x": torch.randn(4, inputs["x"].shape[1])}
    with torch.no_grad():
        before = [loaded[0](**inputs), loaded[1](**x4)]
        bias.add_(1.0)
        after = [loaded[0](**inputs), loaded[1](**x4)]
    assert all(torch.allclose(a - b, torch.ones_like(a)) for a, b in zip(after, before, strict=True))


@pytest.mark.slow  # a tier of its own, after the default one (docs/testing.md)
def test_the_bundle_job_times_the_buckets_plan_on_packages_it_builds_in_processes_of_their_own(tmp_path):
    """With packages, the buckets plan is timed as it will be served: a package per bucket of the
    finer ladder, each built by a `workers.bench --bucket-package` process, loaded and checked in
    the bundle job; the chosen buckets' packages stay, the preset's own is its batch's bucket.
    Under a prepare budget, the packages are prepared cold in a fresh process, each bucket's
    seconds weighed, and the chosen set prepared cold again (in up to three fresh processes; one
    where it takes longer than the budget). A model torch.export cannot
    capture gets `package_error` and the plan compiled instead."""
    from orchestrator.tune.sweep_models import serving_line

    dest = tmp_path / "export"
    # two buckets: 3 and 4 (the preset's batch); a budget no set fits: the largest bucket alone
    profile = {"batch": {"min": 3, "max": 4}, "prepare_budget_s": 0.001}
    got = {}
    for factory in ("mlp", "checked"):
        stock = {"mode": "default", "dtype": "fp32"} if factory == "mlp" else None
        result = _packaged_bundle(tmp_path, factory, profile, stock)
        assert result["status"] == "ok", result.get("error")
        got[factory] = result
    s = got["mlp"]["serving"]
    assert s["plans"]["buckets"]["from"] == "packages" and "package_error" not in s, s
    assert s["package_build"]["buckets"] == 2 and s["package_build"]["processes"] >= 1, s
    assert sorted(map(int, s["plans"]["buckets"]["ladder_ms"])) == [3, 4], s
    cold = s["plans"]["buckets"]
    assert cold["buckets"] == [4] and sorted(map(int, cold["bucket_prepare_s"])) == [3, 4], cold
    assert all(v > 0 for v in cold["bucket_prepare_s"].values()) and cold["prepare_fixed_s"] >= 0, cold
    assert cold["cold_prepare_s"] > 0 and set(cold["cold_prepare_steps"]) == set(STEPS), cold
    assert cold["cold_prepare_tries"] == 1, cold  # over budget, but no smaller set than [4] to try
    # it ran as a serving process a user starts: on every core this test may use, not the job's
    import os

    from compiler.env import parse_cpus

    ran = cold["cold_prepare_process"]
    assert parse_cpus(ran["cpus"]) >= os.sched_getaffinity(0) and ran["threads"] >= 1, ran
    # with a fresh serving node's caches, its own: Inductor's and the CUDA driver's JIT cache
    assert ran["inductor_cache"].endswith("/inductor") and "serving-prepare-" in ran["inductor_cache"], ran
    assert ran["cuda_jit_cache"].endswith("/cuda-jit") and "serving-prepare-" in ran["cuda_jit_cache"], ran
    assert cold["cold_prepare_runs"] == [cold["cold_prepare_s"]], cold  # over the budget: one process
    # and what share of its cores other processes took meanwhile (this machine may be busy)
    (share,) = cold["cold_prepare_other_shares"]
    assert share is None or 0.0 <= share <= 1.0, cold
    assert s["plan"] == "dynamic" or "(budget 0.001 s): OVER BUDGET" in serving_line(s), serving_line(s)
    kept = set(s.get("packages") or {})
    on_disk = {p.name for p in (dest / "packages").iterdir()}
    if s["plan"] == "buckets":
        assert kept == {str(b) for b in s["buckets"]}, s
        assert on_disk == {"mlp.pt2", *(f"mlp-b{b}.pt2" for b in kept)}, on_disk
    else:  # the MLP's plans run within noise of each other: the dynamic one ships its own package
        assert kept == {"dynamic"} and s["packages"]["dynamic"]["batch"] == [3, 4], s
        assert s["plans"]["dynamic"]["package_build"]["buckets"] == 1, s  # beside the buckets' build
        assert on_disk == {"mlp.pt2", "mlp-b3-4.pt2"}, on_disk
    assert got["mlp"]["package_from_bucket"] == 4 and got["mlp"]["package_inputs"] == [
        [[4, 128], "float32", "cpu"]
    ]
    # the stock user under the same traffic, in a process of its own: compiled cold, recompiling
    stock = s["stock"]
    assert stock["mode"] == "default" and sorted(stock["order"]) == [3, 4] and stock["graphs"] >= 1, stock
    assert stock["max_first_call_s"] > 10 * stock["weighted_ms"] / 1e3, stock  # the first call compiled
    assert s["vs_stock"] == stock["weighted_ms"] / s["plans"][s["plan"]]["weighted_ms"], s
    c = got["checked"]["serving"]
    assert c["package_error"].startswith("bucket ") and "data-dependent" in c["package_error"], c
    assert "from" not in c["plans"]["buckets"] and c["plans"]["buckets"]["graphs"] >= 2, c
    assert not list((dest / "packages").glob("checked-b*")), list((dest / "packages").iterdir())


@pytest.mark.slow  # a tier of its own, after the default one (docs/testing.md)
def test_a_model_whose_rows_interact_ships_one_package_for_its_range_served_without_dynamo(tmp_path):
    """The dynamic plan as it ships: one AOTInductor package with the batch dimension a
    `torch.export.Dim` over the range, built by a `--bucket-package LOW:HIGH` process, loaded,
    checked and timed in the bundle job; a fresh process's `compile_tuned` serves every size of the
    range from it without Dynamo, each size's outputs those of eager at that size."""
    from orchestrator.tune.sweep_models import packaged_plan, serving_line

    dest = tmp_path / "export"
    factory = "batch_centered"
    profile = {"batch": {"min": 1, "max": 10}}  # the fine ladder pads 9 to 10: rows proven to interact
    result = _packaged_bundle(tmp_path, factory, profile)
    assert result["status"] == "ok", result.get("error")
    s = result["serving"]
    assert s["plan"] == "dynamic" and not s["padding"]["ok"] and "package_error" not in s, s
    p = s["packages"]["dynamic"]
    assert p["batch"] == [1, 10] and p["file"] == f"{factory}-b1-10.pt2" and p["cudagraphs"] is False, p
    assert p["inputs"] == [[[None, 32], "float32", "cpu"]], p
    dynamic = s["plans"]["dynamic"]
    assert dynamic["package_ms"] > 0 and set(dynamic["prepare_steps"]) == set(STEPS), dynamic
    assert dynamic["package_build"]["buckets"] == 1 and "package_build" not in s, s  # no buckets built
    assert (dest / "packages" / p["file"]).exists()
    assert "one package for batch 1..10" in serving_line(s)

    entry = {
        "model": factory,
        "batch_size": 4,
        "dtype": "fp32",
        "config": "default",
        "compile": {"backend": "inductor", "mode": None, "fullgraph": False, "dynamic": None, "options": {}},
        "bundle": f"bundles/{factory}.bin",
        "package": None,
        "serving": packaged_plan(s, "packages"),
    }
    (dest / SERVING_FILE).write_text(json.dumps({"format": 1, "presets": [entry], "defaults": {}}))
    manifest = {"format": EXPORT_FORMAT, "hardware": hardware_class(), "stack": software_stack(), "files": {}}
    rehash(dest, manifest)
    got = _serve(dest, factory)
    applied = got["applied"]
    assert applied["package"] == "loaded" and applied["bundle"] == "none", applied  # no compile at all
    assert applied["serving"]["plan"] == "dynamic" and applied["serving"]["prepare_graphs"] == 0, applied
    assert applied["package_file"].endswith(p["file"]), applied
    assert got["compiles"] == 0 and got["worst"] < 1e-4, got
