"""The `models:` section of a sweep file: each entry's id, name, task, input size, overrides,
time limit and weights, validated, as `ModelSpec`s."""

from __future__ import annotations

import json
import os
import re
from typing import get_args

from compiler.job import ModelSpec
from orchestrator.spec.checks import (
    MAX_INPUT_SIZE,
    NAME_RE,
    check_keys,
    duplicates,
    is_int,
    mixed_keys,
    named_mapping,
    positive_number,
    show,
)
from orchestrator.spec.imports import missing_name, module_problems
from orchestrator.spec.yamlsrc import LocatedYaml, PathKey

_MODEL_KEYS = {"id", "name", "task", "input_size", "overrides", "timeout_s", "weights", "serving"}
"""A model's keys; `serving` (its traffic) is read with the sweep's (`orchestrator.spec.sweep`)."""


def models_of(src: LocatedYaml, items: list) -> list[ModelSpec]:
    """The `models:` entries as `ModelSpec`s, each checked on its own (an entry without a usable id
    is left out), then together: the `python:` ids' modules, names given twice, one model twice."""
    models: list[ModelSpec] = []
    positions: list[int] = []
    python_modules: list[tuple[PathKey, str]] = []
    for i, item in enumerate(items):
        model = _model(src, item, ("models", i), python_modules)
        if model is not None:
            positions.append(i)
            models.append(model)
    _check_modules(src, python_modules)
    duplicates(src, [(i, m.name) for i, m in zip(positions, models, strict=True)], "models")
    _same_model_twice(src, positions, models)
    return models


def _model(
    src: LocatedYaml, item: object, path: PathKey, python_modules: list[tuple[PathKey, str]]
) -> ModelSpec | None:
    """One entry (an id string, or a mapping with `id`), checked key by key; None where it has no
    id. A `python:` id's module is added to `python_modules`, to be found with the others."""
    if isinstance(item, str):
        item = {"id": item}
    if not isinstance(item, dict):
        src.error(path, f"a model is an id string or a mapping with 'id', got {show(item)}")
        return None
    check_keys(src, item, _MODEL_KEYS, path, "a model")
    model_id = item.get("id")
    if not isinstance(model_id, str):
        src.error(path, "model needs an 'id' such as hf:microsoft/resnet-50 or python:pkg.module:factory")
        return None
    _check_id(src, model_id, path + ("id",), python_modules)
    name = item.get("name", default_name(model_id))
    if not isinstance(name, str) or not NAME_RE.match(name):
        src.error(path + ("name",), f"model name {show(name)} must be 1-100 letters, digits and _ . + - only")
    return ModelSpec(
        id=model_id,
        name=str(name),
        task=_task(src, item.get("task"), path + ("task",)),
        input_size=_input_size(src, item.get("input_size"), path + ("input_size",)),
        overrides=_overrides(src, item.get("overrides", {}), path + ("overrides",)),
        timeout_s=positive_number(src, item.get("timeout_s"), path + ("timeout_s",), "timeout_s"),
        weights=_weights(src, item, model_id, path),
    )


def _check_id(
    src: LocatedYaml, model_id: str, where: PathKey, python_modules: list[tuple[PathKey, str]]
) -> None:
    """A model id of one of the kinds a job builds: `python:package.module:factory` (its module is
    found later, with the others), an external hub's id (timm:, torchvision:), or the zoo's."""
    from workers import external, zoo

    if model_id.startswith("python:"):
        if not zoo.is_known(model_id):
            src.error(
                where, f"malformed python model id {show(model_id)}; expected python:package.module:factory"
            )
        else:
            python_modules.append((where, model_id))
    elif external.is_external_id(model_id):
        problem = external.check_id(model_id)
        if problem:
            src.error(where, problem)
    elif not zoo.is_known(model_id):
        src.error(
            where,
            f"unknown model id {show(model_id)}; known ids: {', '.join(zoo.known_model_ids())} "
            "(or timm:<name>, torchvision:<name>, or python:package.module:factory for your own model)",
        )


def _task(src: LocatedYaml, task: object, where: PathKey) -> str | None:
    """`task`: one of the zoo's tasks, or None (the model's own)."""
    from workers import zoo

    tasks = get_args(zoo.Task)
    if task is not None and task not in tasks:
        src.error(where, f"unknown task {show(task)}; valid: {', '.join(tasks)}")
    return task


def _input_size(src: LocatedYaml, input_size: object, where: PathKey) -> int | None:
    """`input_size`: a positive integer no model's input exceeds, else None (the model's own)."""
    if input_size is not None and (not is_int(input_size) or input_size <= 0):
        src.error(where, f"input_size must be a positive integer, got {show(input_size)}")
        return None
    if input_size is not None and input_size > MAX_INPUT_SIZE:
        src.error(
            where,
            f"input_size {input_size} is beyond any model's input (at most {MAX_INPUT_SIZE} pixels or tokens)",
        )
        return None
    return input_size


def _overrides(src: LocatedYaml, overrides: object, where: PathKey) -> dict:
    """`overrides`: a mapping of config attribute names to values, else none."""
    if not named_mapping(overrides):
        src.error(where, "overrides must be a mapping of config attribute names -> values")
        return {}
    if problem := mixed_keys(overrides):
        src.error(where, problem)
        return {}
    return overrides


def _weights(src: LocatedYaml, item: dict, model_id: str, path: PathKey) -> str:
    """A model entry's `weights`: random (the default), pretrained (the local Hugging Face cache) or
    a checkpoint directory, made absolute (relative to where the command runs: a job runs in a
    directory of its own); a checkpoint must be there now (on this machine) and fits hf: models
    whose architecture it fixes (no overrides)."""
    from workers import zoo

    weights = item.get("weights", "random")
    where = path + ("weights",)
    if not isinstance(weights, str) or not weights.strip():
        src.error(where, f"weights must be random, pretrained or a checkpoint directory, got {show(weights)}")
        return "random"
    if weights == "random":
        return weights
    if not (model_id.startswith("hf:") and zoo.is_known(model_id)):
        src.error(
            where,
            f"weights {show(weights)}: checkpoints load for the zoo's hf: models only (hf:<org>/<name>); "
            f"{show(model_id)} builds its own",
        )
        return "random"
    if item.get("overrides"):
        src.error(
            where, "weights from a checkpoint fix the architecture: drop `overrides`, or use weights: random"
        )
    if weights != "pretrained":
        weights = os.path.abspath(os.path.expanduser(weights))
    try:
        zoo.weights_dir(model_id, weights)
    except ValueError as exc:
        src.error(where, f"{exc} (checked on this machine; on a cluster every worker needs them too)")
    return weights


def _same_model_twice(src: LocatedYaml, positions: list[int], models: list[ModelSpec]) -> None:
    """Two entries that differ only in their name (or timeout) are one model: their jobs would
    have the same ids, since a name is a label, not part of what a job measures."""
    first: dict[str, str] = {}
    for i, m in zip(positions, models, strict=True):
        key = json.dumps([m.id, m.task, m.input_size, m.overrides, m.weights], sort_keys=True, default=str)
        if key in first and first[key] != m.name:
            src.error(
                ("models", i),
                f"model {m.name!r} is model {first[key]!r} again (same id and settings; a name is only a "
                "label): drop one, or give it other overrides, input_size, task or weights",
            )
        first.setdefault(key, m.name)


def _check_modules(src: LocatedYaml, found: list[tuple[PathKey, str]]) -> None:
    """The `python:` ids' modules, found in a child interpreter, and their factories, found in
    their source without running it (`spec.imports`)."""
    origins: dict[str, str] = {}
    problems = module_problems([m.split(":")[1] for _, m in found], origins=origins) if found else {}
    for path, model_id in found:
        module, factory = (model_id.split(":") + [""])[1:3]
        if problem := problems.get(module):
            what = f"module {show(module)} of {show(model_id)}"
            src.error(path, f"{what} is not importable" if problem == "not found" else f"{what}: {problem}")
        elif factory and module in origins and (missing := missing_name(origins[module], factory)):
            src.error(path, f"{show(model_id)}: module {show(module)} {missing}")


def default_name(model_id: str) -> str:
    if model_id.startswith(("timm:", "torchvision:")):  # timm:resnet50 and torchvision:resnet50 differ
        return re.sub(r"[^A-Za-z0-9_.+-]", "-", model_id.replace(":", "-", 1))
    tail = model_id.rsplit(":", 1)[-1].rsplit("/", 1)[-1]
    return re.sub(r"[^A-Za-z0-9_.+-]", "-", tail) or "model"
