"""Models from other libraries: ``timm:<name>`` and ``torchvision:<name>`` ids.

Both build an architecture by name with random weights (``pretrained=False`` / ``weights=None``), so
nothing is downloaded, and feed it one image batch of shape ``(B, 3, H, W)`` at the resolution
the library's pretrained config for that name uses (timm's ``pretrained_cfg["input_size"]``;
torchvision's weight transforms: ``crop_size`` for classification, ``resize_size`` for segmentation).

These packages are optional: an id of a library that is not importable is refused when the sweep file
is validated, with the install command. torchvision's detection, keypoint, video, optical-flow and
quantized models take other inputs (image lists, clips, image pairs) and are refused with the list of
models that are supported.
"""

from __future__ import annotations

import difflib
import importlib.util
import re
from dataclasses import dataclass

import torch

__all__ = [
    "LIBRARIES",
    "ExternalModel",
    "build",
    "check_id",
    "is_external_id",
    "parse_id",
]

LIBRARIES = ("timm", "torchvision")
_NAME_RE = re.compile(r"^[A-Za-z0-9_.\-]+$")
DEFAULT_IMAGE_SIZE = 224


@dataclass(frozen=True)
class ExternalModel:
    """A built external model and what its inputs look like."""

    module: torch.nn.Module
    task: str
    image_size: int


def is_external_id(model_id: object) -> bool:
    return isinstance(model_id, str) and model_id.split(":", 1)[0] in LIBRARIES and ":" in model_id


def parse_id(model_id: str) -> tuple[str, str]:
    """``(library, name)`` of ``timm:<name>`` / ``torchvision:<name>``; ValueError when malformed."""
    library, _, name = model_id.partition(":")
    if library not in LIBRARIES or not _NAME_RE.match(name):
        raise ValueError(
            f"malformed model id {model_id!r}; expected timm:<model name> or torchvision:<model name>, "
            "e.g. timm:resnet50 or torchvision:resnet50"
        )
    return library, name


def installed(library: str) -> bool:
    return importlib.util.find_spec(library) is not None


def _torchvision_supported() -> dict[str, str]:
    """name -> task of every torchvision model that takes one image batch."""
    import torchvision.models as tvm

    supported = {name: "image-classification" for name in tvm.list_models(module=tvm)}
    supported.update({name: "image-segmentation" for name in tvm.list_models(module=tvm.segmentation)})
    return supported


def check_id(model_id: str) -> str | None:
    """None when ``model_id`` names a model this machine can build, else the message saying why not.

    Checks the shape of the id, that the library is importable (install command otherwise), and that
    the library knows the name (closest names otherwise).
    """
    try:
        _resolve(model_id)
    except ValueError as error:
        return str(error)
    return None


def _resolve(model_id: str) -> tuple[str, str, str]:
    """``(library, name, task)`` of a buildable id; ValueError with the reason otherwise."""
    library, name = parse_id(model_id)
    if not installed(library):
        raise ValueError(
            f"{model_id!r} needs the {library} package, which is not installed here; install the "
            f"project's {library} extra, `pip install 'compile-orchestrator[{library}]'` (from a checkout: "
            f"`pip install -e '.[{library}]'`), on the driver and every worker node"
        )
    if library == "timm":
        import timm

        known = timm.list_models()
        if name in known:
            return library, name, "image-classification"
        hint = ""
    else:
        supported = _torchvision_supported()
        if name in supported:
            return library, name, supported[name]
        import torchvision.models as tvm

        known = list(supported)
        hint = (
            f" ({name!r} is a torchvision model that takes image lists, clips or image pairs, which "
            "this zoo does not feed; use a classification or segmentation model)"
            if name in tvm.list_models()
            else ""
        )
    close = difflib.get_close_matches(name, known, n=3)
    did_you_mean = f"; did you mean {', '.join(close)}?" if close else ""
    raise ValueError(f"{library} has no model {name!r}{hint}{did_you_mean}")


def _timm_image_size(model: torch.nn.Module) -> int:
    cfg = getattr(model, "pretrained_cfg", None) or {}
    size = cfg.get("input_size") or (3, DEFAULT_IMAGE_SIZE, DEFAULT_IMAGE_SIZE)
    return int(size[-1])


def _torchvision_image_size(name: str, task: str) -> int:
    import torchvision.models as tvm

    try:
        weights = tvm.get_model_weights(name)
    except (ValueError, KeyError):
        return DEFAULT_IMAGE_SIZE
    members = list(weights)
    if not members:
        return DEFAULT_IMAGE_SIZE
    keywords = getattr(members[0].transforms, "keywords", {}) or {}
    size = keywords.get("crop_size" if task == "image-classification" else "resize_size")
    if size is None:
        size = keywords.get("resize_size") or keywords.get("crop_size") or DEFAULT_IMAGE_SIZE
    if isinstance(size, (list, tuple)):
        size = size[0]
    return int(size)


def build(model_id: str, overrides: dict) -> ExternalModel:
    """The model of ``model_id`` in eval mode, random weights seeded by ``torch.manual_seed(0)``.

    ``overrides`` are keyword arguments of ``timm.create_model`` / ``torchvision.models.get_model``
    (``num_classes``, ``drop_rate``, ...).
    """
    library, name, task = _resolve(model_id)
    torch.manual_seed(0)
    if library == "timm":
        import timm

        module = timm.create_model(name, pretrained=False, **overrides)
        return ExternalModel(module.eval(), task, _timm_image_size(module))
    import torchvision.models as tvm

    kwargs = dict(overrides)
    if task == "image-segmentation":
        # Their builders default to a pretrained backbone, which would be downloaded.
        kwargs.setdefault("weights_backbone", None)
    module = tvm.get_model(name, weights=None, **kwargs)
    return ExternalModel(module.eval(), task, _torchvision_image_size(name, task))


def make_inputs(batch_size: int, image_size: int, generator: torch.Generator) -> tuple[torch.Tensor]:
    """One normalised-looking image batch, float32, ``(B, 3, H, W)``, as the one positional argument
    (the parameter's name varies: ``x`` for most, ``input`` for torchvision's LRASPP)."""
    return (torch.randn(batch_size, 3, image_size, image_size, generator=generator),)
