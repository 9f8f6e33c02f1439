"""Sweep files: YAML -> validated, typed `SweepSpec`.

`load_spec` checks the whole file and raises one `SpecError` listing every problem with its
file and line, so a user fixes a sweep file in one pass and nothing runs on a bad file.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, get_args

from compiler import runtime as runtime_settings
from compiler.config import CompileConfig, config_problems
from orchestrator.spec.imports import missing_name, module_problems
from orchestrator.spec.yamlsrc import LocatedYaml, PathKey, SourceError, load_yaml, parse_yaml
from workers.job import PRECISIONS, MeasureSpec, ModelSpec, canonical_precision

NAME_RE = re.compile(r"\A[A-Za-z0-9][A-Za-z0-9_.+-]{0,99}\Z")
"""Names of sweeps, models, configs and hardware classes: they become directory and job names."""

# Values beyond these are typos or fuzz, not sweeps: refused with the limit in the message.
MAX_BATCH_SIZE = 65536
"""Far above any batch a single accelerator holds for the models this tool runs."""
MAX_INPUT_SIZE = 65536
"""Image side in pixels, or sequence length in tokens."""
MAX_TIMEOUT_S = 7 * 24 * 3600.0
"""A week: longer than any one job's compile and timing."""
MEASURE_LIMITS = {"warmup": 100_000, "iterations": 100_000, "rounds": 1_000, "repeats": 100}
"""Per measure key: the most any device could finish within a job's time limit."""
MAX_TIMED_CALLS = 1_000_000
"""iterations x rounds x repeats: timed calls per side of one cell."""
MAX_JOBS_PER_CLASS = 100_000
"""models x batch sizes x dtypes x configs."""


def _show(value: Any) -> str:
    """A value for an error message: its repr, cut short."""
    text = repr(value)
    return text if len(text) <= 60 else text[:56] + " ..."


@dataclass(frozen=True)
class SweepSpec:
    """A validated sweep file."""

    name: str
    """Sweep name; also the default output directory `runs/<name>`."""
    models: tuple[ModelSpec, ...]
    batch_sizes: tuple[int, ...]
    dtypes: tuple[str, ...]
    """Precision policies, canonical names (fp32, tf32, bf16, fp16)."""
    configs: tuple[CompileConfig, ...]
    """Compile configs to measure; eager is always measured too, as every job's baseline."""
    hardware: Literal["auto"] | tuple[str, ...] = "auto"
    """`auto`: every hardware class the cluster has; else the classes to run on."""
    measure: MeasureSpec = field(default_factory=MeasureSpec)
    timeout_s: float | None = None
    """Default per-job wall-time limit; configs may override; None uses the per-mode defaults."""
    description: str = ""
    source: str = ""
    """The file the spec was loaded from."""
    raw: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)
    """The file's data as written, recorded in run.json."""


class SpecError(ValueError):
    """A sweep file with problems; `errors` lists each with file and line."""

    def __init__(self, errors: list[SourceError]):
        self.errors = errors
        if len(errors) == 1:  # one line: file:line: message
            super().__init__(str(errors[0]))
            return
        lines = "\n".join(f"  {e}" for e in errors)
        super().__init__(f"{len(errors)} problem(s) in sweep file:\n{lines}")


def load_spec(file: str | Path) -> SweepSpec:
    return _build(load_yaml(file))


def parse_spec(text: str, file: str = "<string>") -> SweepSpec:
    return _build(parse_yaml(text, file))


# --- validation helpers -------------------------------------------------------------------------

_TOP_KEYS = {
    "name",
    "description",
    "models",
    "batch_sizes",
    "dtypes",
    "configs",
    "hardware",
    "measure",
    "timeout_s",
}
_MODEL_KEYS = {"id", "name", "task", "input_size", "overrides", "timeout_s"}
_CONFIG_KEYS = {
    "mode",
    "fullgraph",
    "dynamic",
    "backend",
    "options",
    "freezing",
    "channels_last",
    "runtime",
    "timeout_s",
}
_MEASURE_KEYS = {"warmup", "iterations", "rounds", "flops", "warm_compile", "repeats"}


def _check_keys(src: LocatedYaml, mapping: dict, allowed: set[str], path: PathKey, what: str) -> None:
    for key in mapping:
        if key not in allowed:
            src.error(
                path + (key,), f"unknown key {_show(key)} in {what}; valid keys: {', '.join(sorted(allowed))}"
            )


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _positive_number(src: LocatedYaml, value: Any, path: PathKey, what: str) -> float | None:
    """A time limit in seconds: positive, finite, at most `MAX_TIMEOUT_S`."""
    if value is None:
        return None
    if not _is_number(value) or not value > 0 or (isinstance(value, float) and not math.isfinite(value)):
        src.error(path, f"{what} must be a positive number of seconds, got {_show(value)}")
        return None
    if value > MAX_TIMEOUT_S:  # an int of any size compares; only float() of a huge one overflows
        src.error(
            path,
            f"{what} {_show(value)} s is more than a week (at most {MAX_TIMEOUT_S:g} s); is it in seconds?",
        )
        return None
    return float(value)


def _list_of(src: LocatedYaml, data: dict, key: str, required: bool) -> list | None:
    value = data.get(key)
    if value is None:
        if required:
            src.error((), f"missing required key {key!r}")
        return None
    if not isinstance(value, list) or not value:
        src.error((key,), f"{key!r} must be a non-empty list")
        return None
    return value


def _duplicates(src: LocatedYaml, values: list[tuple[int, Any]], key: str) -> None:
    """Report repeated values; `values` holds (index in the file's list, value) of the valid items."""
    seen: set = set()
    for i, v in values:
        if v in seen:
            src.error((key, i), f"{_show(v)} appears twice in {key!r}")
        seen.add(v)


# --- sections -----------------------------------------------------------------------------------


def _models(src: LocatedYaml, items: list) -> list[ModelSpec]:
    from workers import external, zoo

    tasks = get_args(zoo.Task)
    models: list[ModelSpec] = []
    positions: list[int] = []
    python_modules: list[tuple[PathKey, str]] = []
    for i, item in enumerate(items):
        path: PathKey = ("models", i)
        if isinstance(item, str):
            item = {"id": item}
        if not isinstance(item, dict):
            src.error(path, f"a model is an id string or a mapping with 'id', got {_show(item)}")
            continue
        _check_keys(src, item, _MODEL_KEYS, path, "a model")
        model_id = item.get("id")
        if not isinstance(model_id, str):
            src.error(path, "model needs an 'id' such as hf:microsoft/resnet-50 or python:pkg.module:factory")
            continue
        if model_id.startswith("python:"):
            if not zoo.is_known(model_id):
                src.error(
                    path + ("id",),
                    f"malformed python model id {_show(model_id)}; expected python:package.module:factory",
                )
            else:
                python_modules.append((path + ("id",), model_id))
        elif external.is_external_id(model_id):
            problem = external.check_id(model_id)
            if problem:
                src.error(path + ("id",), problem)
        elif not zoo.is_known(model_id):
            src.error(
                path + ("id",),
                f"unknown model id {_show(model_id)}; known ids: {', '.join(zoo.known_model_ids())} "
                "(or timm:<name>, torchvision:<name>, or python:package.module:factory for your own model)",
            )
        name = item.get("name", _default_name(model_id))
        if not isinstance(name, str) or not NAME_RE.match(name):
            src.error(
                path + ("name",), f"model name {_show(name)} must be 1-100 letters, digits and _ . + - only"
            )
        task = item.get("task")
        if task is not None and task not in tasks:
            src.error(path + ("task",), f"unknown task {_show(task)}; valid: {', '.join(tasks)}")
        input_size = item.get("input_size")
        if input_size is not None and (not _is_int(input_size) or input_size <= 0):
            src.error(
                path + ("input_size",), f"input_size must be a positive integer, got {_show(input_size)}"
            )
            input_size = None
        elif input_size is not None and input_size > MAX_INPUT_SIZE:
            src.error(
                path + ("input_size",),
                f"input_size {input_size} is beyond any model's input (at most {MAX_INPUT_SIZE} pixels or tokens)",
            )
            input_size = None
        overrides = item.get("overrides", {})
        if not _named_mapping(overrides):
            src.error(
                path + ("overrides",), "overrides must be a mapping of config attribute names -> values"
            )
            overrides = {}
        elif problem := _mixed_keys(overrides):
            src.error(path + ("overrides",), problem)
            overrides = {}
        timeout = _positive_number(src, item.get("timeout_s"), path + ("timeout_s",), "timeout_s")
        positions.append(i)
        models.append(
            ModelSpec(
                id=model_id,
                name=str(name),
                task=task,
                input_size=input_size,
                overrides=overrides,
                timeout_s=timeout,
            )
        )
    _check_modules(src, python_modules)
    _duplicates(src, [(i, m.name) for i, m in zip(positions, models, strict=True)], "models")
    _same_model_twice(src, positions, models)
    return models


def _same_model_twice(src: LocatedYaml, positions: list[int], models: list[ModelSpec]) -> None:
    """Two entries that differ only in their name (or timeout) are one model: their jobs would
    have the same ids, since a name is a label, not part of what a job measures."""
    first: dict[str, str] = {}
    for i, m in zip(positions, models, strict=True):
        key = json.dumps([m.id, m.task, m.input_size, m.overrides], sort_keys=True, default=str)
        if key in first and first[key] != m.name:
            src.error(
                ("models", i),
                f"model {m.name!r} is model {first[key]!r} again (same id and settings; a name is only a "
                "label): drop one, or give it other overrides, input_size or task",
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
            what = f"module {_show(module)} of {_show(model_id)}"
            src.error(path, f"{what} is not importable" if problem == "not found" else f"{what}: {problem}")
        elif factory and module in origins and (missing := missing_name(origins[module], factory)):
            src.error(path, f"{_show(model_id)}: module {_show(module)} {missing}")


def _named_mapping(value: Any) -> bool:
    """A mapping whose keys are all names (strings)."""
    return isinstance(value, dict) and all(isinstance(k, str) for k in value)


def _mixed_keys(value: Any, where: str = "overrides") -> str | None:
    """Where a mapping inside `value` mixes key types (1 and "a"): its keys cannot be ordered, so
    the job's id (a hash of its sorted JSON) could not be computed."""
    if isinstance(value, dict):
        if len({type(k) for k in value}) > 1:
            return f"{where} mixes key types ({', '.join(sorted({type(k).__name__ for k in value}))}): quote the numbers"
        for k, v in value.items():
            if problem := _mixed_keys(v, f"{where}.{k}"):
                return problem
    elif isinstance(value, list):
        for i, v in enumerate(value):
            if problem := _mixed_keys(v, f"{where}[{i}]"):
                return problem
    return None


def _default_name(model_id: str) -> str:
    if model_id.startswith(("timm:", "torchvision:")):  # timm:resnet50 and torchvision:resnet50 differ
        return re.sub(r"[^A-Za-z0-9_.+-]", "-", model_id.replace(":", "-", 1))
    tail = model_id.rsplit(":", 1)[-1].rsplit("/", 1)[-1]
    return re.sub(r"[^A-Za-z0-9_.+-]", "-", tail) or "model"


def _configs(src: LocatedYaml, data: Any) -> list[CompileConfig]:
    if not isinstance(data, dict) or not data:
        src.error(
            ("configs",),
            "'configs' must be a non-empty mapping of name -> compile settings, "
            "e.g. configs: {default: {}, ro: {mode: reduce-overhead}}",
        )
        return []
    configs = []
    for name, body in data.items():
        path: PathKey = ("configs", name)
        body = {} if body is None else body
        if not isinstance(body, dict):
            src.error(path, f"config {_show(name)} must be a mapping of torch.compile settings")
            continue
        if not isinstance(name, str) or not NAME_RE.match(name):
            src.error(path, f"config name {_show(name)} must be 1-100 letters, digits and _ . + - only")
            continue
        _check_keys(src, body, _CONFIG_KEYS, path, f"config {name!r}")
        ok = True
        for key, check, kind in (
            ("mode", lambda v: v is None or isinstance(v, str), "a string"),
            ("fullgraph", lambda v: isinstance(v, bool), "true or false"),
            ("freezing", lambda v: isinstance(v, bool), "true or false"),
            ("channels_last", lambda v: isinstance(v, bool), "true or false"),
            ("dynamic", lambda v: v is None or isinstance(v, bool), "true, false or null"),
            ("backend", lambda v: isinstance(v, str), "a string"),
            ("options", _named_mapping, "a mapping of Inductor option names to values"),
            ("runtime", _named_mapping, "a mapping of setting names to values, e.g. {cudnn_benchmark: true}"),
        ):
            if key in body and not check(body[key]):
                src.error(path + (key,), f"{key} must be {kind}, got {_show(body[key])}")
                ok = False
        timeout = _positive_number(src, body.get("timeout_s"), path + ("timeout_s",), "timeout_s")
        if not ok:
            continue
        cfg = CompileConfig(
            name=name,
            mode=body.get("mode"),
            fullgraph=body.get("fullgraph", False),
            dynamic=body.get("dynamic"),
            backend=body.get("backend", "inductor"),
            options=body.get("options", {}),
            freezing=body.get("freezing", False),
            channels_last=body.get("channels_last", False),
            runtime=dict(body.get("runtime", {})),
            timeout_s=timeout,
        )
        for fld, message in config_problems(cfg):
            src.error(path + tuple(fld.split(".")), f"config {name!r}: {message}")
        # a setting written at torch's default is no setting: same job id as leaving it out
        configs.append(dataclasses.replace(cfg, runtime=runtime_settings.explicit(cfg.runtime)))
    return configs


def _measure(src: LocatedYaml, data: Any) -> MeasureSpec:
    if data is None:
        return MeasureSpec()
    if not isinstance(data, dict):
        src.error(("measure",), f"measure must be a mapping with keys {', '.join(sorted(_MEASURE_KEYS))}")
        return MeasureSpec()
    _check_keys(src, data, _MEASURE_KEYS, ("measure",), "measure")
    values: dict[str, Any] = {}
    for key, low in (("warmup", 0), ("iterations", 1), ("rounds", 1), ("repeats", 1)):
        value = data.get(key, getattr(MeasureSpec, key))
        high = MEASURE_LIMITS[key]
        if not _is_int(value) or value < low:
            src.error(("measure", key), f"{key} must be an integer >= {low}, got {_show(value)}")
        elif value > high:
            src.error(
                ("measure", key),
                f"{key} {value} is more than any job could finish in its time limit (at most {high})",
            )
        else:
            values[key] = value
    calls = values.get("iterations", 1) * values.get("rounds", 1) * values.get("repeats", 1)
    if calls > MAX_TIMED_CALLS:
        src.error(
            ("measure",),
            f"iterations x rounds x repeats = {calls} timed calls per side is more than any job could "
            f"finish (at most {MAX_TIMED_CALLS})",
        )
    for key in ("flops", "warm_compile"):
        value = data.get(key, getattr(MeasureSpec, key))
        if not isinstance(value, bool):
            src.error(("measure", key), f"{key} must be true or false, got {_show(value)}")
        else:
            values[key] = value
    return MeasureSpec(**values)


def _build(src: LocatedYaml) -> SweepSpec:
    if src.errors and src.data is None:
        raise SpecError(src.errors)
    data = src.data
    if not isinstance(data, dict):
        src.error((), "a sweep file is a mapping with name, models, batch_sizes, configs, ...")
        raise SpecError(src.errors)
    _check_keys(src, data, _TOP_KEYS, (), "the sweep")

    name = data.get("name")
    if not isinstance(name, str) or not NAME_RE.match(name):
        src.error(
            ("name",) if "name" in data else (),
            "the sweep needs a 'name' of 1-100 letters, digits and _ . + -",
        )
        name = "invalid"

    model_items = _list_of(src, data, "models", required=True) or []
    models = _models(src, model_items)

    batch_sizes = _list_of(src, data, "batch_sizes", required=True) or []
    valid_bs = []
    for i, bs in enumerate(batch_sizes):
        if not _is_int(bs) or bs <= 0:
            src.error(("batch_sizes", i), f"batch size must be a positive integer, got {_show(bs)}")
        elif bs > MAX_BATCH_SIZE:
            src.error(
                ("batch_sizes", i),
                f"batch size {bs} is larger than any device could hold for one call (at most {MAX_BATCH_SIZE})",
            )
        else:
            valid_bs.append((i, bs))
    _duplicates(src, valid_bs, "batch_sizes")

    dtypes: list[tuple[int, str]] = []
    for i, d in enumerate(_list_of(src, data, "dtypes", required=False) or ["fp32"]):
        canon = canonical_precision(d) if isinstance(d, str) else None
        if canon is None:
            src.error(
                ("dtypes", i),
                f"unknown dtype {_show(d)}; valid: {', '.join(PRECISIONS)} (aliases: float32, bfloat16, float16)",
            )
        else:
            dtypes.append((i, canon))
    _duplicates(src, dtypes, "dtypes")

    configs = _configs(src, data.get("configs")) if "configs" in data else []
    if "configs" not in data:
        src.error((), "missing required key 'configs'")

    hardware: Any = data.get("hardware", "auto")
    if hardware != "auto":
        if isinstance(hardware, str):
            hardware = [hardware]
        if (
            not isinstance(hardware, list)
            or not hardware
            or not all(isinstance(h, str) and NAME_RE.match(h) for h in hardware)
        ):
            src.error(
                ("hardware",),
                f"hardware must be 'auto' or a list of classes such as [A100, T4, cpu], got {_show(hardware)}",
            )
            hardware = "auto"
        else:
            _duplicates(src, list(enumerate(hardware)), "hardware")
            hardware = tuple(hardware)

    measure = _measure(src, data.get("measure"))
    timeout = _positive_number(src, data.get("timeout_s"), ("timeout_s",), "timeout_s")
    description = data.get("description", "")

    jobs = len(models) * len(valid_bs) * len(dtypes) * len(configs)
    if jobs > MAX_JOBS_PER_CLASS:
        src.error(
            (),
            f"{jobs} jobs per hardware class is beyond what a fleet finishes (at most {MAX_JOBS_PER_CLASS})",
        )
    if src.errors:
        raise SpecError(src.errors)
    return SweepSpec(
        name=name,
        models=tuple(models),
        batch_sizes=tuple(bs for _, bs in valid_bs),
        dtypes=tuple(d for _, d in dtypes),
        configs=tuple(configs),
        hardware=hardware,
        measure=measure,
        timeout_s=timeout,
        description=str(description),
        source=src.file,
        raw=data,
    )
