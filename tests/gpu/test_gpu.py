"""Checks that need a CUDA device and the GPU image (timm, torchvision): ``pytest -m gpu tests/gpu``.

Run on a machine with a CUDA GPU (``python -m pytest -m gpu``); the default tier deselects them (``-m 'not gpu'``).
"""

from __future__ import annotations

import copy
import dataclasses

import pytest
import torch

from compiler.config import CompileConfig
from compiler.job import Job, MeasureSpec, ModelSpec
from tests.columns import assert_pinned_or_says_why
from workers import external, toy, zoo
from workers.runner import run_job

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

THREADS = 8


def _job(model: ModelSpec, dtype: str = "fp32", mode: str | None = None, batch_size: int = 2) -> Job:
    return Job(
        sweep="gpu-tests",
        hardware="gpu",
        device="cuda",
        model=model,
        batch_size=batch_size,
        dtype=dtype,
        config=CompileConfig(name=mode or "default", mode=mode),
        measure=MeasureSpec(warmup=5, iterations=40, rounds=4),
        timeout_s=600.0,
    )


def _small_resnet() -> ModelSpec:
    model_id = "hf:microsoft/resnet-50"
    overrides = copy.deepcopy(zoo.SMALL_OVERRIDES[model_id])
    return ModelSpec(id=model_id, name="resnet-small", input_size=64, overrides=overrides)


# --- timm: and torchvision: sources ---------------------------------------------------------------------


def test_external_models_build_at_their_pretrained_resolution():
    timm_model = external.build("timm:resnet18", {})
    assert timm_model.task == "image-classification" and timm_model.image_size == 224
    seg = external.build("torchvision:lraspp_mobilenet_v3_large", {"num_classes": 5})
    assert seg.task == "image-segmentation" and seg.image_size == 520
    x = external.make_inputs(1, 96, torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert timm_model.module(*x).shape == (1, 1000)
        out = zoo.output_tensors(seg.module(*x))
    assert out[0].shape == (1, 5, 96, 96)


def test_external_ids_that_cannot_be_fed_are_refused_with_a_reason():
    assert external.check_id("timm:resnet18") is None
    assert external.check_id("torchvision:resnet18") is None
    assert "did you mean" in external.check_id("timm:resnet1")
    problem = external.check_id("torchvision:fasterrcnn_resnet50_fpn")
    assert "image lists" in problem


@pytest.mark.parametrize("model_id", ["timm:resnet18", "torchvision:resnet18"])
def test_external_model_job_measures_on_the_gpu(model_id):
    result = run_job(_job(ModelSpec(id=model_id, name=model_id.replace(":", "-"))), threads=THREADS)
    assert result["status"] == "ok", result.get("error")
    assert result["task"] == "image-classification"
    assert result["eager_ms"] > 0 and result["compiled_ms"] > 0 and result["compiled_b2b_ms"] > 0
    assert "H100" in result["device_name"] or "H200" in result["device_name"]


# --- precision policies and the CUDA OOM path --------------------------------------------------------------


@pytest.mark.parametrize("dtype", ["fp32", "fp32-strict", "tf32", "bf16", "fp16"])
def test_precision_policies_run_and_pass_accuracy(dtype):
    from compiler.precision import policy

    result = run_job(_job(_small_resnet(), dtype=dtype, batch_size=4), threads=THREADS)
    assert result["status"] == "ok", (dtype, result.get("error"))
    assert result["max_abs_err"] is not None and result["compiled_ms"] > 0
    # the switches the job ran under are the policy's, and what judges precision was measured
    want = policy(dtype).settings()
    assert (result["cudnn_allow_tf32"], result["matmul_precision"]) == (
        want["cudnn_allow_tf32"],
        want["matmul_precision"],
    )
    assert result["fp64_max_rel_err"] is not None and len(result["output_sensitivity"]) == 3


def test_cuda_out_of_memory_becomes_an_oom_row():
    result = run_job(_job(ModelSpec(id="python:tests.faulty:oom", name="oom")), threads=THREADS)
    assert result["status"] == "oom", result.get("error")
    assert "CUDA out of memory" in result["error"]


def test_reduce_overhead_uses_cuda_graphs():
    result = run_job(_job(_small_resnet(), mode="reduce-overhead"), threads=THREADS)
    assert result["status"] == "ok", result.get("error")
    assert not result.get("cudagraph_skip_reasons"), result.get("cudagraph_skip_reasons")


# --- clocks, pinning and repeats on the device -------------------------------------------------------------


def test_clock_sampler_sees_the_gpu_boost_under_load():
    from compiler.clocks import ClockSampler

    x = torch.randn(4096, 4096, device="cuda")
    with ClockSampler(interval_s=0.01) as sampler:
        for _ in range(200):
            x = torch.tanh(x @ x)
        torch.cuda.synchronize()
    s = sampler.summary()
    assert sampler.unavailable is None, sampler.unavailable
    assert s["clock_samples"] >= 5 and s["sm_clock_max_mhz"] > 1000 and s["power_max_w"] > 0, s


def test_job_rows_carry_the_clocks_during_timing_and_their_cores():
    job = _job(_small_resnet(), mode="reduce-overhead")
    job = dataclasses.replace(job, measure=MeasureSpec(warmup=5, iterations=400, rounds=4))
    result = run_job(job, threads=THREADS)
    assert result["status"] == "ok", result.get("error")
    assert result["clock_samples"] >= 2, result.get("notes")
    assert result["sm_clock_min_mhz"] <= result["sm_clock_mean_mhz"] <= result["sm_clock_max_mhz"]
    assert result["sm_clock_max_mhz"] > 1000 and result["power_mean_w"] > 0
    assert isinstance(result["throttle_reasons"], list)
    assert_pinned_or_says_why(result)


def test_repeats_compile_warm_and_pool_samples_on_the_gpu():
    job = _job(_small_resnet(), mode="reduce-overhead")
    job = dataclasses.replace(job, measure=MeasureSpec(warmup=5, iterations=40, rounds=4, repeats=2))
    result = run_job(job, threads=THREADS)
    assert result["status"] == "ok", result.get("error")
    assert result["samples_per_repeat"] == [40, 40] and result["ci_scope"] == "processes"
    assert result["warm_compile_s"] < result["compile_s"] and result["warm_cache_misses"] == 0
    assert result["clock_samples"] >= 2


@pytest.mark.parametrize("mode", [None, "reduce-overhead"])
def test_device_time_beside_wall_time_eager_and_compiled(mode):
    """The profiler's kernel records give each side's device busy time per call (CUDA graph
    replays included): below the wall time, and a small-batch small model is host-bound in eager."""
    job = _job(_small_resnet(), mode=mode, batch_size=1)
    job = dataclasses.replace(job, measure=MeasureSpec(warmup=5, iterations=40, rounds=4, repeats=2))
    result = run_job(job, threads=THREADS)
    assert result["status"] == "ok", result.get("error")
    assert result["device_samples_per_repeat"] == [20, 20], result.get("notes")
    for side in ("eager", "compiled"):
        device, wall = result[f"{side}_device_ms"], result[f"{side}_ms"]
        assert 0 < device <= wall * 1.05, (side, device, wall)
        assert result[f"{side}_device_ci_low"] <= device <= result[f"{side}_device_ci_high"]
        assert 0 <= result[f"{side}_host_bound_share"] <= 1
    assert result["eager_host_bound_share"] > 0.25, result["eager_host_bound_share"]


# --- kernel choices under max-autotune ------------------------------------------------------------------


def test_max_autotune_records_triton_and_aten_candidates_with_one_winner_per_op():
    job = Job(
        sweep="gpu-tests",
        hardware="gpu",
        device="cuda",
        model=ModelSpec(
            id="python:workers.toy:linear", name="linear", input_size=512, overrides={"out_features": 1024}
        ),
        batch_size=256,
        dtype="fp32",
        config=CompileConfig(name="max-autotune-no-cudagraphs", mode="max-autotune-no-cudagraphs"),
        measure=MeasureSpec(warmup=5, iterations=20, rounds=2, flops=False),
        timeout_s=600.0,
    )
    result = run_job(job, threads=THREADS)
    assert result["status"] == "ok", result.get("error")
    rows = result["kernel_choices"]
    assert {r["kind"] for r in rows} >= {"extern", "triton_template"}, {r["kind"] for r in rows}
    for op_index in {r["op_index"] for r in rows}:
        op_rows = [r for r in rows if r["op_index"] == op_index]
        assert [r["is_winner"] for r in op_rows].count(True) == 1, op_rows
        assert [r["emitted"] for r in op_rows].count(True) == 1, op_rows  # the kernel in the code
        assert all(r["time_ms"] is None or r["time_ms"] > 0 for r in op_rows)
    assert any(
        '"BLOCK_M"' in r["config"] or "num_warps" in r["config"]
        for r in rows
        if r["kind"] == "triton_template"
    )


def test_triton_kernels_and_a_paired_job_with_a_baseline_in_the_same_process():
    """The triton_kernels rows of a compile with coordinate descent (settled configs, flagged),
    and orchestrate tune's confirmation job on a GPU: both sides compiled in one process, each
    its own graph, the candidate's kernels only in its rows."""
    from compiler.job import Baseline

    cd = CompileConfig(name="cd", options={"coordinate_descent_tuning": True})
    job = dataclasses.replace(
        _job(_small_resnet()),
        config=cd,
        measure=MeasureSpec(warmup=3, iterations=20, rounds=2, flops=False, repeats=2),
        baseline=Baseline(CompileConfig(name="default"), "fp32"),
    )
    result = run_job(job, threads=THREADS)
    assert result["status"] == "ok", result.get("error")
    kernels = result["triton_kernels"]
    assert kernels and all(k["coordinate_descent"] for k in kernels), kernels[:3]
    ran = [k for k in kernels if k["config"] is not None]
    assert ran and all(k["found_by_coordesc"] and k["num_warps"] for k in ran), ran[:3]
    assert {k["heuristic"] for k in kernels} & {"POINTWISE", "REDUCTION", "PERSISTENT_REDUCTION"}
    assert result["baseline_compile_s"] > 0 and result["compile_s"] > 0.5  # not the baseline's code
    assert len(result["baseline_samples_ms"]) == len(result["compiled_samples_ms"]) == 40
    assert (
        result["speedup_vs_baseline_ci_low"]
        <= result["speedup_vs_baseline"]
        <= result["speedup_vs_baseline_ci_high"]
    )


# --- AOTInductor packages ---------------------------------------------------------------------------------


def test_a_cuda_graph_package_loads_captures_and_serves_the_callers_weights(tmp_path):
    # on the H200 image every package crashed its loader (a static libstdc++ in its library), a
    # freezing preset's package wanted the exporting process's weights, and capturing a CUDA graph
    # around torch's default runner failed: a reduce-overhead+freezing preset's package, end to end
    from compiler import aoti
    from compiler.measure import compare_outputs
    from compiler.serving.packaged import PackagedModel

    config = CompileConfig(name="reduce-overhead+freezing", mode="reduce-overhead", freezing=True)
    built, inputs = toy.conv_bn(4, 16, {"channels": 16})
    caller, _ = toy.conv_bn(4, 16, {"channels": 16, "seed": 1})  # other weights: the package must take these
    built, caller, x = built.cuda(), caller.cuda(), inputs["x"].cuda()
    with torch._inductor.config.patch(freezing=True):  # as the export job runs a freezing preset
        info = aoti.build_package(built, (x,), config, tmp_path / "p.pt2")  # a fresh process loaded it
    assert info["package_cudagraphs"] and info["package_inputs"] == [[[4, 3, 16, 16], "float32", "cuda"]]
    packaged = PackagedModel.load(tmp_path / "p.pt2", caller, info["package_inputs"], True, lambda: None)
    packaged.capture((x,), {})
    assert len(packaged.graphs) == 1  # the preset's CUDA graph, replayed by every call
    y = torch.randn_like(x)
    with torch.no_grad():
        got, want = packaged(y).clone(), caller(y)
    assert compare_outputs([want], [got], "fp32").ok
