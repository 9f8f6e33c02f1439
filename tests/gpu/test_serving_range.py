"""`compile_tuned` serving a batch-size range on a CUDA device under CUDA graphs: every graph of
the plan prepared and captured at load, none compiled after (``pytest -m gpu tests/gpu``)."""

from __future__ import annotations

import pytest
import torch

from compiler.config import CompileConfig
from compiler.hardware import hardware_class
from compiler.serving import compile_tuned
from compiler.serving.plan_packages import STEPS
from compiler.serving.served import graph_count
from tests.tune.test_export_apply import edit_presets, rehash, write_export
from workers import toy

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


@pytest.mark.parametrize("factory, plan", [("mlp", "buckets"), ("batch_centered", "dynamic")])
def test_a_reduce_overhead_preset_serves_every_size_of_its_range_without_compiling(tmp_path, factory, plan):
    torch._dynamo.reset()
    dest = write_export(tmp_path / "export", hardware=hardware_class("cuda"))
    edit_presets(dest, lambda p: p["presets"][0]["compile"].update(mode="reduce-overhead"))
    model, inputs = getattr(toy, factory)(4)
    model, inputs = model.cuda(), {k: v.cuda() for k, v in inputs.items()}
    compiled, applied = compile_tuned(
        model, inputs, dest, model_name="mlp", dtype="fp32", serving={"batch": {"min": 1, "max": 16}}
    )
    s = applied.serving
    assert s["plan"] == plan, s
    # buckets: a graph per bucket; dynamic: every size captured (its graphs: batch 1's and the dynamic one)
    want = [1, 2, 3, 4, 6, 8, 12, 16] if plan == "buckets" else sorted(range(1, 17))
    assert sorted(s["prepared_sizes"]) == want and s["reserved_bytes"] is not None, s
    before = graph_count()
    features = inputs["x"].shape[1]
    for n in range(1, 17):
        x = torch.randn(n, features, device="cuda")
        out = compiled(x=x).clone()  # a CUDA-graph replay's output is overwritten by the next call
        with torch.no_grad():
            torch.testing.assert_close(out, model(x=x), rtol=1e-3, atol=1e-3)
    assert graph_count() == before, "a size of the range compiled after preparation"


def test_a_buckets_plan_of_packages_is_captured_at_load_and_served_without_dynamo(tmp_path):
    """Each bucket's AOTInductor package of a reduce-overhead preset, loaded with the caller's
    weights and captured in a CUDA graph at load: no Dynamo graph at all, every size served."""
    from compiler import aoti

    torch._dynamo.reset()
    config = CompileConfig(name="ro", mode="reduce-overhead")
    packages = {}
    for bucket in (4, 16):
        model, inputs = toy.mlp(bucket)
        model, inputs = model.cuda(), {k: v.cuda() for k, v in inputs.items()}
        info = aoti.build_package(model, inputs, config, tmp_path / f"p{bucket}.pt2")
        assert info["package_cudagraphs"] is True
        packages[str(bucket)] = {
            "file": f"packages/b{bucket}.pt2",
            "inputs": info["package_inputs"],
            "cudagraphs": True,
        }
    dest = write_export(tmp_path / "export", hardware=hardware_class("cuda"))
    (dest / "packages").mkdir()
    for bucket in (4, 16):
        (dest / "packages" / f"b{bucket}.pt2").write_bytes((tmp_path / f"p{bucket}.pt2").read_bytes())
    plan = {
        "profile": {"batch": {"min": 1, "max": 16}},
        "plan": "buckets",
        "buckets": [4, 16],
        "padding": {"ok": True},
    }
    rehash(edit_presets(dest, lambda p: p["presets"][0].update(serving={**plan, "packages": packages})))
    model, inputs = toy.mlp(4)
    model, inputs = model.cuda(), {k: v.cuda() for k, v in inputs.items()}
    before = graph_count()
    compiled, applied = compile_tuned(model, inputs, dest, model_name="mlp", dtype="fp32", strict=True)
    assert applied.package == "loaded" and applied.serving["prepare_graphs"] == 0, applied
    loaded = compiled.compiled.packages  # the ServedModel's BucketPackages
    assert len({p.pool for p in loaded.values()}) == 1, "the buckets' graphs share one memory pool"
    for n in range(1, 17):
        x = torch.randn(n, 128, device="cuda")
        out = compiled(x=x).clone()
        with torch.no_grad():
            torch.testing.assert_close(out, model(x=x), rtol=1e-3, atol=1e-3)
    assert graph_count() == before, "Dynamo compiled something"


def test_a_conv_models_buckets_plan_runs_one_eager_reference_and_measures_memory_from_an_emptied_cache():
    """`load_buckets` on CUDA runs a convolutional model eagerly once, at its largest bucket, before
    the first capture (no eager calls at the other buckets: torch keeps cuDNN's plans per thread,
    so calls in other threads made none a package found); what each bucket adds to the reserved
    memory is measured from an emptied cache (never below 0); and `load_dynamic` runs eager at
    its range's two ends only."""
    from compiler.serving.plan_packages import load_buckets, load_dynamic

    model, inputs = toy.conv_bn(16)
    model, inputs = model.cuda(), {k: v.cuda() for k, v in inputs.items()}
    events: list[tuple[str, int]] = []
    model.register_forward_hook(
        lambda mod, args, kwargs, out: events.append(("eager", kwargs["x"].shape[0])), with_kwargs=True
    )
    torch.ones(256, 2**20, device="cuda").sum()  # 1 GiB cached before the plan

    class Stand:  # a package stand-in that runs the model eagerly
        pool = None

        def capture(self, args, kwargs, pool=None):
            events.append(("capture", kwargs["x"].shape[0]))
            return {"first_run_s": 0.0}

        def __call__(self, *args, **kwargs):
            return model(*args, **kwargs)

    loaded = load_buckets([2, 4, 8, 16], lambda b: Stand(), model, ((), inputs), "fp32", True)
    assert events[: events.index(("capture", 16))] == [("eager", 16)], events
    assert all(g >= 0 for g in loaded.memory_gib.values()), loaded.memory_gib

    events.clear()
    Stand.cudagraphs = True
    load_dynamic(lambda: Stand(), model, ((), inputs), (1, 8), "fp32")
    assert sorted(events[: events.index(("capture", 8))]) == [("eager", 1), ("eager", 8)], events


def test_a_dynamic_plan_package_captures_every_size_of_its_range_and_serves_without_dynamo(tmp_path):
    """The dynamic plan's one AOTInductor package (batch a `Dim` over 1..16) of a reduce-overhead
    preset for a model whose rows interact: a CUDA graph per size captured at load into one pool,
    each size's outputs eager's at that size, no Dynamo graph at all."""
    from compiler import aoti

    torch._dynamo.reset()
    model, inputs = toy.batch_centered(4)
    model, inputs = model.cuda(), {k: v.cuda() for k, v in inputs.items()}
    info = aoti.build_package(
        model, inputs, CompileConfig(name="ro", mode="reduce-overhead"), tmp_path / "d.pt2", (1, 16)
    )
    assert info["package_cudagraphs"] is True and info["package_batch"] == [1, 16], info
    dest = write_export(tmp_path / "export", hardware=hardware_class("cuda"))
    (dest / "packages").mkdir()
    (dest / "packages" / "d.pt2").write_bytes((tmp_path / "d.pt2").read_bytes())
    package = {
        "file": "packages/d.pt2",
        "inputs": info["package_inputs"],
        "cudagraphs": True,
        "batch": [1, 16],
    }
    plan = {
        "profile": {"batch": {"min": 1, "max": 16}},
        "plan": "dynamic",
        "buckets": [],
        "padding": {"ok": False, "reason": "rows interact"},
        "packages": {"dynamic": package},
    }

    def dynamic_preset(presets: dict) -> None:
        presets["presets"][0].update(model="batch_centered", serving=plan)
        presets["presets"][0]["compile"].update(mode="reduce-overhead")

    rehash(edit_presets(dest, dynamic_preset))
    model, inputs = toy.batch_centered(4)
    model, inputs = model.cuda(), {k: v.cuda() for k, v in inputs.items()}
    before = graph_count()
    compiled, applied = compile_tuned(
        model, inputs, dest, model_name="batch_centered", dtype="fp32", strict=True
    )
    assert applied.package == "loaded" and applied.serving["prepare_graphs"] == 0, applied
    assert set(applied.serving["prepare_steps"]) == set(STEPS)
    assert len(compiled.compiled.graphs) == 16, "a CUDA graph per size of the range"
    for n in range(1, 17):
        x = torch.randn(n, inputs["x"].shape[1], device="cuda")
        out = compiled(x=x).clone()
        with torch.no_grad():
            torch.testing.assert_close(out, model(x=x), rtol=1e-3, atol=1e-3)
    assert graph_count() == before, "Dynamo compiled something"


def test_the_export_job_prepares_a_budgeted_buckets_plan_cold_under_cuda_graphs(tmp_path):
    """The bundle job of a reduce-overhead preset on CUDA with packages and a prepare budget: each
    bucket's package built, loaded and captured in a CUDA graph in the job, then prepared cold in a
    fresh process (`--serving-prepare`), its seconds per bucket weighed against the budget and the
    chosen set prepared cold once more."""
    from compiler.job import Job, MeasureSpec, ModelSpec
    from workers.runner import build_bundle

    dest = tmp_path / "export"
    (dest / "bundles").mkdir(parents=True)
    (dest / "packages").mkdir()
    job = Job(
        sweep="export",
        hardware=hardware_class("cuda"),
        device="cuda",
        model=ModelSpec(id="python:workers.toy:mlp", name="mlp"),
        batch_size=4,
        dtype="fp32",
        config=CompileConfig(name="ro", mode="reduce-overhead"),
        measure=MeasureSpec(),
        timeout_s=600,
    )
    profile = {"batch": {"min": 3, "max": 4}, "prepare_budget_s": 60}
    result = build_bundle(
        job, dest / "bundles" / "mlp.bin", 1, str(tmp_path), dest / "packages" / "mlp.pt2", profile
    )
    assert result["status"] == "ok", result.get("error")
    b = result["serving"]["plans"]["buckets"]
    assert b["from"] == "packages" and "cold_prepare_error" not in b, b
    assert sorted(map(int, b["bucket_prepare_s"])) == [3, 4] and b["cold_prepare_s"] > 0, b
    assert set(b["cold_prepare_steps"]) == set(STEPS) and b["cold_prepare_steps"]["capture_s"] > 0, b
    assert b["cold_prepare_s"] <= 60 or b["buckets"] == [4], b  # within the budget, or the largest alone
