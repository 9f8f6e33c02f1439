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
