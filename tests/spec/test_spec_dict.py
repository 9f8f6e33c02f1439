"""A sweep given as a dict (`load_spec({...})`, the Python API): the same checks and messages as
the YAML file holding the same data, each problem at its key path instead of a line."""

from __future__ import annotations

import dataclasses
import textwrap
from pathlib import Path

import pytest
import yaml

from orchestrator.spec.sweep import SpecError, load_spec, parse_spec

REPO = Path(__file__).resolve().parents[2]
# hf: models with overrides, python: models, accuracy budgets, precisions, runtime settings
SWEEP_FILES = [
    REPO / "sweeps" / n for n in ("smoke.yaml", "deployed-seed.yaml", "precision.yaml", "runtime-gpu.yaml")
]


def spec_dict(**changes) -> dict:
    """A valid sweep's data, with `changes` to its top-level keys."""
    data = {
        "name": "t",
        "models": [{"id": "python:workers.toy:mlp", "name": "mlp"}],
        "batch_sizes": [1, 2],
        "configs": {"default": {}, "ro": {"mode": "reduce-overhead"}},
    }
    data.update(changes)
    return data


def problems(data) -> list[str]:
    with pytest.raises(SpecError) as info:
        load_spec(data)
    return [str(e) for e in info.value.errors]


@pytest.mark.parametrize("path", SWEEP_FILES, ids=lambda p: p.name)
def test_a_dict_of_a_shipped_sweep_is_the_same_spec(path):
    from_file = load_spec(path)
    from_dict = load_spec(yaml.safe_load(path.read_text()))
    assert from_dict == dataclasses.replace(from_file, source="")
    assert from_dict.raw == from_file.raw and from_dict.source == ""


BAD = {
    "many problems at once": """\
        models: [hf:nope/nope, python:no_such_module_xyz:f]
        batch_sizes: [0, 2, 2, 65537]
        dtypes: [fp64]
        configs: {eager: {}, x: {mode: 3, bogus: 1, options: {not_an_inductor_option: 1}}}
        timeout_s: -1
        extra: 1
        """,
    "measure and models": """\
        name: t
        models:
          - {id: python:workers.toy:mlp, input_size: -1, bogus: 1}
          - {id: python:workers.toy:mlp, name: again}
        batch_sizes: [1]
        configs: {default: {fullgraph: "yes"}}
        measure: {iterations: 0, flops: 3, nope: 1}
        """,
    "accuracy, hardware and a list of configs": """\
        name: t
        models: [python:workers.toy:mlp]
        batch_sizes: [1]
        dtypes: [fp32, bf16]
        configs: [default]
        accuracy: [nope, stock, stock]
        hardware: [A100, A100, "not a class"]
        """,
}


@pytest.mark.parametrize("text", BAD.values(), ids=BAD.keys())
def test_a_dict_gets_the_messages_its_file_gets_each_at_its_key_path(text):
    text = textwrap.dedent(text)
    with pytest.raises(SpecError) as from_file:
        parse_spec(text, "sweep.yaml")
    with pytest.raises(SpecError) as from_dict:
        load_spec(yaml.safe_load(text))
    file_errors, dict_errors = from_file.value.errors, from_dict.value.errors
    assert len(file_errors) >= 3
    assert [e.message for e in dict_errors] == [e.message for e in file_errors]
    for e in dict_errors:
        assert e.line == 0 and str(e) == f"sweep{e.key}: {' '.join(e.message.split())}"
    assert str(from_dict.value).startswith(f"{len(dict_errors)} problem(s) in the sweep:\n  sweep")
    assert str(from_file.value).startswith(f"{len(file_errors)} problem(s) in sweep file:\n  sweep.yaml:")


def test_key_paths_name_the_value_as_python_looks_it_up():
    data = spec_dict(batch_sizes=[1, 0], configs={"x.1": {"options": {"not_an_inductor_option": 1}}})
    found = problems(data)
    assert found[0] == "sweep['batch_sizes'][1]: batch size must be a positive integer, got 0"
    assert found[1].startswith("sweep['configs']['x.1']['options']['not_an_inductor_option']: config 'x.1': ")
    assert problems(spec_dict(name=None, measure={"warmup": -1}))[1] == (
        "sweep['measure']['warmup']: warmup must be an integer >= 0, got -1"
    )
    (missing,) = problems({k: v for k, v in spec_dict().items() if k != "configs"})
    assert missing == "sweep: missing required key 'configs'"


def test_values_no_sweep_file_could_hold_are_named_at_their_key_path():
    shared = {"mode": "reduce-overhead"}  # one dict under two names is no cycle, as a YAML alias
    loop: list = []
    loop.append(loop)
    data = spec_dict(
        models=[{"id": "python:workers.toy:mlp", "input_size": Path("64")}],
        configs={"a": shared, "b": shared, ("not", "a", "name"): {}},
        description=loop,
    )
    assert problems(data) == [
        f"sweep['models'][0]['input_size']: the value {Path('64')!r} is a {type(Path()).__name__}; a sweep "
        "holds strings, numbers, True/False, None, lists and dicts: convert it (str(), int(), float(), list())",
        "sweep['configs']: a mapping key must be a name or number, got ('not', 'a', 'name')",
        "sweep['description'][0]: refers to a list or dict that contains it (a cycle)",
    ]


def test_too_many_values_or_too_deep_is_one_problem():
    assert problems(spec_dict(batch_sizes=list(range(1, 100_002)))) == [
        "sweep: more than 100000 values; a sweep needs a few hundred"
    ]
    deep: list = []
    for _ in range(10_000):
        deep = [deep]
    assert problems(spec_dict(description=deep)) == ["sweep: nested too deeply to read (thousands of levels)"]


def test_the_spec_keeps_a_copy_of_the_dict_and_tuples_are_lists():
    data = spec_dict(batch_sizes=(4, 1), measure={"warmup": 1, "iterations": 3})
    spec = load_spec(data)
    data["batch_sizes"] = [8]
    data["configs"]["default"]["mode"] = "max-autotune"
    data["measure"]["iterations"] = 99
    assert spec.batch_sizes == (4, 1) and spec.measure.iterations == 3
    assert spec.raw["batch_sizes"] == [4, 1] and spec.raw["configs"]["default"] == {}
    assert spec.raw["measure"] == {"warmup": 1, "iterations": 3}
    assert spec.source == "" and spec.name == "t"


def test_load_spec_takes_a_path_or_a_dict(tmp_path):
    path = tmp_path / "t.yaml"
    path.write_text(yaml.safe_dump(spec_dict()))
    assert load_spec(path) == load_spec(str(path))
    assert dataclasses.replace(load_spec(path), source="") == load_spec(spec_dict())
    with pytest.raises(TypeError, match="load_spec takes a path or a dict, got list"):
        load_spec([spec_dict()])
