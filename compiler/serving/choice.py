"""Which preset of an export `compiler.serving.compile_tuned` serves a model with: the exact cell
(model, batch size and precision) else the class default (`find_preset`), the precisions a model
looks for (`model_policies`), the batch size its example inputs show (`inputs_batch_size`),
whether this process's device can run the preset (`unsupported_here`), and why a preset says not
to compile (`eager_reason`).

This module imports neither Ray nor the orchestrator package."""

from __future__ import annotations

from typing import Any

DTYPE_POLICIES = {"float32": ("fp32", "tf32", "fp32-strict"), "bfloat16": ("bf16",), "float16": ("fp16",)}
"""The cell precisions a model's parameter dtype looks for, in order (`compiler.precision`)."""


def model_policies(model: Any, dtype: str | None) -> tuple[str, ...]:
    """The cell precisions to look for, in order of preference: `dtype` where given, else those of
    the model's parameter dtype (`DTYPE_POLICIES`; float32's for a model without parameters)."""
    if dtype:
        return (dtype,)
    try:
        param = next(model.parameters())
    except (AttributeError, StopIteration):
        return DTYPE_POLICIES["float32"]
    return DTYPE_POLICIES.get(str(param.dtype).removeprefix("torch."), ())


def inputs_batch_size(example_inputs: Any) -> int | None:
    """The first dimension of the first tensor that is not a scalar in `example_inputs` (a dict of
    keyword arguments, a tuple of positional ones, or one tensor), or None."""
    import torch

    values = example_inputs.values() if isinstance(example_inputs, dict) else example_inputs
    if isinstance(values, torch.Tensor):
        values = [values]
    for value in values:
        if isinstance(value, torch.Tensor) and value.dim() > 0:
            return int(value.shape[0])
    return None


def find_preset(
    presets: dict[str, Any],
    model_name: str | None,
    batch_size: int | None,
    policies: tuple[str, ...],
) -> tuple[str, dict[str, Any] | None]:
    """(`exact`, entry) for this model, batch size and one of `policies` (in that order of
    preference); else (`serving`, the model's preset whose serving plan serves a batch-size range,
    for one of `policies`); else (`class_default`, the class
    default); else (`fallback`, None)."""
    entries = presets.get("presets", [])
    for policy in policies:
        for entry in entries:
            if (
                entry["model"] == model_name
                and entry["batch_size"] == batch_size
                and entry["dtype"] == policy
            ):
                return "exact", entry
    for policy in policies:
        for entry in entries:
            if entry["model"] == model_name and entry["dtype"] == policy and entry.get("serving"):
                return "serving", entry
    defaults = presets.get("defaults") or {}
    for policy in policies:
        if policy in defaults:
            return "class_default", defaults[policy]
    return "fallback", None


def unsupported_here(entry: dict[str, Any], device: Any) -> str | None:
    """Why this process's device cannot run the preset `entry` (`compiler.capabilities`), or None."""
    from compiler.capabilities import CPU, check_preset_supported, from_device

    on_gpu = device is not None and device.type == "cuda"
    return check_preset_supported(from_device(device.index or 0) if on_gpu else CPU, entry)


def eager_reason(entry: dict[str, Any]) -> str:
    """Why a preset says eager, in the words of `Applied.summary`, from its figures (those of the
    compiled config it beat); a figure missing or of the wrong type is left out, never a TypeError."""

    def number(key: str) -> float | None:
        value = entry.get(key)
        return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None

    over, gain = entry.get("eager_over_config"), number("eager_gain")
    if not isinstance(over, str) or gain is None:
        return "the preset says not to compile"
    low, high, processes = (
        number("eager_gain_ci_low"),
        number("eager_gain_ci_high"),
        number("eager_gain_processes"),
    )
    interval = f" [{low:.2f}, {high:.2f}]" if low is not None and high is not None else ""
    over_n = f" over {processes:.0f} processes" if processes is not None else ""
    return f"compiled {over} was {gain:.2f}x slower{interval}{over_n} on {entry.get('hardware')}"
