"""Eager presets (`compile: null`, `compiler.config.is_eager_preset`): the capability check
accepts them, and `compile_tuned` serves one in a fresh process, uncompiled under its runtime
settings."""

from __future__ import annotations

from compiler.capabilities import CPU, check_preset_supported, known
from tests.tune.test_export_apply import compile_tuned_in_fresh_process, edit_presets, write_export


def test_the_capability_check_accepts_an_eager_preset():
    eager = {"config": "eager", "compile": None, "runtime": {}, "precision": "fp32"}
    assert check_preset_supported(CPU, eager) is None and check_preset_supported(known("H100"), eager) is None
    v100_bf16 = check_preset_supported(known("V100"), {**eager, "precision": "bf16"})
    assert "bf16 is emulated there" in v100_bf16 and "Inductor" not in v100_bf16  # nothing compiles


def test_compile_tuned_serves_an_eager_preset_uncompiled_under_its_runtime_settings(tmp_path):
    """A real export whose mlp preset is eager with cudnn_benchmark: in a fresh process,
    compile_tuned returns the model itself, with the setting on, and compiles nothing (Dynamo and
    Inductor never imported)."""

    def eager(presets):
        entry = presets["presets"][0]
        entry.update(
            config="eager",
            compile=None,
            runtime={"cudnn_benchmark": True},
            precision="fp32",
            hardware="cpu",
            eager_over_config="reduce-overhead+freezing",
            eager_gain=1.27,
            eager_gain_ci_low=1.262,
            eager_gain_ci_high=1.279,
            eager_gain_processes=3,
        )

    dest = edit_presets(write_export(tmp_path / "export"), eager)
    got = compile_tuned_in_fresh_process(
        dest,
        "strict=True",
        "{'same': served is model, 'flag': torch.backends.cudnn.benchmark, 'summary': applied.summary(),"
        " 'config': applied.config, 'runtime': applied.runtime, 'compile_s': applied.compile_s, 'warned': warned,"
        " 'compilers': sorted(m for m in ('torch._dynamo', 'torch._inductor') if m in sys.modules)}",
    )
    assert got["same"] is True and got["flag"] is True and got["runtime"] == {"cudnn_benchmark": True}
    assert got["summary"] == (
        "cpu: exact eager preset, not compiled: compiled reduce-overhead+freezing was 1.27x slower "
        "[1.26, 1.28] over 3 processes on cpu"
    )
    assert got["config"] is None and got["compile_s"] is None and got["compilers"] == []
    assert [w for w in got["warned"] if "cudnn_benchmark: False -> True" in w]
