"""Hugging Face architectures of the model zoo: how a hub checkpoint is rebuilt from its config with
random weights (``HFModelSpec``), configs with overrides merged in, and the inputs of each kind.

A spec rebuilds the architecture of one hub checkpoint from a hard-coded config, so nothing is
downloaded: the weights are random (seeded), the shapes and the compute are the checkpoint's. The
checkpoints themselves, with their configs, are ``workers.hf_checkpoints``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import torch
import transformers
from transformers import PretrainedConfig

from compiler.job import Task

try:
    from huggingface_hub.errors import StrictDataclassError as _ConfigFieldError  # typed configs (5.x)
except ImportError:  # pragma: no cover - older huggingface_hub
    _ConfigFieldError = TypeError


InputKind = Literal["pixels", "pixels+mask", "pixels+text"]
"""What ``make_inputs`` produces: pixel_values; plus pixel_mask (DETR, MaskFormer families, as their
image processors return it); plus tokenized text queries (OWL-ViT)."""

TEXT_QUERIES_PER_IMAGE = 2
TEXT_QUERY_LENGTH = 16  # OWL-ViT's processor pads queries to max_length=16, its position-table size

# Config keys that describe a saved file, not the architecture: never valid as overrides.
_NOT_OVERRIDABLE = frozenset({"transformers_version", "architectures", "model_type", "dtype"})


@dataclass(frozen=True)
class SubConfig:
    """A nested config (a backbone, an OWL-ViT tower) given as its class and constructor kwargs.

    Kept unbuilt so that an override such as ``{"backbone_config": {"depths": [1, 1, 1, 1]}}``
    can be merged into the kwargs before the nested config is constructed.
    """

    config_class: type[PretrainedConfig]
    kwargs: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class HFModelSpec:
    """One registered hub checkpoint, rebuilt from its config with random weights."""

    model_id: str
    """Zoo id, ``"hf:<hub repo id>"``."""
    task: Task
    image_size: int
    """Default input H=W: the size the checkpoint's image processor produces."""
    model_class: str
    """Name of the transformers class that the checkpoint loads as (``config.architectures[0]``)."""
    config_class: type[PretrainedConfig]
    config_kwargs: Mapping[str, Any]
    description: str
    """Short name for the summary line, e.g. ``"ResNet-50 image classifier"``."""
    params: int
    """Parameter count of the default build, measured with transformers 5.23 (see the summary)."""
    inputs: InputKind = "pixels"
    fixed_image_size: tuple[str, ...] | None = None
    """Config path of the image size that the architecture's position embeddings are built for, e.g.
    ``("image_size",)``; make_inputs then uses that size whatever image_size it is asked for."""

    @property
    def summary(self) -> str:
        return f"{self.description} ({self.params / 1e6:.1f}M params)"

    def config(self, overrides: Mapping[str, Any] | None = None) -> PretrainedConfig:
        return build_config(self.config_class, self.config_kwargs, overrides or {}, self.model_id)

    def build(self, overrides: Mapping[str, Any] | None = None) -> torch.nn.Module:
        """The model in eval mode with seeded random weights; the caller's RNG state is left alone."""
        config = self.config(overrides)
        model_class = getattr(transformers, self.model_class)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            model = model_class(config)
        return model.eval()

    def make_inputs(
        self,
        model: torch.nn.Module,
        batch_size: int,
        image_size: int | None = None,
        generator: torch.Generator | None = None,
    ) -> dict[str, torch.Tensor]:
        """Keyword inputs for ``model(**inputs)``, random but determined by ``generator``."""
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if generator is None:
            generator = torch.Generator().manual_seed(0)
        config = model.config
        size = image_size or self.image_size
        if self.fixed_image_size is not None:
            size = _image_side(_get_path(config, self.fixed_image_size))
        channels = getattr(getattr(config, "vision_config", config), "num_channels", 3)
        inputs = {
            "pixel_values": torch.randn(batch_size, channels, size, size, generator=generator),
        }
        if self.inputs == "pixels+mask":
            inputs["pixel_mask"] = torch.ones(batch_size, size, size, dtype=torch.long)
        elif self.inputs == "pixels+text":
            inputs.update(text_queries(config.text_config, batch_size, generator))
        return inputs


def text_queries(
    text_config: PretrainedConfig, batch_size: int, generator: torch.Generator
) -> dict[str, torch.Tensor]:
    """CLIP-tokenizer-shaped queries: ``[bos, tokens..., eos, pad...]``, TEXT_QUERIES_PER_IMAGE per image.

    OWL-ViT pools each query at its highest token id, so eos must be the largest id: like CLIP's
    tokenizer, bos and eos are the last two ids of the vocabulary, and padding is id 0.
    """
    vocab = text_config.vocab_size
    length = min(TEXT_QUERY_LENGTH, text_config.max_position_embeddings)
    if vocab < 4 or length < 3:
        raise ValueError(f"text config too small for queries: vocab_size={vocab}, length={length}")
    rows = batch_size * TEXT_QUERIES_PER_IMAGE
    lengths = torch.randint(3, length + 1, (rows,), generator=generator)
    tokens = torch.randint(1, vocab - 2, (rows, length), generator=generator)
    positions = torch.arange(length).expand(rows, length)
    attention_mask = (positions < lengths[:, None]).long()
    input_ids = torch.where(attention_mask.bool(), tokens, torch.zeros_like(tokens))
    input_ids[:, 0] = vocab - 2
    input_ids[torch.arange(rows), lengths - 1] = vocab - 1
    return {"input_ids": input_ids, "attention_mask": attention_mask}


# ---------------------------------------------------------------------------------------------------------
# Configs and overrides


def build_config(
    config_class: type[PretrainedConfig],
    base_kwargs: Mapping[str, Any],
    overrides: Mapping[str, Any],
    where: str,
) -> PretrainedConfig:
    """``config_class(**base_kwargs)`` with ``overrides`` merged in; unknown names raise ValueError.

    An override whose base value is a SubConfig may be a dict: it is merged into that sub-config
    (recursively, with the same checks). Aliases (``hidden_size`` for DETR's ``d_model``) are accepted.
    """
    base = _construct(config_class, base_kwargs)
    if not overrides:
        return base
    valid = valid_config_attributes(base)
    unknown = sorted(str(key) for key in overrides if key not in valid)
    if unknown:
        raise ValueError(
            f"unknown config attribute(s) {unknown} for {where} ({config_class.__name__}); "
            f"valid attributes: {sorted(valid)}"
        )
    kwargs = dict(base_kwargs)
    for key, value in overrides.items():
        name = config_class.attribute_map.get(key, key)
        current = kwargs.get(name)
        if isinstance(value, Mapping) and isinstance(current, SubConfig):
            nested = f"{where}.{name}"
            build_config(current.config_class, current.kwargs, value, nested)  # validates
            value = SubConfig(current.config_class, {**current.kwargs, **value})
        elif isinstance(value, Mapping) and isinstance(getattr(base, name, None), PretrainedConfig):
            raise ValueError(
                f"{where}: {name!r} has no base sub-config to merge into; pass a config object instead"
            )
        kwargs[name] = value
    try:
        return _construct(config_class, kwargs)
    except (TypeError, ValueError, _ConfigFieldError) as error:
        raise ValueError(f"invalid overrides {dict(overrides)} for {where}: {error}") from error


def valid_config_attributes(config: PretrainedConfig) -> set[str]:
    """The names an override may set on ``config``: its fields, aliases, serialized keys and num_labels."""
    names = {f.name for f in dataclasses.fields(config)} if dataclasses.is_dataclass(config) else set()
    names |= set(config.to_dict())
    names |= set(type(config).attribute_map)
    names.add("num_labels")
    return {n for n in names if not n.startswith("_") and n not in _NOT_OVERRIDABLE}


def _construct(config_class: type[PretrainedConfig], kwargs: Mapping[str, Any]) -> PretrainedConfig:
    built = {
        key: _construct(value.config_class, value.kwargs) if isinstance(value, SubConfig) else value
        for key, value in kwargs.items()
    }
    return config_class(**built)


def _get_path(config: PretrainedConfig, path: tuple[str, ...]) -> Any:
    value: Any = config
    for name in path:
        value = getattr(value, name)
    return value


def _image_side(size: int | list[int] | tuple[int, ...]) -> int:
    if isinstance(size, int):
        return size
    height, width = size
    if height != width:
        raise ValueError(f"non-square config image_size {size} is not supported")
    return int(height)
