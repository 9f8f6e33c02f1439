"""Runtime settings: process-wide torch switches that a config and a preset carry beside the
compile options, such as `torch.backends.cudnn.benchmark`.

They are not `torch.compile` arguments, yet they move latency as much as a mode does: a compiled
graph still calls cuDNN for its convolutions, and with `cudnn_benchmark` cuDNN times its
algorithms for each new shape and keeps the fastest (ResNet-50 at batch 16 in TF32 on an H100,
compiled `default`, torch 2.11: 2.66 ms with it, 3.79 ms without; timm's own benchmark of its
resnet50 gave 2.26 and 3.71 ms). A setting here is

- validated in sweep files (`setting_problems`),
- applied in the job process before the model is built, so eager and compiled run under it alike
  (`apply`: every registered setting is set, to torch's default where the config says nothing,
  so the stock baseline is torch's defaults whatever the environment left behind),
- recorded in every row (`effective`), a tuner knob, written into presets and the export
  manifest, and applied by `compiler.serving.compile_tuned`.

A process keeps the first cuDNN plan it made for each convolution whatever the flag says later
(the plan's cache key holds shapes, dtype, layout, `deterministic` and `allow_tf32`, not the
benchmark flag), so two configs that differ in a runtime setting are never timed in one process
(`orchestrator.tune` confirms them in processes of their own).

This module imports torch only inside the functions that touch it.
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class RuntimeSetting:
    name: str
    help: str
    type: type
    default: Any
    """torch's own default: the stock baseline."""
    devices: tuple[str, ...]
    """Devices on which the setting changes anything (elsewhere it is set but moves nothing)."""
    read: Callable[[], Any]
    write: Callable[[Any], None]


def _cudnn_benchmark_read() -> bool:
    import torch

    return bool(torch.backends.cudnn.benchmark)


def _cudnn_benchmark_write(value: bool) -> None:
    import torch

    torch.backends.cudnn.benchmark = bool(value)


def _cudnn_enabled_read() -> bool:
    import torch

    return bool(torch.backends.cudnn.enabled)


def _cudnn_enabled_write(value: bool) -> None:
    import torch

    torch.backends.cudnn.enabled = bool(value)


SETTINGS: dict[str, RuntimeSetting] = {
    s.name: s
    for s in (
        RuntimeSetting(
            "cudnn_benchmark",
            "torch.backends.cudnn.benchmark: cuDNN times its convolution algorithms for each new "
            "input shape and keeps the fastest (compiled graphs call cuDNN for convolutions too)",
            bool,
            False,
            ("cuda",),
            _cudnn_benchmark_read,
            _cudnn_benchmark_write,
        ),
        RuntimeSetting(
            "cudnn_enabled",
            "torch.backends.cudnn.enabled: false runs every convolution, a compiled graph's too, on "
            "PyTorch's own CUDA kernels instead of cuDNN's; a process then builds no cuDNN plan per "
            "new input shape (cuDNN 9.10 and later may compile a depthwise convolution's kernel at "
            "run time, a cost its first call at each shape pays)",
            bool,
            True,
            ("cuda",),
            _cudnn_enabled_read,
            _cudnn_enabled_write,
        ),
    )
}
"""Every runtime setting a config may name, by name."""


def setting_problems(settings: Any) -> list[tuple[str, str]]:
    """Every problem with a config's `runtime` mapping as (field, message); empty when valid."""
    if not isinstance(settings, Mapping):
        return [("runtime", "runtime must be a mapping of setting -> value, e.g. {cudnn_benchmark: true}")]
    problems = []
    valid = ", ".join(sorted(SETTINGS))
    for name, value in settings.items():
        setting = SETTINGS.get(name) if isinstance(name, str) else None
        if setting is None:
            close = difflib.get_close_matches(str(name), list(SETTINGS), n=2, cutoff=0.6)
            hint = f"; did you mean {' or '.join(repr(c) for c in close)}?" if close else ""
            problems.append((f"runtime.{name}", f"unknown runtime setting {name!r}; valid: {valid}{hint}"))
        elif type(value) is not setting.type:  # bool is an int: compare types exactly
            problems.append(
                (
                    f"runtime.{name}",
                    f"runtime setting {name!r} must be {setting.type.__name__}, got {value!r}",
                )
            )
    return problems


def effective(settings: Mapping[str, Any] | None) -> dict[str, Any]:
    """Every registered setting with the value a config with `settings` runs under."""
    settings = settings or {}
    return {name: settings.get(name, s.default) for name, s in sorted(SETTINGS.items())}


def explicit(settings: Mapping[str, Any] | None) -> dict[str, Any]:
    """The settings that differ from torch's defaults (what a config needs to write down)."""
    return {k: v for k, v in sorted((settings or {}).items()) if k in SETTINGS and v != SETTINGS[k].default}


def to_json(settings: Mapping[str, Any] | None) -> str:
    """The effective settings as the JSON text of a row's `runtime` column."""
    return json.dumps(effective(settings), sort_keys=True)


def from_json(text: str | None) -> dict[str, Any]:
    """A row's `runtime` column back as the explicit settings (rows written before the column
    existed ran under torch's defaults)."""
    return explicit(json.loads(text) if text else {})


def apply(settings: Mapping[str, Any] | None) -> dict[str, Any]:
    """Set every registered setting for `settings` (torch's default where it says nothing);
    return the values the process had before, for `restore`."""
    before = {name: s.read() for name, s in SETTINGS.items()}
    for name, value in effective(settings).items():
        SETTINGS[name].write(value)
    return before


def apply_only(settings: Mapping[str, Any] | None) -> None:
    """Set the settings named in `settings` and leave the others as they are (a serving process:
    `compiler.serving` changes only what a preset names)."""
    for name, value in (settings or {}).items():
        SETTINGS[name].write(value)


def restore(before: Mapping[str, Any]) -> None:
    for name, value in before.items():
        SETTINGS[name].write(value)


def current() -> dict[str, Any]:
    """What this process runs under now."""
    return {name: s.read() for name, s in sorted(SETTINGS.items())}
