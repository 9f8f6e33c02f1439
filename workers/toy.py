"""Toy model factories, and the reference for the ``python:<module>:<function>`` factory contract.

A factory is called as ``fn(batch_size, input_size, overrides)`` and returns ``(module, inputs)``, where
``module(**inputs)`` runs one forward. It must be deterministic: same arguments, same weights and inputs.
Use it in a sweep as ``python:workers.toy:mlp``.
"""

from __future__ import annotations

import torch
from torch import nn

_MLP_DEFAULTS = {"hidden": 256, "out_features": 10}
DEFAULT_INPUT_SIZE = 128


class MLP(nn.Module):
    """Linear-GELU-Linear-GELU-Linear, called as ``model(x=...)``."""

    def __init__(self, in_features: int, hidden: int, out_features: int) -> None:
        super().__init__()
        self.layers = nn.Sequential(
            nn.Linear(in_features, hidden),
            nn.GELU(),
            nn.Linear(hidden, hidden),
            nn.GELU(),
            nn.Linear(hidden, out_features),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x)


def mlp(
    batch_size: int, input_size: int | None = None, overrides: dict | None = None
) -> tuple[MLP, dict[str, torch.Tensor]]:
    """A 3-layer MLP (Linear-GELU-Linear-GELU-Linear) in eval mode and its input ``{"x": [batch, features]}``.

    ``input_size`` is the number of input features (default 128). Overrides: ``hidden`` (width, default
    256) and ``out_features`` (default 10); any other key raises ValueError. Weights are seeded with
    ``torch.manual_seed(0)`` without disturbing the caller's RNG; inputs come from their own generator.
    """
    unknown = sorted(set(overrides or {}) - set(_MLP_DEFAULTS))
    if unknown:
        raise ValueError(f"unknown mlp override(s) {unknown}; valid: {sorted(_MLP_DEFAULTS)}")
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    options = {**_MLP_DEFAULTS, **(overrides or {})}
    features = input_size or DEFAULT_INPUT_SIZE
    hidden = int(options["hidden"])
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = MLP(features, hidden, int(options["out_features"]))
    generator = torch.Generator().manual_seed(0)
    inputs = {"x": torch.randn(batch_size, features, generator=generator)}
    return model.eval(), inputs


def linear(
    batch_size: int, input_size: int | None = None, overrides: dict | None = None
) -> tuple[nn.Module, dict[str, torch.Tensor]]:
    """One ``nn.Linear`` (``input_size`` -> ``out_features``, default 64 -> 32), called as
    ``model(x=...)``: the smallest model max-autotune has a GEMM to tune in. Overrides:
    ``out_features``."""
    unknown = sorted(set(overrides or {}) - {"out_features"})
    if unknown:
        raise ValueError(f"unknown linear override(s) {unknown}; valid: ['out_features']")
    features = input_size or 64
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = _Linear(features, int((overrides or {}).get("out_features", 32)))
    inputs = {"x": torch.randn(batch_size, features, generator=torch.Generator().manual_seed(0))}
    return model.eval(), inputs


class _Linear(nn.Module):
    def __init__(self, in_features: int, out_features: int) -> None:
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x)


def conv_bn(
    batch_size: int, input_size: int | None = None, overrides: dict | None = None
) -> tuple[nn.Module, dict[str, torch.Tensor]]:
    """Conv2d(3x3)-BatchNorm-ReLU-Linear on ``{"x": [batch, 3, size, size]}`` (``input_size``,
    default 8), called as ``model(x=...)``, its BatchNorm's running statistics not the identity, as
    a trained model's: the smallest model whose `freezing` folds weights into new constants.
    Overrides: ``channels`` (default 8), ``seed`` (of the weights, default 0)."""
    options = {"channels": 8, "seed": 0, **(overrides or {})}
    unknown = sorted(set(options) - {"channels", "seed"})
    if unknown:
        raise ValueError(f"unknown conv_bn override(s) {unknown}; valid: ['channels', 'seed']")
    size, channels = input_size or 8, int(options["channels"])
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(int(options["seed"]))
        model = _ConvBN(channels, channels * (size - 2) ** 2)
        with torch.no_grad():
            model.layers[1].running_mean.uniform_(-1, 1)
            model.layers[1].running_var.uniform_(0.5, 2)
    inputs = {"x": torch.randn(batch_size, 3, size, size, generator=torch.Generator().manual_seed(0))}
    return model.eval(), inputs


class _ConvBN(nn.Module):
    def __init__(self, channels: int, flat: int) -> None:
        super().__init__()
        self.layers = nn.Sequential(
            nn.Conv2d(3, channels, 3), nn.BatchNorm2d(channels), nn.ReLU(), nn.Flatten(), nn.Linear(flat, 4)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x)


def batch_centered(
    batch_size: int, input_size: int | None = None, overrides: dict | None = None
) -> tuple[nn.Module, dict[str, torch.Tensor]]:
    """A model whose rows interact: ``x - x.mean(0)`` (each row centred on the batch's mean), then
    one ``nn.Linear`` (``input_size`` -> 16, default 32), called as ``model(x=...)``. Padding its
    batch changes every real row's output: the model a serving plan may not pad
    (`compiler.serving.padding`). No overrides."""
    return _one_linear(_Centered, "batch_centered", batch_size, input_size, overrides)


class _Centered(nn.Module):
    def __init__(self, features: int) -> None:
        super().__init__()
        self.linear = nn.Linear(features, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x - x.mean(0, keepdim=True))


def batch_branching(
    batch_size: int, input_size: int | None = None, overrides: dict | None = None
) -> tuple[nn.Module, dict[str, torch.Tensor]]:
    """A model whose code branches on its batch size: ``nn.Linear`` (``input_size`` -> 16, default
    32), then ``relu`` above a batch of 4 and ``clamp(min=0)`` up to it, the same values either
    way. Its rows are independent, but Dynamo guards its graph on the branch, so marking the batch
    dynamic over a range that spans 4 fails (ConstraintViolationError): the model that can take
    only the buckets plan (DETR's graph specializes its batch size too). Override ``centered``
    (default false): each row centred on the batch's mean first, so its rows interact and it can
    take neither plan."""
    options = {"centered": False, **(overrides or {})}
    if set(options) != {"centered"}:
        raise ValueError(f"unknown batch_branching override(s) {sorted(set(options) - {'centered'})}")
    model, inputs = _one_linear(_Branching, "batch_branching", batch_size, input_size, None)
    model.centered = bool(options["centered"])
    return model, inputs


class _Branching(nn.Module):
    def __init__(self, features: int) -> None:
        super().__init__()
        self.linear = nn.Linear(features, 16)

    centered = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.centered:
            x = x - x.mean(0, keepdim=True)
        if x.shape[0] > 4:
            return self.linear(x).relu()
        return torch.clamp(self.linear(x), min=0)


def checked(
    batch_size: int, input_size: int | None = None, overrides: dict | None = None
) -> tuple[nn.Module, dict[str, torch.Tensor]]:
    """A model that branches in Python on its input's values: ``nn.Linear`` (``input_size`` -> 16,
    default 32) where every input is finite, else a ValueError. Its rows are independent, and
    `torch.compile` serves it (Dynamo breaks the graph at the branch), but `torch.export` cannot
    capture it (a data-dependent branch): the model whose AOTInductor packages fail to build. No
    overrides."""
    return _one_linear(_Checked, "checked", batch_size, input_size, overrides)


def _one_linear(
    cls: type[nn.Module], name: str, batch_size: int, input_size: int | None, overrides: dict | None
) -> tuple[nn.Module, dict[str, torch.Tensor]]:
    """`cls(features)` (one ``nn.Linear`` inside, features = ``input_size`` or 32) seeded with 0
    in eval mode, and its input ``{"x": [batch, features]}``; a factory without overrides."""
    if overrides:
        raise ValueError(f"{name} takes no overrides, got {sorted(overrides)}")
    features = input_size or 32
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = cls(features)
    inputs = {"x": torch.randn(batch_size, features, generator=torch.Generator().manual_seed(0))}
    return model.eval(), inputs


class _Checked(nn.Module):
    def __init__(self, features: int) -> None:
        super().__init__()
        self.linear = nn.Linear(features, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not bool(torch.isfinite(x).all()):
            raise ValueError("non-finite input")
        return self.linear(x)
