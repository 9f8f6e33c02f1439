"""The warm compile must hit the cache the cold one filled, also for a model that changes on its
first eager call (SegFormer traces two graphs before it and one after): found on the GPU, where
SegFormer's warm compile was slower than its cold one, and reproduced here on CPU."""

from __future__ import annotations

import copy

import pytest

from compiler.config import CompileConfig
from workers import zoo
from workers.job import Job, MeasureSpec, ModelSpec
from workers.runner import run_job

pytestmark = pytest.mark.integration

SEGFORMER = "hf:nvidia/segformer-b0-finetuned-ade-512-512"


def test_segformer_warm_compile_hits_the_fx_graph_cache():
    job = Job(
        sweep="warm",
        hardware="cpu",
        device="cpu",
        model=ModelSpec(
            id=SEGFORMER,
            name="segformer-small",
            input_size=zoo.SMALL_IMAGE_SIZE,
            overrides=copy.deepcopy(zoo.SMALL_OVERRIDES[SEGFORMER]),
        ),
        batch_size=1,
        dtype="fp32",
        config=CompileConfig(name="default"),
        measure=MeasureSpec(warmup=2, iterations=4, rounds=2, warm_compile=True, flops=False),
        timeout_s=600,
    )
    result = run_job(job, threads=2)
    assert result["status"] == "ok", result.get("error")
    assert result["warm_cache_misses"] == 0, result.get("notes")
    assert result["warm_cache_hits"] >= 1
    assert result["warm_compile_s"] < result["compile_s"]
