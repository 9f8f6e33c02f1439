"""The checkpoints of the Hugging Face torch.compile vision benchmark: the seed models of the zoo,
each an ``HFModelSpec`` (``workers.hf_models``) with the config of its hub checkpoint.

The config values are those of the checkpoint's ``config.json`` (and of the conversion scripts in
transformers that produced it). Backbones are always transformers-native (``ResNetConfig``,
``SwinConfig``): timm is not a dependency.
"""

from __future__ import annotations

from typing import Any

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
    ResNetConfig,
    SegformerConfig,
    SwinConfig,
    ViTConfig,
)

from workers.hf_models import HFModelSpec, SubConfig

try:  # transformers >= 5 gives MaskFormer's decoder a config class of its own
    from transformers.models.maskformer.configuration_maskformer import MaskFormerDetrConfig
except ImportError:  # pragma: no cover - transformers 4.x
    MaskFormerDetrConfig = DetrConfig


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
