"""The model zoo: which models a job may name, and how to build them and their inputs.

Three kinds of model id:

- ``"hf:<hub repo id>"``: a registered Hugging Face checkpoint (the eleven models of the Hugging Face
  torch.compile vision benchmark). The architecture is rebuilt from a hard-coded, checkpoint-matching
  config with seeded random weights, so nothing is downloaded; see ``workers/hf_models.py`` (the
  checkpoints' configs: ``workers/hf_checkpoints.py``).
  ``load_pretrained`` loads the real weights instead when they exist locally.
- ``"timm:<name>"`` / ``"torchvision:<name>"``: see ``workers/external.py``.
- ``"python:<dotted.module>:<function>"``: a user factory, ``fn(batch_size, input_size, overrides) ->
  (module, inputs_dict)`` (see ``workers/toy.py``). Only its shape is checked here; it is imported by
  ``load_python_factory`` in the job's own process.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import importlib
import keyword
import sys
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, TypeVar

import torch

from compiler.job import Task

if TYPE_CHECKING:
    from workers.hf_models import HFModelSpec

# transformers, workers.hf_models and workers.hf_checkpoints (about 2 s of imports on a 2-core
# machine) load on first use of an hf: id, so a process that only runs python:, timm: or
# torchvision: models never pays them.

__all__ = [
    "SMALL_IMAGE_SIZE",
    "SMALL_OVERRIDES",
    "ModelEntry",
    "Registry",
    "Task",
    "UnknownModelError",
    "build_default_registry",
    "get_entry",
    "is_known",
    "known_model_ids",
    "load_pretrained",
    "load_python_factory",
    "output_tensors",
]


@dataclass(frozen=True)
class ModelEntry:
    """One registered model: metadata plus how to build it and its inputs."""

    id: str
    """Zoo id, e.g. ``"hf:microsoft/resnet-50"``."""
    task: Task
    """Task of the hub checkpoint."""
    image_size: int
    """Default input H=W: the image size the checkpoint's image processor produces."""
    summary: str
    """One line, with the parameter count of the default build."""
    build: Callable[[dict], torch.nn.Module]
    """``build(overrides)``: the model in eval mode with random weights seeded by ``torch.manual_seed(0)``.
    ``overrides`` sets config attributes on top of the checkpoint config; an unknown name raises
    ValueError listing the valid ones. A dict value for a sub-config (``backbone_config``,
    ``text_config``, ...) is merged into it."""
    make_inputs: Callable[..., dict]
    """``make_inputs(model, batch_size, image_size, generator)``: keyword args for ``model(**inputs)`` on
    CPU, random but determined by the ``torch.Generator``. Pixels are float32; masks and token ids are
    int64. ViT, BEiT and OWL-ViT take the image size from ``model.config`` (their position embeddings
    fix it), whatever ``image_size`` says."""


class UnknownModelError(KeyError):
    """A model id that the registry does not hold; the message lists the known ids."""

    def __str__(self) -> str:  # KeyError would print the repr of the message
        return str(self.args[0]) if self.args else ""


T = TypeVar("T")


class Registry(Generic[T]):
    """Name -> item. Refuses duplicate names; a failed lookup names every valid choice."""

    def __init__(self, kind: str, missing: Callable[[str], Exception] | None = None) -> None:
        self.kind = kind
        self._items: dict[str, T] = {}
        self._missing = missing or KeyError

    def register(self, name: str, item: T) -> T:
        if name in self._items:
            raise ValueError(f"{self.kind} {name!r} is already registered")
        self._items[name] = item
        return item

    def get(self, name: str) -> T:
        try:
            return self._items[name]
        except KeyError:
            choices = ", ".join(self.names()) or "(none)"
            raise self._missing(f"unknown {self.kind} {name!r}; known: {choices}") from None

    def names(self) -> list[str]:
        return sorted(self._items)

    def __contains__(self, name: object) -> bool:
        return name in self._items

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        return len(self._items)


def build_default_registry() -> Registry[HFModelSpec]:
    """A fresh registry holding every checkpoint of ``workers.hf_checkpoints.SPECS``."""
    from workers.hf_checkpoints import SPECS

    registry: Registry[HFModelSpec] = Registry("model id", UnknownModelError)
    for spec in SPECS:
        registry.register(spec.model_id, spec)
    return registry


@functools.cache
def _registry() -> Registry[HFModelSpec]:
    return build_default_registry()


def _entry(spec: HFModelSpec) -> ModelEntry:
    return ModelEntry(
        id=spec.model_id,
        task=spec.task,
        image_size=spec.image_size,
        summary=spec.summary,
        build=spec.build,
        make_inputs=spec.make_inputs,
    )


def known_model_ids() -> list[str]:
    """Every registered ``hf:`` id, sorted."""
    return _registry().names()


def get_entry(model_id: str) -> ModelEntry:
    """The registered entry of an ``hf:`` id; UnknownModelError (listing the known ids) otherwise."""
    return _entry(_registry().get(model_id))


def model_class(model_id: str) -> type:
    """The transformers class of a registered ``hf:`` id; importing it loads the model's code
    (transformers imports modeling modules lazily: about 2 s on a 2-core machine)."""
    import transformers

    return getattr(transformers, _registry().get(model_id).model_class)


def is_known(model_id: str) -> bool:
    """True for registered ids and for well-formed ``python:<dotted.module>:<identifier>`` ids."""
    if isinstance(model_id, str) and model_id.startswith("hf:"):
        return model_id in _registry()
    return _parse_python_id(model_id) is not None


# ---------------------------------------------------------------------------------------------------------
# Small configs for fast tests and the smoke sweep: each is under 1M parameters and runs a batch-1
# forward at SMALL_IMAGE_SIZE in well under 0.2 s on one CPU core.

SMALL_IMAGE_SIZE = 64

_SMALL_RESNET_BACKBONE = {"embedding_size": 16, "hidden_sizes": [16, 32, 64, 128], "depths": [1, 1, 1, 1]}
_SMALL_SWIN_BACKBONE = {"embed_dim": 16, "depths": [1, 1, 1, 1], "num_heads": [1, 1, 2, 2], "window_size": 4}
_SMALL_DETR = {
    "d_model": 32,
    "encoder_layers": 1,
    "decoder_layers": 1,
    "encoder_ffn_dim": 64,
    "decoder_ffn_dim": 64,
    "encoder_attention_heads": 2,
    "decoder_attention_heads": 2,
    "num_queries": 10,
    "backbone_config": _SMALL_RESNET_BACKBONE,
}
_SMALL_VIT = {
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "intermediate_size": 128,
    "image_size": SMALL_IMAGE_SIZE,
}

SMALL_OVERRIDES: dict[str, dict] = {
    "hf:google/vit-base-patch16-224": _SMALL_VIT,
    "hf:microsoft/beit-base-patch16-224-pt22k-ft22k": {**_SMALL_VIT, "num_labels": 100},
    "hf:facebook/convnext-large-224": {"hidden_sizes": [16, 32, 64, 128], "depths": [1, 1, 1, 1]},
    "hf:microsoft/resnet-50": _SMALL_RESNET_BACKBONE,
    "hf:nvidia/segformer-b0-finetuned-ade-512-512": {
        "hidden_sizes": [16, 32, 64, 128],
        "depths": [1, 1, 1, 1],
        "num_attention_heads": [1, 1, 2, 2],
        "decoder_hidden_size": 32,
    },
    "hf:facebook/mask2former-swin-tiny-coco-panoptic": {
        "backbone_config": _SMALL_SWIN_BACKBONE,
        "feature_size": 32,
        "mask_feature_size": 32,
        "hidden_dim": 32,
        "encoder_feedforward_dim": 64,
        "encoder_layers": 1,
        "decoder_layers": 2,
        "num_attention_heads": 2,
        "dim_feedforward": 64,
        "num_queries": 10,
    },
    "hf:facebook/maskformer-swin-base-ade": {
        "backbone_config": _SMALL_SWIN_BACKBONE,
        "fpn_feature_size": 32,
        "mask_feature_size": 32,
        "decoder_config": {
            "d_model": 32,
            "decoder_layers": 1,
            "decoder_ffn_dim": 64,
            "decoder_attention_heads": 2,
            "num_queries": 10,
        },
    },
    "hf:google/deeplabv3_mobilenet_v2_1.0_513": {"depth_multiplier": 0.35},
    "hf:google/owlvit-base-patch32": {
        "text_config": {
            "vocab_size": 1000,
            "bos_token_id": 998,  # CLIP's tokenizer puts bos and eos at the top of the vocabulary
            "eos_token_id": 999,
            "hidden_size": 32,
            "intermediate_size": 64,
            "num_hidden_layers": 1,
            "num_attention_heads": 2,
        },
        "vision_config": {
            "hidden_size": 32,
            "intermediate_size": 64,
            "num_hidden_layers": 1,
            "num_attention_heads": 2,
            "image_size": SMALL_IMAGE_SIZE,
            "patch_size": 16,
        },
        "projection_dim": 32,
    },
    "hf:facebook/detr-resnet-50": _SMALL_DETR,
    "hf:facebook/detr-resnet-101": _SMALL_DETR,
    "hf:microsoft/conditional-detr-resnet-50": _SMALL_DETR,
}
# No two ids share a nested dict, so editing one entry's copy cannot change another's.
SMALL_OVERRIDES = {model_id: copy.deepcopy(overrides) for model_id, overrides in SMALL_OVERRIDES.items()}


# ---------------------------------------------------------------------------------------------------------
# python: ids


def _parse_python_id(model_id: str) -> tuple[str, str] | None:
    """``(module, function)`` of a well-formed ``python:pkg.mod:fn`` id, else None."""
    if not isinstance(model_id, str) or not model_id.startswith("python:"):
        return None
    parts = model_id[len("python:") :].split(":")
    if len(parts) != 2:
        return None
    module, function = parts
    names = [*module.split("."), function]
    if not all(name.isidentifier() and not keyword.iskeyword(name) for name in names):
        return None
    return module, function


def load_python_factory(model_id: str) -> Callable[..., tuple[torch.nn.Module, dict]]:
    """Import the factory named by ``python:pkg.mod:fn`` and return it (not called)."""
    parsed = _parse_python_id(model_id)
    if parsed is None:
        raise ValueError(
            f"malformed python model id {model_id!r}; expected 'python:<dotted.module>:<function>'"
        )
    module_name, function_name = parsed
    try:
        module = importlib.import_module(module_name)
    except ImportError as error:
        raise ImportError(
            f"cannot import module {module_name!r} of model id {model_id!r}: {error}", name=module_name
        ) from error
    try:
        factory = getattr(module, function_name)
    except AttributeError:
        public = sorted(
            name for name, value in vars(module).items() if callable(value) and not name.startswith("_")
        )
        raise AttributeError(
            f"module {module_name!r} has no attribute {function_name!r} (model id {model_id!r}); "
            f"its public callables: {', '.join(public) or '(none)'}"
        ) from None
    if not callable(factory):
        raise TypeError(f"{model_id!r}: {module_name}.{function_name} is not callable")
    return factory


# ---------------------------------------------------------------------------------------------------------
# Real weights


def load_pretrained(model_id_or_dir: str, local_dir: str) -> torch.nn.Module:
    """The pretrained model saved in ``local_dir`` (a ``save_pretrained`` directory or hub-cache snapshot).

    For a registered ``hf:`` id the registry's model class is used, and the saved config must be of
    the checkpoint's model type; for anything else the class is ``config.architectures[0]``.
    Never touches the network. Weights load as float32, in eval mode.
    """
    import transformers

    config = transformers.AutoConfig.from_pretrained(local_dir, local_files_only=True)
    if model_id_or_dir in _registry():
        spec = _registry().get(model_id_or_dir)
        expected = spec.config_class.model_type
        if config.model_type != expected:
            raise ValueError(
                f"{local_dir} holds a {config.model_type!r} config, but {model_id_or_dir} is {expected!r}"
            )
        class_name = spec.model_class
    else:
        architectures = config.architectures or []
        if not architectures:
            raise ValueError(
                f"{local_dir}: config.json names no architectures, so no model class can be chosen "
                f"for {model_id_or_dir!r}"
            )
        class_name = architectures[0]
    model_class = getattr(transformers, class_name, None)
    if model_class is None:
        raise ValueError(f"transformers {transformers.__version__} has no model class {class_name!r}")
    model = model_class.from_pretrained(local_dir, config=config, local_files_only=True, dtype=torch.float32)
    return model.eval()


def weights_dir(model_id: str, weights: str) -> str:
    """The local directory a model entry's `weights` load from: the Hugging Face cache's snapshot of
    the model's repository for `pretrained` (offline: `local_files_only`), else the directory given.
    ValueError, saying where to get them, when there is none."""
    import os

    if weights != "pretrained":
        path = os.path.expanduser(weights)
        if not os.path.isfile(os.path.join(path, "config.json")):
            raise ValueError(
                f"weights {weights!r}: no config.json there; give a directory that transformers' "
                "save_pretrained wrote (config.json and the weights)"
            )
        return path
    repo = model_id.removeprefix("hf:")
    from huggingface_hub import constants, snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    try:
        return snapshot_download(repo, local_files_only=True)
    except (LocalEntryNotFoundError, OSError, ValueError) as exc:
        raise ValueError(
            f"weights pretrained: {repo} is not in the local Hugging Face cache ({constants.HF_HUB_CACHE}); "
            f"download it where the network is (`hf download {repo}`), or give weights: DIR "
            f"({type(exc).__name__})"
        ) from None


# ---------------------------------------------------------------------------------------------------------
# Outputs


def output_tensors(output: Any) -> list[torch.Tensor]:
    """Every tensor in a model output, depth first, in a stable order.

    Tensors, tuples/lists, HF ModelOutputs (field order, None fields skipped), other mappings (keys
    sorted by their string form), dataclasses (field order), nested in any way. Other leaves are skipped.
    """
    found: list[torch.Tensor] = []
    _collect_tensors(output, found)
    return found


def _collect_tensors(value: Any, found: list[torch.Tensor]) -> None:
    if isinstance(value, torch.Tensor):
        found.append(value)
    elif _is_model_output(value):
        for item in value.values():
            _collect_tensors(item, found)
    elif isinstance(value, Mapping):
        for key in sorted(value, key=str):
            _collect_tensors(value[key], found)
    elif isinstance(value, (list, tuple)):
        for item in value:
            _collect_tensors(item, found)
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        for f in dataclasses.fields(value):
            _collect_tensors(getattr(value, f.name), found)


def _is_model_output(value: Any) -> bool:
    """An HF ModelOutput (a mapping whose field order matters); without transformers imported
    there can be none."""
    utils = sys.modules.get("transformers.utils")
    output_type = getattr(utils, "ModelOutput", None)
    return output_type is not None and isinstance(value, output_type)
