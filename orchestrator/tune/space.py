"""What `orchestrate tune` searches: the sweep's stock configs and torch's deep-autotuning modes
(the bases) under every precision policy the accuracy budgets let the class search, each base with
one knob turned. The search measures the bases first and turns the knobs on the best of them
(`orchestrator.tune.search`); `candidates` is the whole space it draws from.

A stock config with a `mode` is written out as the Inductor options the mode stands for
(`torch._inductor.list_mode_options()`), so a knob can be added to it (`torch.compile` refuses
`mode` and `options` together). A knob that would not change anything (already set by the mode,
a GPU-only knob on CPU, a layout change for a model without 4-D weights) is not a candidate.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from dataclasses import dataclass, field

from compiler.capabilities import Capabilities, cell_support
from compiler.config import CompileConfig, inductor_modes
from compiler.job import ModelSpec


@dataclass(frozen=True)
class Knob:
    name: str
    help: str
    options: dict
    """Inductor options the knob sets (on top of the base's)."""
    devices: tuple[str, ...] = ("cpu", "cuda")
    freezing: bool = False
    channels_last: bool = False
    runtime: dict = field(default_factory=dict)
    """Runtime settings the knob sets (`compiler.runtime`), e.g. cuDNN's algorithm search."""
    needs: Callable[[dict], bool] | None = None
    """Only for bases whose options pass this test (e.g. GEMM backends need max_autotune)."""


KNOBS: tuple[Knob, ...] = (
    Knob("freezing", "fold the weights into the graph as constants", {}, freezing=True),
    Knob(
        "channels_last",
        "the model's 4-D weights in channels-last layout (image models)",
        {},
        channels_last=True,
    ),
    Knob(
        "coordinate_descent",
        "coordinate-descent tuning of every Triton kernel's block sizes",
        {"coordinate_descent_tuning": True},
        devices=("cuda",),
    ),
    Knob("no_epilogue_fusion", "keep pointwise epilogues out of GEMM kernels", {"epilogue_fusion": False}),
    Knob("no_shape_padding", "no padding of GEMM shapes to aligned sizes", {"shape_padding": False}),
    Knob("aggressive_fusion", "fuse nodes even without shared memory reads", {"aggressive_fusion": True}),
    Knob(
        "cudagraphs", "CUDA graphs around the compiled graph", {"triton.cudagraphs": True}, devices=("cuda",)
    ),
    Knob(
        "cudagraphs_no_trees",
        "CUDA graphs without cudagraph trees (one graph and memory pool per compiled graph, torch's older "
        "path): for models where reduce-overhead's trees fail ('storage data ptrs are not allocated in "
        "pool'); it did not help BEiT with torch 2.11, which fails to capture this way too (a CPU tensor "
        "copied in the graph)",
        {"triton.cudagraphs": True, "triton.cudagraph_trees": False},
        devices=("cuda",),
    ),
    Knob(
        "cudnn_benchmark",
        "cuDNN times its convolution algorithms per shape and keeps the fastest (a runtime setting)",
        {},
        devices=("cuda",),
        runtime={"cudnn_benchmark": True},
    ),
    Knob(
        "conv_triton",
        "max-autotune convolutions from Triton templates only (no cuDNN candidates)",
        {"max_autotune_conv_backends": "TRITON"},
        devices=("cuda",),
        needs=lambda options: bool(options.get("max_autotune")),
    ),
    Knob(
        "conv_aten",
        "max-autotune leaves convolutions to cuDNN (no Triton conv templates: a shorter autotune)",
        {"max_autotune_conv_backends": "ATEN"},
        devices=("cuda",),
        needs=lambda options: bool(options.get("max_autotune")),
    ),
    Knob(
        "gemm_triton",
        "max-autotune GEMMs from Triton templates only (no cuBLAS candidates)",
        {"max_autotune_gemm_backends": "TRITON"},
        devices=("cuda",),
        needs=lambda options: bool(options.get("max_autotune")),
    ),
)
KNOB_NAMES: tuple[str, ...] = tuple(k.name for k in KNOBS)
KNOBS_BY_NAME: dict[str, Knob] = {k.name: k for k in KNOBS}
BASE_MODES: tuple[str, ...] = ("max-autotune", "max-autotune-no-cudagraphs")
"""Torch's deep-autotuning modes, which the tuner adds as bases (candidates, with knobs of their
own) where the sweep's stock configs do not already cover them."""

IMAGE_MODEL_PREFIXES = ("hf:", "timm:", "torchvision:")


@dataclass(frozen=True)
class Candidate:
    config: CompileConfig
    dtype: str
    """Its precision policy."""
    stock: bool
    """One of the sweep's own configs at the cell's precision (what a tuned winner must beat)."""
    turned: tuple[str, ...] = ()
    """The knobs turned on its base (`KNOBS` names, in order); empty for a base."""
    base_name: str | None = None
    """The config name of its base, for a candidate with knobs turned."""

    @property
    def key(self) -> tuple[str, str]:
        return self.config.name, self.dtype

    def __hash__(self) -> int:  # the config's options are a dict; name and precision identify it in a cell
        return hash(self.key)


def expanded_options(cfg: CompileConfig) -> dict:
    """The Inductor options `cfg` compiles with, its mode written out."""
    options = dict(inductor_modes().get(cfg.mode or "default", {})) if cfg.mode else {}
    options.update(cfg.options)
    return options


def _with_knob(base: CompileConfig, knob: Knob) -> CompileConfig | None:
    options = expanded_options(base)
    if knob.needs and not knob.needs(options):
        return None
    if all(options.get(k) == v for k, v in knob.options.items()) and knob.options:
        return None  # the base sets it already
    if (knob.freezing and base.freezing) or (knob.channels_last and base.channels_last):
        return None
    if knob.runtime and all(base.runtime.get(k) == v for k, v in knob.runtime.items()):
        return None
    runtime_only = not (knob.options or knob.freezing or knob.channels_last)
    return dataclasses.replace(
        base,
        name=f"{base.name}+{knob.name}",
        # a knob that sets only runtime settings keeps the base's mode: nothing to merge into options
        mode=base.mode if runtime_only else None,
        options=dict(base.options) if runtime_only else {**options, **knob.options},
        freezing=base.freezing or knob.freezing,
        channels_last=base.channels_last or knob.channels_last,
        runtime={**base.runtime, **knob.runtime},
    )


def with_knobs(base: CompileConfig, names: list[str]) -> CompileConfig | None:
    """`base` with every knob of `names` turned (in that order), or None if one of them changes
    nothing there (the base sets it already, or it needs a base option that is missing)."""
    cfg = base
    for name in names:
        cfg = _with_knob(cfg, KNOBS_BY_NAME[name])
        if cfg is None:
            return None
    return cfg


def settings(cfg: CompileConfig) -> str:
    """Everything a config compiles and runs with, as one comparable text (names aside)."""
    return json.dumps(
        [
            cfg.backend,
            cfg.fullgraph,
            cfg.dynamic,
            expanded_options(cfg),
            cfg.freezing,
            cfg.channels_last,
            cfg.runtime,
        ],
        sort_keys=True,
        default=str,
    )


def extra_bases(stock: tuple[CompileConfig, ...], modes: tuple[str, ...]) -> list[CompileConfig]:
    """Configs for the torch modes in `modes` that no inductor stock config compiles with already."""
    have = [
        expanded_options(c) for c in stock if c.backend == "inductor" and not c.freezing and not c.runtime
    ]
    found = []
    for mode in modes:
        cfg = CompileConfig(name=mode, mode=mode)
        if expanded_options(cfg) not in have and mode not in {c.name for c in stock}:
            found.append(cfg)
    return found


def candidates(
    stock: tuple[CompileConfig, ...],
    model: ModelSpec,
    device: str,
    dtype: str,
    precisions: tuple[str, ...] = (),
    knobs: tuple[str, ...] = KNOB_NAMES,
    bases: tuple[str, ...] = (),
    capabilities: Capabilities | None = None,
) -> list[Candidate]:
    """Every candidate of one cell: the bases (the stock configs, and torch's modes of `bases` the
    sweep lacks) under the cell's precision `dtype` and each other policy of `precisions`, and each
    inductor base with each applicable knob, in its base's policy. Only the stock configs in the
    cell's own precision are `stock` (what a stock user runs). With the class's `capabilities`, no
    candidate it cannot run is proposed (`compiler.capabilities.cell_support`); the stock configs
    stay, as the sweep's own (a sweep writes them as `unsupported` rows)."""
    found: list[Candidate] = []
    added = extra_bases(stock, bases)
    image = model.id.startswith(IMAGE_MODEL_PREFIXES)
    for policy in (dtype, *(p for p in precisions if p != dtype)):
        found += [Candidate(cfg, policy, policy == dtype) for cfg in stock]
        found += [Candidate(cfg, policy, False) for cfg in added]
        names = {cfg.name for cfg in (*stock, *added)}
        seen = {settings(cfg) for cfg in (*stock, *added)}  # e.g. max-autotune-no-cudagraphs+cudagraphs
        for base in (*stock, *added):
            if base.backend != "inductor":
                continue
            for knob in KNOBS:
                if knob.name not in knobs or device not in knob.devices or (knob.channels_last and not image):
                    continue
                cfg = _with_knob(base, knob)
                if cfg is not None and cfg.name not in names and settings(cfg) not in seen:
                    names.add(cfg.name)
                    seen.add(settings(cfg))
                    found.append(Candidate(cfg, policy, False, (knob.name,), base.name))
    if capabilities is None:
        return found
    return [c for c in found if c.stock or cell_support(capabilities, c.dtype, c.config)[0] is None]


def is_base(cand: Candidate) -> bool:
    """A base of the search (a stock config or an added mode, in any policy): no knob turned."""
    return not cand.turned


def knobs_on(cands: list[Candidate], base: Candidate) -> list[Candidate]:
    """The candidates of `cands` that are `base` with one knob turned, in its policy."""
    return [
        c for c in cands if c.dtype == base.dtype and len(c.turned) == 1 and c.base_name == base.config.name
    ]
