"""Hugging Face architectures of the model zoo: checkpoint-matching configs, random-weight builds, inputs.

Every spec here rebuilds the architecture of one hub checkpoint from a hard-coded config, so nothing is
downloaded: the weights are random (seeded), the shapes and the compute are the checkpoint's.
The config values are those of the checkpoint's ``config.json`` (and of the conversion scripts in
transformers that produced it). Backbones are always transformers-native (``ResNetConfig``,
``SwinConfig``): timm is not a dependency.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import torch
import transformers
from transformers import (
    BeitConfig,
    ConditionalDetrConfig,
    ConvNextConfig,
    DetrConfig,
    Mask2FormerConfig,
    MaskFormerConfig,
    MobileNetV2Config,
    OwlViTConfig,
    OwlViTTextConfig,
    OwlViTVisionConfig,
    PretrainedConfig,
    ResNetConfig,
    SegformerConfig,
    SwinConfig,
    ViTConfig,
)

from compiler.job import Task

try:  # transformers >= 5 gives MaskFormer's decoder a config class of its own
    from transformers.models.maskformer.configuration_maskformer import MaskFormerDetrConfig
except ImportError:  # pragma: no cover - transformers 4.x
    MaskFormerDetrConfig = DetrConfig

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


# ---------------------------------------------------------------------------------------------------------
# The checkpoints of the Hugging Face torch.compile vision benchmark


def _resnet_backbone(depths: list[int]) -> SubConfig:
    # DETR's timm resnet (stride in the 3x3 conv) is ResNetConfig's default bottleneck layout.
    return SubConfig(
        ResNetConfig,
        {
            "embedding_size": 64,
            "hidden_sizes": [256, 512, 1024, 2048],
            "depths": depths,
            "layer_type": "bottleneck",
            "hidden_act": "relu",
            "out_features": ["stage4"],  # object detection uses the last feature map only
        },
    )


def _swin_backbone(embed_dim: int, depths: list[int], heads: list[int], window: int, image: int) -> SubConfig:
    return SubConfig(
        SwinConfig,
        {
            "image_size": image,
            "embed_dim": embed_dim,
            "depths": depths,
            "num_heads": heads,
            "window_size": window,
            "drop_path_rate": 0.3,
            "out_features": ["stage1", "stage2", "stage3", "stage4"],
        },
    )


def _detr_kwargs(backbone_depths: list[int], num_queries: int) -> dict[str, Any]:
    return {
        "backbone_config": _resnet_backbone(backbone_depths),
        "num_queries": num_queries,
        "d_model": 256,
        "encoder_layers": 6,
        "decoder_layers": 6,
        "encoder_ffn_dim": 2048,
        "decoder_ffn_dim": 2048,
        "encoder_attention_heads": 8,
        "decoder_attention_heads": 8,
        "num_labels": 91,  # COCO detection ids 0..90, "N/A" gaps included; the head adds "no object"
        # transformers 4.x needs these two to take backbone_config (else it builds a timm resnet);
        # 5.x ignores them once backbone_config is given. Random backbone weights either way.
        "use_timm_backbone": False,
        "use_pretrained_backbone": False,
    }


SPECS: tuple[HFModelSpec, ...] = (
    HFModelSpec(
        model_id="hf:google/vit-base-patch16-224",
        task="image-classification",
        image_size=224,
        model_class="ViTForImageClassification",
        config_class=ViTConfig,
        config_kwargs={
            "hidden_size": 768,
            "num_hidden_layers": 12,
            "num_attention_heads": 12,
            "intermediate_size": 3072,
            "image_size": 224,
            "patch_size": 16,
            "qkv_bias": True,
            "num_labels": 1000,
        },
        description="ViT-base/16 image classifier",
        params=86_567_656,
        fixed_image_size=("image_size",),
    ),
    HFModelSpec(
        model_id="hf:microsoft/beit-base-patch16-224-pt22k-ft22k",
        task="image-classification",
        image_size=224,
        model_class="BeitForImageClassification",
        config_class=BeitConfig,
        config_kwargs={
            "hidden_size": 768,
            "num_hidden_layers": 12,
            "num_attention_heads": 12,
            "intermediate_size": 3072,
            "image_size": 224,
            "patch_size": 16,
            "use_absolute_position_embeddings": False,
            "use_relative_position_bias": True,
            "use_shared_relative_position_bias": False,
            "use_mask_token": False,
            "use_mean_pooling": True,
            "layer_scale_init_value": 0.1,
            "num_labels": 21841,
        },
        description="BEiT-base/16 ImageNet-22k image classifier",
        params=102_557_713,
        fixed_image_size=("image_size",),
    ),
    HFModelSpec(
        model_id="hf:facebook/convnext-large-224",
        task="image-classification",
        image_size=224,
        model_class="ConvNextForImageClassification",
        config_class=ConvNextConfig,
        config_kwargs={
            "depths": [3, 3, 27, 3],
            "hidden_sizes": [192, 384, 768, 1536],
            "layer_scale_init_value": 1e-6,
            "num_labels": 1000,
        },
        description="ConvNeXt-large image classifier",
        params=197_767_336,
    ),
    HFModelSpec(
        model_id="hf:microsoft/resnet-50",
        task="image-classification",
        image_size=224,
        model_class="ResNetForImageClassification",
        config_class=ResNetConfig,
        config_kwargs={
            "embedding_size": 64,
            "hidden_sizes": [256, 512, 1024, 2048],
            "depths": [3, 4, 6, 3],
            "layer_type": "bottleneck",
            "hidden_act": "relu",
            "downsample_in_first_stage": False,
            "num_labels": 1000,
        },
        description="ResNet-50 image classifier",
        params=25_557_032,
    ),
    HFModelSpec(
        model_id="hf:nvidia/segformer-b0-finetuned-ade-512-512",
        task="image-segmentation",
        image_size=512,
        model_class="SegformerForSemanticSegmentation",
        config_class=SegformerConfig,
        config_kwargs={
            "depths": [2, 2, 2, 2],
            "hidden_sizes": [32, 64, 160, 256],
            "num_attention_heads": [1, 2, 5, 8],
            "sr_ratios": [8, 4, 2, 1],
            "decoder_hidden_size": 256,
            "num_labels": 150,
        },
        description="SegFormer-B0 ADE20k semantic segmenter",
        params=3_752_694,
    ),
    HFModelSpec(
        model_id="hf:facebook/mask2former-swin-tiny-coco-panoptic",
        task="image-segmentation",
        image_size=384,
        model_class="Mask2FormerForUniversalSegmentation",
        config_class=Mask2FormerConfig,
        config_kwargs={
            "backbone_config": _swin_backbone(96, [2, 2, 6, 2], [3, 6, 12, 24], window=7, image=224),
            "num_queries": 100,
            "num_labels": 133,
        },
        description="Mask2Former Swin-tiny COCO panoptic segmenter",
        params=47_436_800,
        inputs="pixels+mask",
    ),
    HFModelSpec(
        model_id="hf:facebook/maskformer-swin-base-ade",
        task="image-segmentation",
        image_size=512,
        model_class="MaskFormerForInstanceSegmentation",
        config_class=MaskFormerConfig,
        config_kwargs={
            "backbone_config": _swin_backbone(128, [2, 2, 18, 2], [4, 8, 16, 32], window=12, image=384),
            "decoder_config": SubConfig(MaskFormerDetrConfig, {"num_queries": 100, "decoder_layers": 6}),
            "num_labels": 150,
        },
        description="MaskFormer Swin-base ADE20k segmenter",
        params=101_831_439,
        inputs="pixels+mask",
    ),
    HFModelSpec(
        model_id="hf:google/deeplabv3_mobilenet_v2_1.0_513",
        task="image-segmentation",
        image_size=513,
        model_class="MobileNetV2ForSemanticSegmentation",
        config_class=MobileNetV2Config,
        config_kwargs={
            "depth_multiplier": 1.0,
            "image_size": 513,
            "output_stride": 8,
            "layer_norm_eps": 0.001,
            "num_labels": 21,
        },
        description="DeepLabV3 MobileNetV2 PASCAL VOC segmenter",
        params=2_525_717,
    ),
    HFModelSpec(
        model_id="hf:google/owlvit-base-patch32",
        task="zero-shot-object-detection",
        image_size=768,
        model_class="OwlViTForObjectDetection",
        config_class=OwlViTConfig,
        config_kwargs={
            "text_config": SubConfig(OwlViTTextConfig, {}),
            "vision_config": SubConfig(OwlViTVisionConfig, {"image_size": 768, "patch_size": 32}),
            "projection_dim": 512,
        },
        description="OWL-ViT B/32 open-vocabulary detector",
        params=153_231_879,
        inputs="pixels+text",
        fixed_image_size=("vision_config", "image_size"),
    ),
    HFModelSpec(
        model_id="hf:facebook/detr-resnet-50",
        task="object-detection",
        image_size=800,
        model_class="DetrForObjectDetection",
        config_class=DetrConfig,
        config_kwargs=_detr_kwargs([3, 4, 6, 3], num_queries=100),
        description="DETR ResNet-50 COCO detector",
        params=41_524_768,
        inputs="pixels+mask",
    ),
    HFModelSpec(
        model_id="hf:facebook/detr-resnet-101",
        task="object-detection",
        image_size=800,
        model_class="DetrForObjectDetection",
        config_class=DetrConfig,
        config_kwargs=_detr_kwargs([3, 4, 23, 3], num_queries=100),
        description="DETR ResNet-101 COCO detector",
        params=60_464_672,
        inputs="pixels+mask",
    ),
    HFModelSpec(
        model_id="hf:microsoft/conditional-detr-resnet-50",
        task="object-detection",
        image_size=800,
        model_class="ConditionalDetrForObjectDetection",
        config_class=ConditionalDetrConfig,
        config_kwargs=_detr_kwargs([3, 4, 6, 3], num_queries=300),
        description="Conditional DETR ResNet-50 COCO detector",
        params=43_418_401,
        inputs="pixels+mask",
    ),
)
