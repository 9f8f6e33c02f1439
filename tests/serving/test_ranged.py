"""`compile_tuned` serving a batch-size range from a CPU export: every size prepared at load, with
real Inductor compiles, and none after (Dynamo's own graph counter); the padding check that
decides whether a model may be padded; a batch above the range's max."""

from __future__ import annotations

import warnings

import pytest
import torch

from compiler.serving import compile_tuned
from compiler.serving.padding import check_padding, padding_pairs, padding_tolerance
from compiler.serving.served import graph_count
from compiler.serving.traffic import default_buckets
from tests.tune.test_export_apply import edit_presets, write_export
from workers import toy

RANGE = {"batch": {"min": 1, "max": 8}}


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    """Dynamo's cache is the process's: graphs another test compiled for the same toy model's code
    would be found, not compiled, and the counts below are of this test's compiles."""
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _rows(n: int, features: int, seed: int) -> torch.Tensor:
    return torch.randn(n, features, generator=torch.Generator().manual_seed(seed))


def _served_everywhere(compiled, model, features: int, sizes) -> None:
    """Every size runs without a Dynamo compile and gives eager's outputs."""
    before = graph_count()
    for n in sizes:
        x = _rows(n, features, n)
        out = compiled(x=x)
        with torch.no_grad():
            want = model(x=x)
        assert out.shape == want.shape, n
        torch.testing.assert_close(out, want, rtol=1e-4, atol=1e-5)
    assert graph_count() == before, "a size of the range compiled after preparation"


def test_the_padding_check_passes_independent_rows_and_rejects_rows_that_interact():
    buckets = default_buckets(1, 8)
    mlp, inputs = toy.mlp(4)
    ok = check_padding(mlp, (), inputs, padding_pairs(buckets, 1), padding_tolerance("fp32"))
    assert ok.ok and ok.checked == ((5, 6), (7, 8)) and ok.max_rel_diff < 1e-5, ok
    centered, inputs = toy.batch_centered(4)
    bad = check_padding(centered, (), inputs, padding_pairs(buckets, 1), padding_tolerance("fp32"))
    assert not bad.ok and "rows interact" in bad.reason and bad.max_rel_diff > 1e-2, bad
    # a batch of 1 padded with copies of its own row leaves x - x.mean(0) as it was; the
    # contrasting rows the check adds do not
    one = check_padding(centered, (), toy.batch_centered(1)[1], [(1, 8)], padding_tolerance("fp32"))
    assert not one.ok and "(contrast)" in one.reason, one


def test_compile_tuned_prepares_buckets_for_a_range_and_serves_every_size_without_compiling(tmp_path):
    dest = write_export(tmp_path / "export")
    model, inputs = toy.mlp(4)
    compiled, applied = compile_tuned(model, inputs, dest, model_name="mlp", serving=RANGE)
    s = applied.serving
    assert applied.match == "exact" and s["plan"] == "buckets" and s["plan_from"] == "load", s
    assert s["buckets"] == [1, 2, 3, 4, 6, 8] and s["prepared_sizes"] == s["buckets"]
    assert s["prepare_graphs"] == 6 and s["prepare_s"] > 0 and s["padding"]["ok"], s
    assert "serves batch 1..8 with the buckets plan on buckets [1, 2, 3, 4, 6, 8]" in applied.summary()
    _served_everywhere(compiled, model, 128, range(1, 9))
    # above max: chunks of max rows (the rows are independent: the padding check said so)
    _served_everywhere(compiled, model, 128, [13, 24])


def test_a_model_whose_rows_interact_gets_the_dynamic_plan_and_runs_a_batch_above_max_eagerly(tmp_path):
    dest = write_export(tmp_path / "export")
    model, inputs = toy.batch_centered(4)
    compiled, applied = compile_tuned(model, inputs, dest, model_name="centered", serving=RANGE)
    s = applied.serving
    assert applied.match == "class_default" and s["plan"] == "dynamic", s
    assert not s["padding"]["ok"] and "rows interact" in s["padding"]["reason"], s
    assert s["buckets"] == [] and s["prepare_graphs"] == 2, s  # the batch-of-1 graph and the dynamic one
    _served_everywhere(compiled, model, 32, range(1, 9))
    x = _rows(11, 32, 0)
    with pytest.warns(RuntimeWarning, match="above the served range's max 8 .* running it eagerly"):
        out = compiled(x=x)
    with torch.no_grad():
        torch.testing.assert_close(out, model(x=x))  # whole, not in chunks: its rows interact


def test_a_plan_in_the_export_is_served_for_any_batch_size_of_its_range(tmp_path):
    dest = write_export(tmp_path / "export")
    plan = {
        "profile": {"batch": {"min": 1, "max": 8}},
        "plan": "buckets",
        "buckets": [2, 8],
        "padding": {"ok": True},
    }
    edit_presets(dest, lambda p: p["presets"][0].update(serving=plan))
    model, inputs = toy.mlp(3)  # no preset at batch 3: the model's preset with a plan serves it
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing falls back
        compiled, applied = compile_tuned(model, inputs, dest, model_name="mlp")
    s = applied.serving
    assert applied.match == "serving" and s["plan_from"] == "export" and s["buckets"] == [2, 8], s
    assert s["prepare_graphs"] == 2, s
    _served_everywhere(compiled, model, 128, range(1, 9))


def test_an_export_for_another_class_still_prepares_the_range_with_torch_compiles_defaults(tmp_path):
    dest = write_export(tmp_path / "export", hardware="H100")
    model, inputs = toy.mlp(4)
    with pytest.warns(UserWarning, match="for hardware class 'H100'.*plain torch.compile"):
        compiled, applied = compile_tuned(model, inputs, dest, model_name="mlp", serving=RANGE)
    assert applied.match == "fallback" and applied.serving["plan"] == "buckets", applied.serving
    _served_everywhere(compiled, model, 128, range(1, 9))
