"""A sweep model's `weights:` key: random (the default), pretrained (the local Hugging Face cache)
or a checkpoint directory. Its validation (file:line errors from `parse_spec`), its part in job ids,
and one real job in a subprocess that loads a small checkpoint this file writes. No mocks: real
transformers models, real checkpoints, a real `workers.bench` process."""

from __future__ import annotations

import copy
import math
from pathlib import Path

import huggingface_hub.constants
import pytest
import torch

from compiler import measure
from compiler.config import CompileConfig
from compiler.job import Job, MeasureSpec, ModelSpec, _identity
from orchestrator.spec.matrix import expand
from orchestrator.spec.sweep import SpecError, parse_spec
from workers import zoo
from workers.runner import run_job

RESNET = "hf:microsoft/resnet-50"
SMALL = zoo.SMALL_IMAGE_SIZE
FILE = "sweep.yaml"
STACK = {"python": "3.11", "torch": "2.13.0", "triton": "absent", "transformers": "4.50.0"}


def small_overrides() -> dict:
    return copy.deepcopy(zoo.SMALL_OVERRIDES[RESNET])


def sweep(model_lines: str) -> str:
    """A one-model sweep; `model_lines` is the model entry, its first line starting `- id: ...`
    (line 3 of the file)."""
    entry = "\n".join("  " + line for line in model_lines.strip("\n").splitlines())
    return f"name: w\nmodels:\n{entry}\nbatch_sizes: [1]\ndtypes: [fp32]\nconfigs:\n  c: {{}}\n"


def line_of(text: str, needle: str) -> int:
    """The 1-based line of the only line of `text` holding `needle`."""
    lines = [n for n, line in enumerate(text.splitlines(), start=1) if needle in line]
    assert len(lines) == 1, (needle, lines)
    return lines[0]


def refused(text: str, needle: str) -> str:
    """The one error `parse_spec` gives for `text`, checked to name the file and the line of
    `needle`; its message."""
    with pytest.raises(SpecError) as info:
        parse_spec(text, FILE)
    errors = info.value.errors
    assert len(errors) == 1, [str(e) for e in errors]
    line = line_of(text, needle)
    assert (errors[0].file, errors[0].line) == (FILE, line)
    assert str(info.value).startswith(f"{FILE}:{line}: ")
    return errors[0].message


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    """A small ResNet checkpoint (`save_pretrained`) whose weights a seeded rebuild cannot
    reproduce, so an output that matches it proves it was loaded."""
    model = zoo.get_entry(RESNET).build(small_overrides())
    generator = torch.Generator().manual_seed(99)
    with torch.no_grad():
        for param in model.parameters():
            param.add_(0.05 * torch.randn(param.shape, generator=generator))
    path = tmp_path_factory.mktemp("resnet-ckpt")
    model.save_pretrained(path)
    assert (path / "config.json").is_file()
    return path


# --- validation -------------------------------------------------------------------------------------------


def test_a_checkpoint_directory_passes_and_is_kept_as_written(checkpoint):
    spec = parse_spec(
        sweep(f"- id: {RESNET}\n  name: r\n  input_size: {SMALL}\n  weights: {checkpoint}"), FILE
    )
    assert spec.models[0].weights == str(checkpoint)
    assert spec.models[0].overrides == {}


def test_weights_default_to_random():
    spec = parse_spec(sweep(f"- id: {RESNET}\n  name: r"), FILE)
    assert spec.models[0].weights == "random"
    explicit = parse_spec(sweep(f"- id: {RESNET}\n  name: r\n  weights: random"), FILE)
    assert explicit.models[0] == spec.models[0]


def test_a_directory_without_config_json_is_refused(tmp_path):
    (tmp_path / "model.safetensors").write_bytes(b"not a checkpoint")
    text = sweep(f"- id: {RESNET}\n  name: r\n  weights: {tmp_path}")
    message = refused(text, "weights:")
    assert "no config.json" in message
    assert str(tmp_path) in message


def test_a_missing_directory_is_refused(tmp_path):
    text = sweep(f"- id: {RESNET}\n  name: r\n  weights: {tmp_path / 'nowhere'}")
    assert "no config.json" in refused(text, "weights:")


@pytest.mark.parametrize("weights", ["pretrained", "CHECKPOINT"])
def test_weights_on_a_python_model_are_refused(weights, checkpoint):
    weights = str(checkpoint) if weights == "CHECKPOINT" else weights
    text = sweep(f'- id: "python:workers.toy:mlp"\n  name: mlp\n  weights: {weights}')
    message = refused(text, "weights:")
    assert "checkpoints load for the zoo's hf: models only" in message
    assert "python:workers.toy:mlp" in message


def test_a_checkpoint_with_overrides_is_refused(checkpoint):
    text = sweep(f"- id: {RESNET}\n  name: r\n  weights: {checkpoint}\n  overrides: {{embedding_size: 16}}")
    message = refused(text, "weights:")
    assert "drop `overrides`" in message


def test_random_weights_with_overrides_pass():
    spec = parse_spec(
        sweep(f"- id: {RESNET}\n  name: r\n  weights: random\n  overrides: {{embedding_size: 16}}")
    )
    assert spec.models[0].overrides == {"embedding_size": 16}


@pytest.mark.parametrize("value", ['""', "3", "[a]", "null"])
def test_weights_that_are_not_a_string_are_refused(value):
    text = sweep(f"- id: {RESNET}\n  name: r\n  weights: {value}")
    assert "weights must be random, pretrained or a checkpoint directory" in refused(text, "weights:")


def test_pretrained_outside_the_local_cache_says_how_to_get_it(tmp_path, monkeypatch):
    empty = tmp_path / "hf-cache"
    empty.mkdir()
    monkeypatch.setenv("HF_HUB_CACHE", str(empty))
    # huggingface_hub reads HF_HUB_CACHE once, when it is imported (transformers has imported it by
    # now): point the constant it looks in at the same empty directory.
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(empty))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    text = sweep(f"- id: {RESNET}\n  name: r\n  weights: pretrained")
    message = refused(text, "weights:")
    assert "microsoft/resnet-50 is not in the local Hugging Face cache" in message
    assert str(empty) in message
    assert "hf download microsoft/resnet-50" in message
    assert "weights: DIR" in message


# --- job ids ------------------------------------------------------------------------------------------------


def only_job(text: str) -> Job:
    jobs = expand(parse_spec(text, FILE), {"cpu": "cpu"}, stack=STACK)
    assert len(jobs) == 1
    return jobs[0]


def test_random_weights_keep_the_job_id_a_checkpoint_changes_it(checkpoint):
    entry = f"- id: {RESNET}\n  name: r\n  input_size: {SMALL}"
    without = only_job(sweep(entry))
    random = only_job(sweep(entry + "\n  weights: random"))
    loaded = only_job(sweep(entry + f"\n  weights: {checkpoint}"))
    assert random.model.weights == without.model.weights == "random"
    assert loaded.model.weights == str(checkpoint)
    # "random" is left out of the identity, as before the field existed, so old outputs resume
    assert "weights" not in _identity(random)["model"]
    assert _identity(loaded)["model"]["weights"] == str(checkpoint)
    assert random.job_id == without.job_id
    assert loaded.job_id != random.job_id


def test_two_checkpoints_have_two_job_ids(tmp_path):
    base = Job(
        sweep="s",
        hardware="cpu",
        device="cpu",
        model=ModelSpec(id=RESNET, name="r"),
        batch_size=1,
        dtype="fp32",
        config=CompileConfig(name="c"),
        measure=MeasureSpec(),
        timeout_s=60,
        stack=STACK,
    )
    ids = {
        Job(**{**base.__dict__, "model": ModelSpec(id=RESNET, name="r", weights=w)}).job_id
        for w in ("random", "pretrained", str(tmp_path / "a"), str(tmp_path / "b"))
    }
    assert len(ids) == 4


# --- one real job -------------------------------------------------------------------------------------------


def fp64_first_outputs(model: torch.nn.Module) -> list[torch.Tensor]:
    """The model's fp64 outputs on the job's first input set (`workers.bench` builds input set k
    with `torch.Generator().manual_seed(k)`, and its fp64 reference runs on set 0)."""
    inputs = zoo.get_entry(RESNET).make_inputs(model, 1, SMALL, torch.Generator().manual_seed(0))
    model64 = copy.deepcopy(model).double()
    inputs64 = {k: v.double() if v.is_floating_point() else v for k, v in inputs.items()}
    with torch.no_grad():
        return [t.double() for t in zoo.output_tensors(model64(**inputs64))]


def test_a_job_runs_the_checkpoint(checkpoint):
    job = Job(
        sweep="weights",
        hardware="cpu",
        device="cpu",
        model=ModelSpec(id=RESNET, name="r", input_size=SMALL, weights=str(checkpoint)),
        batch_size=1,
        dtype="fp32",
        config=CompileConfig(name="c", backend="eager"),
        measure=MeasureSpec(warmup=1, iterations=2, rounds=1, flops=False),
        timeout_s=120,
    )
    result = run_job(job, threads=1)
    assert result["status"] == "ok", (result.get("error"), result.get("traceback"))
    assert result["weights"] == str(checkpoint)
    assert result["task"] == "image-classification"
    for column in ("fp64_max_rel_err", "eager_fp64_max_rel_err"):
        assert isinstance(result[column], float) and 0 <= result[column] < 1e-4, (column, result[column])
    sensitivity = result["output_sensitivity"]
    assert isinstance(sensitivity, list) and len(sensitivity) == 3
    assert all(isinstance(s, float) and math.isfinite(s) for s in sensitivity)

    # Which weights ran: the job's output spread is a figure of its fp64 outputs on input set 0.
    # The checkpoint, loaded here, gives the same; the architecture with seeded random weights
    # (what `weights: random` would run) gives other outputs and another spread.
    ckpt = fp64_first_outputs(zoo.load_pretrained(RESNET, str(checkpoint)))
    rebuilt = fp64_first_outputs(zoo.get_entry(RESNET).build(small_overrides()))
    assert len(ckpt) == len(rebuilt) == 1 and ckpt[0].shape == rebuilt[0].shape
    assert not torch.allclose(ckpt[0], rebuilt[0], rtol=1e-3, atol=1e-3)
    ckpt_spread, random_spread = measure.output_spread(ckpt), measure.output_spread(rebuilt)
    assert abs(ckpt_spread - random_spread) > 1e-3 * ckpt_spread
    assert result["output_spread"] == pytest.approx(ckpt_spread, rel=1e-9)


def test_a_relative_checkpoint_is_made_absolute_for_the_job_which_runs_elsewhere(checkpoint, monkeypatch):
    # a job runs in a scratch directory of its own: the path it gets must not depend on where it runs
    monkeypatch.chdir(checkpoint.parent)
    spec = parse_spec(sweep(f"- id: {RESNET}\n  weights: {checkpoint.name}"), FILE)
    assert spec.models[0].weights == str(checkpoint)


def test_two_entries_that_differ_only_in_weights_are_two_models(checkpoint):
    text = sweep(f"- {{id: {RESNET}, name: rand}}\n- {{id: {RESNET}, name: ckpt, weights: {checkpoint}}}")
    spec = parse_spec(text, FILE)
    assert [m.weights for m in spec.models] == ["random", str(checkpoint)]
    jobs = expand(spec, {"cpu": "cpu"}, stack=STACK)
    assert len({j.job_id for j in jobs}) == 2
