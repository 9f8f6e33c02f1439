"""`compile_tuned` serving a batch-size range on a CUDA device under CUDA graphs: every graph of
the plan prepared and captured at load, none compiled after (``pytest -m gpu tests/gpu``)."""

from __future__ import annotations

import pytest
import torch

from compiler.hardware import hardware_class
from compiler.serving import compile_tuned
from compiler.serving.served import graph_count
from tests.tune.test_export_apply import edit_presets, write_export
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
