"""`CompileConfig`: one named set of `torch.compile` arguments, and its validation."""

from __future__ import annotations

import difflib
from dataclasses import asdict, dataclass, field
from functools import lru_cache
from typing import Any

from compiler.runtime import setting_problems

# Reserved: eager is always measured as the baseline of every job, and names a preset that says
# not to compile (`is_eager_preset`).
EAGER = "eager"

# Cold compile budgets in seconds, per mode. A cold max-autotune ResNet-50 cell (batch 1, fp32,
# torch 2.11) took over 8 minutes on an H100 with 16 cores, so autotuning modes get far more time.
DEFAULT_TIMEOUT_BY_MODE: dict[str | None, float] = {
    None: 900.0,
    "default": 900.0,
    "reduce-overhead": 900.0,
    "max-autotune-no-cudagraphs": 2400.0,
    "max-autotune": 2400.0,
}


def is_eager_preset(entry: Any) -> bool:
    """Whether a preset entry (of `presets.json`) says not to compile: `config` "eager" and
    `compile` null. Its runtime settings are then its own `runtime` (there is no `compile` to
    hold them): the settings eager was timed under beside the compiled config it beat."""
    return (
        isinstance(entry, dict)
        and entry.get("config") == EAGER
        and "compile" in entry
        and entry["compile"] is None
    )


def preset_runtime(entry: dict[str, Any]) -> dict[str, Any]:
    """The runtime settings a preset entry runs under: an eager preset's `runtime`, else its
    `compile`'s."""
    where = entry if is_eager_preset(entry) else (entry.get("compile") or {})
    return dict(where.get("runtime") or {})


@dataclass(frozen=True)
class CompileConfig:
    """A named set of `torch.compile` arguments, as written in a sweep file's `configs:`."""

    name: str
    """Name of the config in the sweep (a column of every result row)."""
    mode: str | None = None
    """`torch.compile(mode=...)`: one of `torch._inductor.list_mode_options()`, or None."""
    fullgraph: bool = False
    """Fail on any graph break instead of splitting the graph."""
    dynamic: bool | None = None
    """`torch.compile(dynamic=...)`: None lets Dynamo decide after a shape change."""
    backend: str = "inductor"
    """`torch.compile(backend=...)`: a name from `torch._dynamo.list_backends()`."""
    options: dict[str, Any] = field(default_factory=dict)
    """Inductor options (names from `torch._inductor.list_options()`); exclusive with `mode`."""
    freezing: bool = False
    """Fold the weights into the graph as constants (`torch._inductor.config.freezing`), for
    inference. A process-wide Inductor setting, not a `torch.compile` option: passed in
    `options` it is silently ignored, so it has a field of its own. On CPU it enables Inductor's
    C++ GEMM templates, which max-autotune then benchmarks against the MKL/oneDNN kernels."""
    channels_last: bool = False
    """Convert the model's 4-D weights to channels-last memory format before compiling (a layout
    choice for conv nets; the inputs keep the layout the caller gives them)."""
    runtime: dict[str, Any] = field(default_factory=dict)
    """Process-wide runtime settings (`compiler.runtime.SETTINGS`, e.g. `cudnn_benchmark`), set
    before the model is built so eager and compiled run under them alike; a setting not named
    keeps torch's default."""
    timeout_s: float | None = None
    """Per-job wall-time limit for this config; None takes the sweep's, else the mode default."""

    def compile_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for `torch.compile`."""
        kwargs: dict[str, Any] = {
            "backend": self.backend,
            "fullgraph": self.fullgraph,
            "dynamic": self.dynamic,
        }
        if self.mode is not None:
            kwargs["mode"] = self.mode
        if self.options:
            kwargs["options"] = dict(self.options)
        return kwargs

    def apply_globals(self) -> None:
        """Set the process-wide Inductor settings of this config (a job process compiles one
        config, so they stay set for its recompiles too)."""
        import torch._inductor.config as inductor_config

        inductor_config.freezing = self.freezing

    def apply_runtime(self) -> dict[str, Any]:
        """Set this config's runtime settings in this process (torch's defaults for the others);
        returns the previous values (`compiler.runtime.restore`)."""
        from compiler import runtime

        return runtime.apply(self.runtime)

    def prepare_model(self, model):
        """The model as this config compiles it: in channels-last layout if asked (in place, as
        `nn.Module.to` works), else unchanged."""
        if self.channels_last:
            import torch

            model = model.to(memory_format=torch.channels_last)
        return model

    def effective_timeout(self, sweep_default: float | None) -> float:
        if self.timeout_s is not None:
            return float(self.timeout_s)
        if sweep_default is not None:
            return float(sweep_default)
        return DEFAULT_TIMEOUT_BY_MODE.get(self.mode, DEFAULT_TIMEOUT_BY_MODE[None])

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CompileConfig:
        return cls(**data)


@lru_cache(maxsize=1)
def inductor_modes() -> dict[str, dict[str, Any]]:
    import torch._inductor

    return torch._inductor.list_mode_options()


@lru_cache(maxsize=1)
def inductor_option_names() -> frozenset[str]:
    import torch._inductor

    return frozenset(torch._inductor.list_options())


@lru_cache(maxsize=1)
def inductor_option_defaults() -> dict[str, Any]:
    import torch._inductor.config as inductor_config

    return inductor_config.get_config_copy()


AUTOTUNE_BACKENDS = frozenset({"ATEN", "TRITON", "CPP", "CUTLASS", "CK", "CKTILE", "CUTEDSL", "NVGEMM"})
"""The backend names torch 2.11-2.13's Inductor looks for in `max_autotune_*_backends`."""
AT_LEAST_ONE = frozenset({"compile_threads"})


def option_value_problem(name: str, value: Any, default: Any) -> str | None:
    """Why `value` cannot be Inductor option `name` (whose default is `default`), or None: the
    default's type (bool, int, float, str, list), a finite number, a known autotune backend."""
    import math

    def kind(v: Any) -> str:
        return type(v).__name__

    if default is None:
        return None  # an optional setting: its type is not known from the default
    if isinstance(default, bool):
        ok = isinstance(value, bool)
    elif isinstance(default, int):
        ok = isinstance(value, int) and not isinstance(value, bool)
    elif isinstance(default, float):
        ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
    elif isinstance(default, str):
        ok = isinstance(value, str)
    elif isinstance(default, list | tuple):
        ok = isinstance(value, list | tuple)
    elif isinstance(default, dict):
        ok = isinstance(value, dict)
    else:
        return None
    if not ok:
        article = "an" if kind(default)[0] in "aeiou" else "a"
        return f"option {name!r} takes {article} {kind(default)} (its default is {default!r}), not {kind(value)} {value!r}"
    if name in AT_LEAST_ONE and value < 1:
        return f"option {name!r} must be at least 1, got {value!r}"
    if name.startswith("max_autotune_") and name.endswith("_backends"):
        given = [b.strip().upper() for b in value.split(",") if b.strip()]
        unknown = [b for b in given if b not in AUTOTUNE_BACKENDS]
        if not given or unknown:
            return (
                f"option {name!r} is a comma-separated list of {', '.join(sorted(AUTOTUNE_BACKENDS))}; "
                f"got {value!r}"
            )
    return None


@lru_cache(maxsize=1)
def backend_names() -> frozenset[str]:
    import torch._dynamo

    return frozenset(torch._dynamo.list_backends(exclude_tags=()))


def _did_you_mean(word: str, choices: list[str]) -> str:
    close = difflib.get_close_matches(word, choices, n=3, cutoff=0.6)
    return f"; did you mean {' or '.join(repr(c) for c in close)}?" if close else ""


# Inductor settings that torch.compile(options=...) accepts and then ignores.
GLOBAL_ONLY_OPTIONS = {
    "freezing": "`freezing` in options has no effect (torch.compile ignores it; Inductor reads the "
    "process-wide setting): write `freezing: true` beside `options` in the config instead",
}


def config_problems(cfg: CompileConfig) -> list[tuple[str, str]]:
    """Every problem with `cfg` as (field, message); empty when the config is valid."""
    problems: list[tuple[str, str]] = []
    if cfg.name == EAGER:
        problems.append(
            ("name", f"config name {EAGER!r} is reserved: eager is always measured as the baseline")
        )
    modes = inductor_modes() if cfg.mode is not None else {}  # each list imports Inductor (2 s)
    if cfg.mode is not None and cfg.mode not in modes:
        problems.append(
            (
                "mode",
                f"unknown mode {cfg.mode!r}; valid modes: {', '.join(sorted(modes))}"
                + _did_you_mean(cfg.mode, list(modes)),
            )
        )
    if cfg.mode is not None and cfg.options:
        problems.append(
            (
                "options",
                "`mode` and `options` cannot be combined (torch.compile raises); drop `mode` and put "
                f"its settings into options instead (mode {cfg.mode!r} sets {modes.get(cfg.mode) or 'nothing'})",
            )
        )
    if cfg.backend != "inductor" and cfg.backend not in backend_names():
        problems.append(
            (
                "backend",
                f"unknown backend {cfg.backend!r}; valid: {', '.join(sorted(backend_names()))}"
                + _did_you_mean(cfg.backend, sorted(backend_names())),
            )
        )
    if cfg.backend != "inductor" and (cfg.mode not in (None, "default") or cfg.options or cfg.freezing):
        problems.append(
            ("backend", f"mode, options and freezing apply to the inductor backend only, not {cfg.backend!r}")
        )
    names = inductor_option_names() if cfg.options else frozenset()
    for opt in cfg.options:
        if opt in GLOBAL_ONLY_OPTIONS:
            problems.append((f"options.{opt}", GLOBAL_ONLY_OPTIONS[opt]))
        elif opt not in names:
            problems.append(
                (
                    f"options.{opt}",
                    f"unknown Inductor option {opt!r} (see torch._inductor.list_options())"
                    + _did_you_mean(opt, sorted(names)),
                )
            )
    defaults = inductor_option_defaults() if cfg.options else {}
    for opt, value in cfg.options.items():
        if opt in names and opt not in GLOBAL_ONLY_OPTIONS:
            wrong = option_value_problem(opt, value, defaults.get(opt))
            if wrong:
                problems.append((f"options.{opt}", wrong))
    problems += setting_problems(cfg.runtime)
    if cfg.timeout_s is not None and not cfg.timeout_s > 0:
        problems.append(("timeout_s", f"timeout_s must be positive, got {cfg.timeout_s!r}"))
    return problems
