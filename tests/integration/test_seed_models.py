"""A seed-benchmark architecture, reduced, through a real sweep: the CLI, a local Ray cluster,
cold Inductor compiles on CPU, a warm recompile, and every measurement column in the rows.

SegFormer only (DETR ran here too until the test tier neared its 15 minutes: the two jobs took
137 s on 2 cores, SegFormer alone with both cores 89 s). DETR's reduced config is built and run
by tests/test_zoo.py, and the full-size one by the GPU sweeps."""

from __future__ import annotations

import json
import time

import pyarrow as pa
import pytest

from store.schema import read_results
from tests.columns import MEASUREMENT_COLUMNS
from tests.integration.conftest import orchestrate
from workers.zoo import SMALL_IMAGE_SIZE, SMALL_OVERRIDES

pytestmark = pytest.mark.integration

ITERATIONS = 6
MODELS = {
    # model id -> (short name, task)
    # SegFormer traces two graphs before its first eager call and one after: its warm compile
    # must still hit the cache the cold one filled (on the GPU it once compiled again, slower)
    "hf:nvidia/segformer-b0-finetuned-ade-512-512": ("segformer-small", "image-segmentation"),
}


def sweep_text() -> str:
    models = "\n".join(
        f"  - id: {model_id}\n"
        f"    name: {name}\n"
        f"    input_size: {SMALL_IMAGE_SIZE}\n"
        f"    overrides: {json.dumps(SMALL_OVERRIDES[model_id])}"
        for model_id, (name, _) in MODELS.items()
    )
    return (
        "name: it-seed\n"
        f"models:\n{models}\n"
        "batch_sizes: [1]\n"
        "dtypes: [fp32]\n"
        "configs:\n"
        "  default: {}\n"
        f"measure: {{warmup: 2, iterations: {ITERATIONS}, rounds: 3, warm_compile: true}}\n"
        "timeout_s: 300\n"
    )


# Every column of the row that is non-null for an ok job: the measurements, and where it ran.
NON_NULL = ("job_id", "run_id", "hardware", "node_id", "task", "wall_s", *MEASUREMENT_COLUMNS)


@pytest.fixture(scope="module")
def seed_sweep(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("seed")
    sweep = tmp / "seed.yaml"
    sweep.write_text(sweep_text())
    out = tmp / "out"
    t0 = time.monotonic()
    proc = orchestrate("sweep", str(sweep), "--out", str(out), "--cpus-per-job", "2", timeout=400)
    took = time.monotonic() - t0
    print(f"seed sweep took {took:.1f} s")
    return proc, read_results(out), took


@pytest.mark.slow  # a tier of its own, after the default one (docs/testing.md)
def test_seed_models_sweep_rows(seed_sweep):
    proc, table, took = seed_sweep
    assert "done in" in proc.stdout
    assert table.num_rows == len(MODELS)
    for key in ("eager_samples_ms", "compiled_samples_ms"):
        assert table.schema.field(key).type == pa.list_(pa.float64())
    rows = {r["model_id"]: r for r in table.to_pylist()}
    assert set(rows) == set(MODELS)
    for model_id, (name, task) in MODELS.items():
        r = rows[model_id]
        assert r["status"] == "ok", r["error"]
        assert r["error"] is None
        assert r["model"] == name and r["task"] == task
        assert r["batch_size"] == 1 and r["dtype"] == "fp32" and r["config"] == "default"
        assert r["backend"] == "inductor" and r["hardware"] == "cpu"
        nulls = [c for c in NON_NULL if r[c] is None]
        assert not nulls, f"{name}: null columns {nulls}"
        assert len(r["eager_samples_ms"]) == len(r["compiled_samples_ms"]) == ITERATIONS
        assert r["eager_p10_ms"] <= r["eager_ms"] <= r["eager_p90_ms"]
        assert r["compiled_p10_ms"] <= r["compiled_ms"] <= r["compiled_p90_ms"]
        assert r["speedup"] == pytest.approx(r["eager_ms"] / r["compiled_ms"])
        assert r["speedup_ci_low"] <= r["speedup"] <= r["speedup_ci_high"]
        assert 0 < r["warm_compile_s"] < r["compile_s"] < r["subprocess_s"]
        assert r["warm_cache_misses"] == 0 and r["warm_cache_hits"] >= 1  # the warm compile hit the cache
        assert 0 < r["inductor_s"] <= r["dynamo_s"]
        assert r["graph_count"] >= 1 and r["kernel_count"] >= 1 and r["guard_count"] >= 1
        assert r["flops"] > 0 and r["compiled_tflops"] > 0 and r["memory_compression"] > 0
        assert r["eager_warmup_calls"] >= 2 and r["compiled_warmup_calls"] >= 2
        assert r["max_rel_err"] < 1e-3 and r["rmse_compiled"] < 1e-3
    assert len({r["job_id"] for r in rows.values()}) == len(MODELS)
    assert took < 300, f"the seed sweep took {took:.0f} s"
