"""Sweep files: YAML -> validated, typed `SweepSpec`.

`load_spec` checks the whole file and raises one `SpecError` listing every problem with its
file and line, so a user fixes a sweep file in one pass and nothing runs on a bad file. Given a
dict (a notebook's sweep), it checks the same data the same way, and each problem names its key
path instead of a line (`spec.datasrc`).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from compiler import runtime as runtime_settings
from compiler.accuracy import AccuracyBudget, parse_budget
from compiler.config import CompileConfig, config_problems
from compiler.job import MeasureSpec, ModelSpec
from compiler.precision import PRECISIONS, canonical_precision
from compiler.serving.traffic import ServingProfile, profile_problems
from orchestrator.spec.checks import (
    MAX_BATCH_SIZE,
    MAX_JOBS_PER_CLASS,
    MAX_TIMED_CALLS,
    MEASURE_LIMITS,
    NAME_RE,
    check_keys,
    duplicates,
    is_int,
    named_mapping,
    positive_number,
    show,
)
from orchestrator.spec.datasrc import located_data
from orchestrator.spec.models import models_of
from orchestrator.spec.yamlsrc import LocatedYaml, PathKey, SourceError, load_yaml, parse_yaml


@dataclass(frozen=True)
class SweepSpec:
    """A validated sweep file."""

    name: str
    """Sweep name; also the default output directory `runs/<name>`."""
    models: tuple[ModelSpec, ...]
    batch_sizes: tuple[int, ...]
    dtypes: tuple[str, ...]
    """Precision policies, canonical names (`compiler.precision`: fp32, the stock policy, by default).
    With `accuracy`, the one policy is the model's own, the stock user's."""
    configs: tuple[CompileConfig, ...]
    """Compile configs to measure; eager is always measured too, as every job's baseline."""
    hardware: Literal["auto"] | tuple[str, ...] = "auto"
    """`auto`: every hardware class the cluster has; else the classes to run on."""
    measure: MeasureSpec = field(default_factory=MeasureSpec)
    accuracy: tuple[AccuracyBudget, ...] = ()
    """Accuracy budgets (`compiler.accuracy`): each class also measures every precision policy a
    budget lets it search (`orchestrator.spec.matrix.class_policies`), and presets are chosen
    within each budget. Empty: the `dtypes` only (a tune then uses `stock`)."""
    serving: dict[str, ServingProfile] = field(default_factory=dict)
    """The traffic each model's presets are to serve (`compiler.serving.traffic`), by model name:
    the model's own `serving:`, else the sweep's; a model with neither is absent (its presets
    serve the batch sizes they were tuned at)."""
    timeout_s: float | None = None
    """Default per-job wall-time limit; configs may override; None uses the per-mode defaults."""
    description: str = ""
    source: str = ""
    """The file the spec was loaded from; empty for a spec built from a dict."""
    raw: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)
    """The file's data as written (a copy of the dict's), recorded in run.json."""

    def serving_of(self, model: ModelSpec) -> dict[str, Any] | None:
        """The serving profile of `model` as its jobs carry it (a dict), or None."""
        profile = self.serving.get(model.name)
        return profile.to_dict() if profile is not None else None


class SpecError(ValueError):
    """A sweep file with problems; `errors` lists each with file and line (a dict's: key path)."""

    def __init__(self, errors: list[SourceError], what: str = "sweep file"):
        self.errors = errors
        if len(errors) == 1:  # one line: file:line: message
            super().__init__(str(errors[0]))
            return
        lines = "\n".join(f"  {e}" for e in errors)
        super().__init__(f"{len(errors)} problem(s) in {what}:\n{lines}")


def load_spec(source: str | os.PathLike[str] | Mapping[str, Any]) -> SweepSpec:
    """The sweep of a YAML file (a path), or of a dict holding what such a file holds
    (`{"name": ..., "models": [...], "batch_sizes": [...], "configs": {...}}`): checked alike,
    with the same messages, every problem in one `SpecError`; a file's name their line
    (`smoke.yaml:12: ...`), a dict's their key path (`sweep['configs']['ro']['mode']: ...`)."""
    if isinstance(source, Mapping):
        return _build(located_data(source))
    if not isinstance(source, (str, os.PathLike)):
        raise TypeError(f"load_spec takes a path or a dict, got {type(source).__name__}")
    return _build(load_yaml(source))


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
    "accuracy",
    "serving",
    "timeout_s",
}
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


# --- sections -----------------------------------------------------------------------------------


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
            src.error(path, f"config {show(name)} must be a mapping of torch.compile settings")
            continue
        if not isinstance(name, str) or not NAME_RE.match(name):
            src.error(path, f"config name {show(name)} must be 1-100 letters, digits and _ . + - only")
            continue
        check_keys(src, body, _CONFIG_KEYS, path, f"config {name!r}")
        ok = True
        for key, check, kind in (
            ("mode", lambda v: v is None or isinstance(v, str), "a string"),
            ("fullgraph", lambda v: isinstance(v, bool), "true or false"),
            ("freezing", lambda v: isinstance(v, bool), "true or false"),
            ("channels_last", lambda v: isinstance(v, bool), "true or false"),
            ("dynamic", lambda v: v is None or isinstance(v, bool), "true, false or null"),
            ("backend", lambda v: isinstance(v, str), "a string"),
            ("options", named_mapping, "a mapping of Inductor option names to values"),
            ("runtime", named_mapping, "a mapping of setting names to values, e.g. {cudnn_benchmark: true}"),
        ):
            if key in body and not check(body[key]):
                src.error(path + (key,), f"{key} must be {kind}, got {show(body[key])}")
                ok = False
        timeout = positive_number(src, body.get("timeout_s"), path + ("timeout_s",), "timeout_s")
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
    check_keys(src, data, _MEASURE_KEYS, ("measure",), "measure")
    values: dict[str, Any] = {}
    for key, low in (("warmup", 0), ("iterations", 1), ("rounds", 1), ("repeats", 1)):
        value = data.get(key, getattr(MeasureSpec, key))
        high = MEASURE_LIMITS[key]
        if not is_int(value) or value < low:
            src.error(("measure", key), f"{key} must be an integer >= {low}, got {show(value)}")
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
            src.error(("measure", key), f"{key} must be true or false, got {show(value)}")
        else:
            values[key] = value
    return MeasureSpec(**values)


def _accuracy(src: LocatedYaml, data: Any, dtypes: list[str]) -> tuple[AccuracyBudget, ...]:
    """`accuracy:` as budgets: one, or a list (each is decided apart, from the same rows)."""
    if data is None:
        return ()
    items = data if isinstance(data, list) else [data]
    if not items:
        src.error(("accuracy",), "accuracy must be a budget or a non-empty list of them, e.g. [stock, bf16]")
        return ()
    found: list[AccuracyBudget] = []
    for i, item in enumerate(items):
        where = ("accuracy", i) if isinstance(data, list) else ("accuracy",)
        try:
            budget = parse_budget(item)
        except ValueError as exc:
            src.error(where, str(exc))
            continue
        if any(b.name == budget.name for b in found):
            src.error(where, f"accuracy budget {budget.name!r} appears twice")
            continue
        found.append(budget)
    if len(dtypes) > 1:
        src.error(
            ("dtypes",),
            f"with accuracy budgets, dtypes names one policy, the model's own (what a stock user runs); "
            f"the budgets choose the others: got {', '.join(dtypes)}",
        )
    return tuple(found)


def _profile(src: LocatedYaml, value: Any, where: tuple) -> ServingProfile | None:
    """One `serving:` block as a profile; its problems reported at its line, None."""
    problems = profile_problems(value)
    for problem in problems:  # at the line of the key it names (`serving.batch`, `serving.traffic`)
        key = next((k for k in ("batch", "traffic") if problem.startswith(f"`serving.{k}`")), None)
        src.error((*where, key) if key and isinstance(value, dict) and key in value else where, problem)
    return None if problems else ServingProfile.from_dict(value)


def _serving(src: LocatedYaml, data: dict, models: list[ModelSpec]) -> dict[str, ServingProfile]:
    """`serving:` of the sweep and of each model, as each model's profile (its own over the sweep's)."""
    shared = _profile(src, data["serving"], ("serving",)) if "serving" in data else None
    own: dict[str, ServingProfile | None] = {}
    items = data.get("models") if isinstance(data.get("models"), list) else []
    aligned = len(items) == len(models)  # else an entry was refused: the file is reported anyway
    for i, item in enumerate(items):
        if isinstance(item, dict) and "serving" in item:
            profile = _profile(src, item["serving"], ("models", i, "serving"))
            if aligned:
                own[models[i].name] = profile
    found = {m.name: own.get(m.name, shared) for m in models}
    return {name: profile for name, profile in found.items() if profile is not None}


def _build(src: LocatedYaml) -> SweepSpec:
    """The whole file checked, section by section, every problem collected; one `SpecError` lists
    them all, else the `SweepSpec`."""
    data = _top_mapping(src)
    check_keys(src, data, _TOP_KEYS, (), "the sweep")
    name = _name(src, data)
    models = models_of(src, _list_of(src, data, "models", required=True) or [])
    batch_sizes = _batch_sizes(src, _list_of(src, data, "batch_sizes", required=True) or [])
    dtypes = _dtypes(src, _list_of(src, data, "dtypes", required=False) or ["fp32"])
    configs = _configs(src, data.get("configs")) if "configs" in data else []
    if "configs" not in data:
        src.error((), "missing required key 'configs'")
    hardware = _hardware(src, data.get("hardware", "auto"))
    measure = _measure(src, data.get("measure"))
    accuracy = _accuracy(src, data.get("accuracy"), dtypes)
    serving = _serving(src, data, models)
    timeout = positive_number(src, data.get("timeout_s"), ("timeout_s",), "timeout_s")
    description = data.get("description", "")
    jobs = len(models) * len(batch_sizes) * len(dtypes) * len(configs)
    if jobs > MAX_JOBS_PER_CLASS:
        src.error(
            (),
            f"{jobs} jobs per hardware class is beyond what a fleet finishes (at most {MAX_JOBS_PER_CLASS})",
        )
    if src.errors:
        raise _error(src)
    return SweepSpec(
        name=name,
        models=tuple(models),
        batch_sizes=tuple(batch_sizes),
        dtypes=tuple(dtypes),
        configs=tuple(configs),
        hardware=hardware,
        measure=measure,
        accuracy=accuracy,
        serving=serving,
        timeout_s=timeout,
        description=str(description),
        source="" if src.keyed else src.file,
        raw=data,
    )


def _error(src: LocatedYaml) -> SpecError:
    return SpecError(src.errors, "the sweep" if src.keyed else "sweep file")


def _top_mapping(src: LocatedYaml) -> dict:
    """The file's data, which must be a mapping; else the problems so far, raised at once (nothing
    else can be checked)."""
    if src.errors and src.data is None:
        raise _error(src)
    if not isinstance(src.data, dict):
        src.error((), "a sweep file is a mapping with name, models, batch_sizes, configs, ...")
        raise _error(src)
    return src.data


def _name(src: LocatedYaml, data: dict) -> str:
    """The sweep's `name` (also its default output directory); "invalid" where it cannot be one."""
    name = data.get("name")
    if not isinstance(name, str) or not NAME_RE.match(name):
        src.error(
            ("name",) if "name" in data else (),
            "the sweep needs a 'name' of 1-100 letters, digits and _ . + -",
        )
        return "invalid"
    return name


def _batch_sizes(src: LocatedYaml, items: list) -> list[int]:
    """`batch_sizes`: the valid ones (positive, at most MAX_BATCH_SIZE), each once."""
    valid: list[tuple[int, int]] = []
    for i, bs in enumerate(items):
        if not is_int(bs) or bs <= 0:
            src.error(("batch_sizes", i), f"batch size must be a positive integer, got {show(bs)}")
        elif bs > MAX_BATCH_SIZE:
            src.error(
                ("batch_sizes", i),
                f"batch size {bs} is larger than any device could hold for one call (at most {MAX_BATCH_SIZE})",
            )
        else:
            valid.append((i, bs))
    duplicates(src, valid, "batch_sizes")
    return [bs for _, bs in valid]


def _dtypes(src: LocatedYaml, items: list) -> list[str]:
    """`dtypes`: the precision policies, by their canonical names, each once."""
    dtypes: list[tuple[int, str]] = []
    for i, d in enumerate(items):
        canon = canonical_precision(d) if isinstance(d, str) else None
        if canon is None:
            src.error(
                ("dtypes", i),
                f"unknown dtype {show(d)}; valid: {', '.join(PRECISIONS)} (aliases: float32, bfloat16, float16, strict)",
            )
        else:
            dtypes.append((i, canon))
    duplicates(src, dtypes, "dtypes")
    return [d for _, d in dtypes]


def _hardware(src: LocatedYaml, hardware: Any) -> Literal["auto"] | tuple[str, ...]:
    """`hardware`: "auto" (every class the cluster has), or the classes named, each once."""
    if hardware == "auto":
        return hardware
    if isinstance(hardware, str):
        hardware = [hardware]
    if (
        not isinstance(hardware, list)
        or not hardware
        or not all(isinstance(h, str) and NAME_RE.match(h) for h in hardware)
    ):
        src.error(
            ("hardware",),
            f"hardware must be 'auto' or a list of classes such as [A100, T4, cpu], got {show(hardware)}",
        )
        return "auto"
    duplicates(src, list(enumerate(hardware)), "hardware")
    return tuple(hardware)
