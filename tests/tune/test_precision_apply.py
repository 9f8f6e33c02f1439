"""What `compile_tuned` does to a serving process's settings: only what the preset measured is set,
every change is returned with its old value, and a setting the preset leaves alone but that differs
from what it was measured under is warned about, or refused under `strict`."""

from __future__ import annotations

import warnings

import pytest
import torch

from compiler.serving import ExportError, RuntimeSettingWarning, SettingMismatchWarning, compile_tuned
from tests.tune.test_export_apply import edit_presets, write_export
from workers import toy


@pytest.fixture
def process_settings():
    """The float32 switches and cudnn.benchmark, put back after the test."""
    import torch._inductor.config as inductor_config

    saved = (
        torch.backends.cudnn.allow_tf32,
        torch.get_float32_matmul_precision(),
        torch.backends.cudnn.benchmark,
        inductor_config.freezing,
    )
    yield
    torch.backends.cudnn.allow_tf32, matmul, torch.backends.cudnn.benchmark, inductor_config.freezing = saved
    torch.set_float32_matmul_precision(matmul)


def serve(dest, **kwargs):
    model, inputs = toy.mlp(4)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        _, applied = compile_tuned(model, inputs, dest, model_name="mlp", run_example=False, **kwargs)
    return applied, seen


def test_the_stock_policy_leaves_the_float32_switches_as_it_found_them(tmp_path, process_settings):
    dest = write_export(tmp_path / "export")  # an fp32 preset: the stock policy, torch's defaults
    for cudnn, matmul in ((True, "highest"), (False, "high")):
        torch.backends.cudnn.allow_tf32 = cudnn
        torch.set_float32_matmul_precision(matmul)
        applied, seen = serve(dest)
        assert applied.match == "exact" and applied.precision == "fp32"
        assert torch.backends.cudnn.allow_tf32 is cudnn and torch.get_float32_matmul_precision() == matmul
        assert not {"cudnn_allow_tf32", "matmul_precision"} & set(applied.changed), applied.changed
        mismatched = [str(w.message) for w in seen if issubclass(w.category, SettingMismatchWarning)]
        if cudnn:  # as measured: nothing to say
            assert mismatched == []
        else:  # not what the preset was measured under: said, and left alone
            assert len(mismatched) == 1 and "cudnn_allow_tf32 is False here" in mismatched[0], mismatched
            assert "matmul_precision is high here" in mismatched[0]
    with pytest.raises(ExportError, match="cudnn_allow_tf32 is False here"):
        serve(dest, strict=True)
    assert torch.backends.cudnn.allow_tf32 is False  # refused before anything was set


def test_a_policy_sets_only_what_it_changes_and_returns_the_old_values(tmp_path, process_settings):
    def tf32_with_benchmark(presets):
        entry = presets["presets"][0]
        entry["precision"] = "tf32"
        entry["compile"]["runtime"] = {"cudnn_benchmark": True}

    dest = edit_presets(write_export(tmp_path / "export"), tf32_with_benchmark)
    torch.backends.cudnn.allow_tf32, torch.backends.cudnn.benchmark = True, False
    torch.set_float32_matmul_precision("highest")
    applied, seen = serve(dest)
    assert applied.changed == {"matmul_precision": ["highest", "high"], "cudnn_benchmark": [False, True]}
    assert torch.get_float32_matmul_precision() == "high" and torch.backends.cudnn.benchmark is True
    said = [str(w.message) for w in seen if issubclass(w.category, RuntimeSettingWarning)]
    assert any("matmul_precision: highest -> high" in m for m in said), said
    assert not [w for w in seen if issubclass(w.category, SettingMismatchWarning)]

    def strict_fp32(presets):
        presets["presets"][0]["precision"] = "fp32-strict"

    strict = edit_presets(write_export(tmp_path / "strict"), strict_fp32)
    applied, seen = serve(strict)  # the process keeps the tf32 preset's matmul and cudnn settings
    assert applied.changed == {"cudnn_allow_tf32": [True, False]}
    assert torch.backends.cudnn.allow_tf32 is False and torch.get_float32_matmul_precision() == "high"
    mismatch = " ".join(str(w.message) for w in seen if issubclass(w.category, SettingMismatchWarning))
    assert "matmul_precision is high here, the preset was measured with highest" in mismatch
    assert "cudnn_benchmark is True here, the preset was measured with False" in mismatch
