"""Sweep file validation: every problem reported at once, each with its file and 1-based line."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from compiler.config import DEFAULT_TIMEOUT_BY_MODE, CompileConfig
from compiler.job import MeasureSpec, ModelSpec
from orchestrator.spec.matrix import expand, policies_of
from orchestrator.spec.sweep import SpecError, SweepSpec, load_spec, parse_spec

REPO = Path(__file__).resolve().parents[2]
SWEEP_FILES = sorted((REPO / "sweeps").glob("*.yaml"))

VALID = """\
name: t
models: [hf:microsoft/resnet-50]
batch_sizes: [1]
configs:
  default: {}
"""


def errors_of(text: str, file: str = "sweep.yaml") -> list:
    with pytest.raises(SpecError) as info:
        parse_spec(textwrap.dedent(text), file)
    errs = info.value.errors
    assert errs, "a SpecError must carry at least one error"
    return errs


def line_of(text: str, needle: str) -> int:
    """1-based line of the single line of `text` that contains `needle`."""
    hits = [i for i, line in enumerate(textwrap.dedent(text).splitlines(), 1) if needle in line]
    assert len(hits) == 1, f"{needle!r} must occur on exactly one line, found {hits}"
    return hits[0]


def one_error(text: str, *fragments: str) -> object:
    """The single error of `text`; its message must contain every fragment."""
    errs = errors_of(text)
    assert len(errs) == 1, [str(e) for e in errs]
    for fragment in fragments:
        assert fragment in errs[0].message, errs[0].message
    return errs[0]


# --- exact problems with exact lines --------------------------------------------------------------


def test_unknown_key_mode_and_option_with_lines():
    text = """\
    name: t
    models: [hf:microsoft/resnet-50]
    batch_sizes: [1]
    bogus: 3
    configs:
      a: {mode: max-autotuned}
      b:
        options: {max_autotun: true}
    """
    errs = errors_of(text, "my.yaml")
    assert len(errs) == 3, [str(e) for e in errs]
    by_line = {e.line: e for e in errs}
    assert sorted(by_line) == [4, 6, 8]
    assert all(e.file == "my.yaml" for e in errs)
    assert "unknown key 'bogus'" in by_line[4].message
    assert "unknown mode 'max-autotuned'" in by_line[6].message
    assert "'max-autotune'" in by_line[6].message  # suggestion / list of valid modes
    assert "unknown Inductor option 'max_autotun'" in by_line[8].message
    assert "did you mean 'max_autotune'" in by_line[8].message
    assert str(by_line[8]).startswith("my.yaml:8: ")


def test_duplicate_top_level_key_names_both_lines():
    text = VALID + "name: u\n"
    err = one_error(text, "duplicate key 'name'", "line 1")
    assert err.line == 6


def test_duplicate_key_inside_config_names_both_lines():
    text = """\
    name: t
    models: [hf:microsoft/resnet-50]
    batch_sizes: [1]
    configs:
      a:
        mode: default
        mode: max-autotune
    """
    err = one_error(text, "duplicate key 'mode'", "first defined on line 6")
    assert err.line == 7


def test_duplicate_keys_do_not_hide_other_problems():
    text = """\
    name: t
    name: u
    models: [hf:microsoft/resnet-50]
    batch_sizes: [0]
    configs: {a: {}}
    """
    errs = errors_of(text)
    assert [e.line for e in errs] == [2, 4]


def test_mode_with_options_is_an_error():
    text = VALID + "  fast: {mode: max-autotune, options: {max_autotune: true}}\n"
    err = one_error(text, "`mode` and `options` cannot be combined")
    assert err.line == 6


def test_unknown_backend_suggests_inductor():
    text = VALID + "  b: {backend: inductorr}\n"
    err = one_error(text, "unknown backend 'inductorr'", "did you mean 'inductor'")
    assert err.line == 6


def test_mode_on_non_inductor_backend():
    text = VALID + "  b: {backend: eager, mode: max-autotune}\n"
    one_error(text, "inductor backend only")


@pytest.mark.parametrize(
    ("body", "fragment"),
    [
        ("{fullgraph: 1}", "fullgraph must be true or false"),
        ("{dynamic: maybe}", "dynamic must be true, false or null"),
        ("{options: [max_autotune]}", "options must be a mapping"),
        ("{mode: 3}", "mode must be a string"),
        ("{timeout_s: 0}", "timeout_s must be a positive number"),
        ("{colour: red}", "unknown key 'colour' in config 'b'"),
        ("[1, 2]", "must be a mapping of torch.compile settings"),
    ],
)
def test_bad_config_fields(body, fragment):
    text = VALID + f"  b: {body}\n"
    err = one_error(text, fragment)
    assert err.line == 6


def test_config_named_eager_is_reserved():
    text = VALID.replace("default: {}", "eager: {}")
    err = one_error(text, "'eager' is reserved")
    assert err.line == 5


def test_unknown_model_id_lists_known_ids():
    text = VALID.replace("hf:microsoft/resnet-50", "hf:microsoft/resnet-5000")
    err = one_error(text, "unknown model id 'hf:microsoft/resnet-5000'", "hf:microsoft/resnet-50,")
    assert "hf:google/vit-base-patch16-224" in err.message
    assert err.line == 2


@pytest.mark.parametrize("model_id", ["python:workers.toy", "python:workers.toy:", "python:1bad.mod:fn"])
def test_malformed_python_id(model_id):
    text = VALID.replace("[hf:microsoft/resnet-50]", f"['{model_id}']")
    err = one_error(text, "malformed python model id", "python:package.module:factory")
    assert err.line == 2


def test_python_id_of_missing_module():
    text = VALID.replace("[hf:microsoft/resnet-50]", "['python:no_such_pkg_xyz.mod:fn']")
    one_error(text, "'no_such_pkg_xyz.mod'", "not importable")


def test_python_id_of_existing_module_is_valid():
    spec = parse_spec(VALID.replace("[hf:microsoft/resnet-50]", "['python:workers.toy:mlp']"))
    assert spec.models == (ModelSpec(id="python:workers.toy:mlp", name="mlp"),)


@pytest.mark.parametrize(
    ("value", "shown"),
    [("0", "0"), ("-2", "-2"), ("1.5", "1.5"), ("true", "True"), ("'4'", "'4'"), ("null", "None")],
)
def test_bad_batch_size(value, shown):
    text = VALID.replace("batch_sizes: [1]", f"batch_sizes:\n  - 2\n  - {value}")
    err = one_error(text, "batch size must be a positive integer", f"got {shown}")
    assert err.line == 5


def test_duplicate_batch_sizes():
    text = VALID.replace("batch_sizes: [1]", "batch_sizes:\n  - 1\n  - 4\n  - 4")
    err = one_error(text, "4 appears twice in 'batch_sizes'")
    assert err.line == 6


@pytest.mark.parametrize("value", ["[]", "4", "{a: 1}"])
def test_batch_sizes_must_be_a_non_empty_list(value):
    one_error(
        VALID.replace("batch_sizes: [1]", f"batch_sizes: {value}"), "'batch_sizes' must be a non-empty list"
    )


def test_unknown_dtype():
    text = VALID + "dtypes: [fp32, fp64]\n"
    err = one_error(text, "unknown dtype 'fp64'", "fp32-strict, fp32, tf32, fp16, bf16")
    assert err.line == 6


def test_dtype_aliases_are_canonicalized():
    spec = parse_spec(VALID + "dtypes: [float32, bfloat16, float16, tf32, strict]\n")
    assert spec.dtypes == ("fp32", "bf16", "fp16", "tf32", "fp32-strict")


def test_dtypes_default_to_fp32():
    assert parse_spec(VALID).dtypes == ("fp32",)


def test_alias_and_canonical_name_are_duplicates():
    text = VALID + "dtypes:\n  - fp32\n  - float32\n"
    err = one_error(text, "'fp32' appears twice in 'dtypes'")
    assert err.line == 8


def test_duplicate_dtype_line_after_an_invalid_dtype():
    text = VALID + "dtypes:\n  - bogus\n  - fp32\n  - float32\n"
    errs = errors_of(text)
    dup = [e for e in errs if "appears twice" in e.message]
    assert [e.line for e in dup] == [9]


def test_duplicate_model_name_line_after_a_skipped_model():
    text = """\
    name: t
    models:
      - 42
      - {id: hf:microsoft/resnet-50, name: r}
      - {id: hf:microsoft/resnet-50, name: r}
    batch_sizes: [1]
    configs: {a: {}}
    """
    errs = errors_of(text)
    dup = [e for e in errs if "appears twice" in e.message]
    assert [e.line for e in dup] == [5]


def test_duplicate_model_names():
    text = VALID.replace("[hf:microsoft/resnet-50]", "[hf:microsoft/resnet-50, hf:microsoft/resnet-50]")
    one_error(text, "'resnet-50' appears twice in 'models'")


def test_unknown_key_in_model_entry():
    text = VALID.replace("[hf:microsoft/resnet-50]", "\n  - id: hf:microsoft/resnet-50\n    colour: red")
    err = one_error(text, "unknown key 'colour' in a model", "overrides")
    assert err.line == 4


@pytest.mark.parametrize(
    ("entry", "fragment"),
    [
        ("{name: x}", "model needs an 'id'"),
        ("42", "a model is an id string or a mapping"),
        ("{id: hf:microsoft/resnet-50, name: 'a b'}", "model name 'a b' must be 1-100 letters"),
        ("{id: hf:microsoft/resnet-50, task: dance}", "unknown task 'dance'"),
        ("{id: hf:microsoft/resnet-50, input_size: 0}", "input_size must be a positive integer"),
        ("{id: hf:microsoft/resnet-50, overrides: [1]}", "overrides must be a mapping"),
        ("{id: hf:microsoft/resnet-50, timeout_s: -3}", "timeout_s must be a positive number"),
    ],
)
def test_bad_model_entries(entry, fragment):
    text = VALID.replace("[hf:microsoft/resnet-50]", f"\n  - {entry}")
    err = one_error(text, fragment)
    assert err.line == 3


def test_unknown_key_in_measure():
    text = VALID + "measure:\n  warmup: 1\n  iters: 3\n"
    err = one_error(text, "unknown key 'iters' in measure", "iterations")
    assert err.line == 8


@pytest.mark.parametrize(
    ("body", "fragment"),
    [
        ("{warmup: -1}", "warmup must be an integer >= 0"),
        ("{iterations: 0}", "iterations must be an integer >= 1"),
        ("{iterations: 2.5}", "iterations must be an integer >= 1"),
        ("{repeats: 0}", "repeats must be an integer >= 1"),
        ("{repeats: three}", "repeats must be an integer >= 1"),
        ("[1]", "measure must be a mapping"),
    ],
)
def test_bad_measure(body, fragment):
    one_error(VALID + f"measure: {body}\n", fragment)


def test_invalid_yaml_reports_a_line():
    text = """\
    name: t
    models: [hf:microsoft/resnet-50
    batch_sizes: [1]
    configs: {a: {}}
    """
    err = one_error(text, "invalid YAML")
    assert err.line in (2, 3)  # PyYAML notices the unclosed list on the line after it


def test_tab_indentation_is_invalid_yaml_with_line():
    err = one_error("name: t\nconfigs:\n\tdefault: {}\n", "invalid YAML")
    assert err.line == 3


@pytest.mark.parametrize("text", ["", "\n\n", "# only a comment\n"])
def test_empty_file(text):
    err = one_error(text, "the file is empty")
    assert err.line == 1


def test_file_that_is_not_a_mapping():
    one_error("- a\n- b\n", "a sweep file is a mapping")


def test_missing_required_keys():
    errs = errors_of("description: nothing else\n")
    messages = "\n".join(e.message for e in errs)
    for key in ("'models'", "'batch_sizes'", "'configs'"):
        assert f"missing required key {key}" in messages
    assert "needs a 'name'" in messages
    assert len(errs) == 4


@pytest.mark.parametrize("name", ["'a b'", "'-x'", "3", "''"])
def test_bad_sweep_name(name):
    err = one_error(VALID.replace("name: t", f"name: {name}"), "the sweep needs a 'name'")
    assert err.line == 1


@pytest.mark.parametrize("value", ["-1", "0", "true", "soon"])
def test_bad_sweep_timeout(value):
    err = one_error(VALID + f"timeout_s: {value}\n", "timeout_s must be a positive number")
    assert err.line == 6


@pytest.mark.parametrize("value", ["null", "[]", "{}", "[a, b]"])
def test_configs_must_be_a_non_empty_mapping(value):
    one_error(
        VALID.replace("configs:\n  default: {}\n", f"configs: {value}\n"),
        "'configs' must be a non-empty mapping",
    )


@pytest.mark.parametrize(
    ("value", "fragment"),
    [
        ("[]", "hardware must be 'auto' or a list"),
        ("[A100, 'bad name']", "hardware must be 'auto' or a list"),
        ("[A100, 7]", "hardware must be 'auto' or a list"),
        ("{A100: 1}", "hardware must be 'auto' or a list"),
        ("[A100, T4, A100]", "'A100' appears twice in 'hardware'"),
    ],
)
def test_bad_hardware(value, fragment):
    err = one_error(VALID + f"hardware: {value}\n", fragment)
    assert err.line == 6


@pytest.mark.parametrize(
    ("value", "expected"),
    [("auto", "auto"), ("cpu", ("cpu",)), ("[A100, T4]", ("A100", "T4")), (None, "auto")],
)
def test_valid_hardware(value, expected):
    text = VALID if value is None else VALID + f"hardware: {value}\n"
    assert parse_spec(text).hardware == expected


def test_all_problems_reported_at_once():
    text = """\
    name: t
    models: [hf:nope/nope]
    batch_sizes: [0]
    dtypes: [fp64]
    configs: {eager: {}}
    timeout_s: -1
    extra: 1
    """
    errs = errors_of(text)
    assert len(errs) >= 5
    assert {e.line for e in errs} == {2, 3, 4, 5, 6, 7}
    exc_text = str(SpecError(errs))
    assert f"{len(errs)} problem(s)" in exc_text


def test_load_spec_reports_the_file_path(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text(VALID + "bogus: 1\n")
    with pytest.raises(SpecError) as info:
        load_spec(path)
    (err,) = info.value.errors
    assert err.file == str(path)
    assert str(err) == f"{path}:6: " + err.message


def test_load_spec_of_a_missing_file(tmp_path):
    with pytest.raises(SpecError) as info:
        load_spec(tmp_path / "nope.yaml")
    (err,) = info.value.errors
    assert "cannot read" in err.message


# --- a valid spec ---------------------------------------------------------------------------------

FULL = """\
name: full
description: everything set
models:
  - hf:microsoft/resnet-50
  - id: hf:google/vit-base-patch16-224
    name: vit-tiny
    input_size: 64
    task: image-classification
    overrides: {hidden_size: 64, num_hidden_layers: 2}
    timeout_s: 10
batch_sizes: [1, 8]
dtypes: [float32, bf16]
configs:
  default: {}
  ro: {mode: reduce-overhead, timeout_s: 50}
  ma: {mode: max-autotune}
  tuned:
    options: {max_autotune: true, coordinate_descent_tuning: true}
    fullgraph: true
    dynamic: false
hardware: [cpu]
measure: {warmup: 2, iterations: 7}
timeout_s: 100
"""


def test_valid_spec_round_trips_into_dataclasses(tmp_path):
    path = tmp_path / "full.yaml"
    path.write_text(FULL)
    spec = load_spec(path)
    assert isinstance(spec, SweepSpec)
    assert spec.name == "full"
    assert spec.description == "everything set"
    assert spec.source == str(path)
    assert spec.models == (
        ModelSpec(id="hf:microsoft/resnet-50", name="resnet-50"),
        ModelSpec(
            id="hf:google/vit-base-patch16-224",
            name="vit-tiny",
            task="image-classification",
            input_size=64,
            overrides={"hidden_size": 64, "num_hidden_layers": 2},
            timeout_s=10.0,
        ),
    )
    assert spec.batch_sizes == (1, 8)
    assert spec.dtypes == ("fp32", "bf16")
    assert [c.name for c in spec.configs] == ["default", "ro", "ma", "tuned"]
    assert spec.configs[1] == CompileConfig(name="ro", mode="reduce-overhead", timeout_s=50.0)
    assert spec.hardware == ("cpu",)
    assert spec.measure == MeasureSpec(warmup=2, iterations=7)
    assert spec.timeout_s == 100.0
    assert spec.raw["configs"]["ma"] == {"mode": "max-autotune"}


def test_compile_kwargs():
    configs = {c.name: c for c in parse_spec(FULL).configs}
    assert configs["default"].compile_kwargs() == {"backend": "inductor", "fullgraph": False, "dynamic": None}
    assert configs["ro"].compile_kwargs() == {
        "backend": "inductor",
        "fullgraph": False,
        "dynamic": None,
        "mode": "reduce-overhead",
    }
    assert configs["tuned"].compile_kwargs() == {
        "backend": "inductor",
        "fullgraph": True,
        "dynamic": False,
        "options": {"max_autotune": True, "coordinate_descent_tuning": True},
    }


def test_measure_defaults_when_absent():
    assert parse_spec(VALID).measure == MeasureSpec()
    assert parse_spec(VALID + "measure: {iterations: 3}\n").measure == MeasureSpec(warmup=5, iterations=3)


def test_timeout_precedence_model_over_config_over_sweep():
    jobs = expand(parse_spec(FULL), {"cpu": "cpu"}, stack={})
    timeouts = {(j.model.name, j.config.name): j.timeout_s for j in jobs}
    for cfg in ("default", "ro", "ma", "tuned"):
        assert timeouts["vit-tiny", cfg] == 10.0  # the model's own limit wins
    assert timeouts["resnet-50", "ro"] == 50.0  # then the config's
    assert timeouts["resnet-50", "default"] == 100.0  # then the sweep's
    assert timeouts["resnet-50", "ma"] == 100.0  # the sweep's wins over the mode default


def test_timeout_falls_back_to_per_mode_default():
    spec = parse_spec(FULL.replace("timeout_s: 100\n", ""))
    assert spec.timeout_s is None
    timeouts = {(j.model.name, j.config.name): j.timeout_s for j in expand(spec, {"cpu": "cpu"}, stack={})}
    assert timeouts["resnet-50", "default"] == DEFAULT_TIMEOUT_BY_MODE[None]
    assert timeouts["resnet-50", "tuned"] == DEFAULT_TIMEOUT_BY_MODE[None]
    assert timeouts["resnet-50", "ma"] == DEFAULT_TIMEOUT_BY_MODE["max-autotune"]
    assert DEFAULT_TIMEOUT_BY_MODE["max-autotune"] > DEFAULT_TIMEOUT_BY_MODE[None]
    assert timeouts["resnet-50", "ro"] == 50.0
    assert timeouts["vit-tiny", "ma"] == 10.0


# --- the shipped sweep files ----------------------------------------------------------------------


def test_there_are_sweep_files():
    assert SWEEP_FILES, "sweeps/*.yaml is empty"


@pytest.mark.parametrize("path", SWEEP_FILES, ids=[p.name for p in SWEEP_FILES])
def test_every_sweep_file_validates(path):
    spec = load_spec(path)
    assert spec.models and spec.batch_sizes and spec.configs and spec.dtypes
    jobs = expand(spec, {"cpu": "cpu"}, stack={})
    policies = policies_of(spec, "cpu")  # with accuracy budgets: the precisions the class searches
    assert set(spec.dtypes) <= set(policies) and (spec.accuracy or policies == spec.dtypes)
    assert len(jobs) == len(spec.models) * len(spec.batch_sizes) * len(policies) * len(spec.configs)


def test_measure_repeats():
    assert parse_spec(VALID + "measure: {repeats: 3}\n").measure.repeats == 3
    assert parse_spec(VALID).measure.repeats == 1  # quick sweeps: one process per cell


def test_seed_vision_sweep_times_each_cell_in_three_processes():
    assert load_spec(Path(__file__).parents[2] / "sweeps" / "vision.yaml").measure.repeats == 3


def test_freezing_is_a_config_field_not_an_option():
    frozen = VALID.replace("  default: {}", "  default: {freezing: true, options: {max_autotune: true}}")
    spec = parse_spec(frozen)
    assert spec.configs[0].freezing is True and spec.configs[0].options == {"max_autotune": True}
    err = one_error(VALID.replace("  default: {}", "  default: {options: {freezing: true}}"), "has no effect")
    assert "write `freezing: true` beside `options`" in str(err)
    one_error(
        VALID.replace("  default: {}", "  default: {freezing: maybe}"), "freezing must be true or false"
    )
