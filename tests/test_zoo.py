"""Fast tests of the model zoo: reduced model sizes only (SMALL_OVERRIDES), no network."""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass

import pytest
import torch
from transformers.modeling_outputs import ImageClassifierOutput

from workers import hf_checkpoints, hf_models, toy, zoo

BENCHMARK_IDS = {
    "hf:google/vit-base-patch16-224",
    "hf:microsoft/beit-base-patch16-224-pt22k-ft22k",
    "hf:facebook/convnext-large-224",
    "hf:microsoft/resnet-50",
    "hf:nvidia/segformer-b0-finetuned-ade-512-512",
    "hf:facebook/mask2former-swin-tiny-coco-panoptic",
    "hf:facebook/maskformer-swin-base-ade",
    "hf:google/deeplabv3_mobilenet_v2_1.0_513",
    "hf:google/owlvit-base-patch32",
    "hf:facebook/detr-resnet-50",
    "hf:facebook/detr-resnet-101",
    "hf:microsoft/conditional-detr-resnet-50",
}
RESNET = "hf:microsoft/resnet-50"
VIT = "hf:google/vit-base-patch16-224"
DETR = "hf:facebook/detr-resnet-50"
OWLVIT = "hf:google/owlvit-base-patch32"
SMALL = zoo.SMALL_IMAGE_SIZE


def small_model(model_id: str) -> torch.nn.Module:
    return zoo.get_entry(model_id).build(copy.deepcopy(zoo.SMALL_OVERRIDES[model_id]))


def small_inputs(model_id: str, model: torch.nn.Module, batch_size: int = 1, seed: int = 0) -> dict:
    generator = torch.Generator().manual_seed(seed)
    return zoo.get_entry(model_id).make_inputs(model, batch_size, SMALL, generator)


# --- registry ---------------------------------------------------------------------------------------------


def test_registry_refuses_duplicates():
    registry = zoo.Registry("widget")
    registry.register("a", 1)
    with pytest.raises(ValueError, match="'a' is already registered"):
        registry.register("a", 2)
    assert registry.get("a") == 1


def test_registry_lookup_error_names_the_choices():
    registry = zoo.Registry("widget", zoo.UnknownModelError)
    registry.register("beta", 1)
    registry.register("alpha", 2)
    with pytest.raises(zoo.UnknownModelError, match="unknown widget 'gamma'; known: alpha, beta"):
        registry.get("gamma")


def test_default_registry_is_fresh_each_time_and_complete():
    first, second = zoo.build_default_registry(), zoo.build_default_registry()
    assert first is not second
    assert set(first.names()) == BENCHMARK_IDS
    assert zoo.known_model_ids() == sorted(BENCHMARK_IDS)


def test_unknown_id_error_lists_every_known_id():
    with pytest.raises(KeyError) as raised:
        zoo.get_entry("hf:nobody/nothing")
    assert isinstance(raised.value, zoo.UnknownModelError)
    message = str(raised.value)
    assert "hf:nobody/nothing" in message
    for model_id in BENCHMARK_IDS:
        assert model_id in message


CHECKPOINT_TASK_AND_SIZE = {
    "hf:google/vit-base-patch16-224": ("image-classification", 224),
    "hf:microsoft/beit-base-patch16-224-pt22k-ft22k": ("image-classification", 224),
    "hf:facebook/convnext-large-224": ("image-classification", 224),
    "hf:microsoft/resnet-50": ("image-classification", 224),
    "hf:nvidia/segformer-b0-finetuned-ade-512-512": ("image-segmentation", 512),
    "hf:facebook/mask2former-swin-tiny-coco-panoptic": ("image-segmentation", 384),
    "hf:facebook/maskformer-swin-base-ade": ("image-segmentation", 512),
    "hf:google/deeplabv3_mobilenet_v2_1.0_513": ("image-segmentation", 513),
    "hf:google/owlvit-base-patch32": ("zero-shot-object-detection", 768),
    "hf:facebook/detr-resnet-50": ("object-detection", 800),
    "hf:facebook/detr-resnet-101": ("object-detection", 800),
    "hf:microsoft/conditional-detr-resnet-50": ("object-detection", 800),
}


@pytest.mark.parametrize("model_id", sorted(BENCHMARK_IDS))
def test_entries_carry_checkpoint_metadata(model_id):
    entry = zoo.get_entry(model_id)
    assert entry.id == model_id
    assert (entry.task, entry.image_size) == CHECKPOINT_TASK_AND_SIZE[model_id]
    assert re.fullmatch(r".+ \(\d+\.\dM params\)", entry.summary)


def test_checkpoint_configs_match_the_hub():
    # Config objects only (cheap): the full-size models are checked by a one-off script, not here.
    specs = {spec.model_id: spec for spec in hf_checkpoints.SPECS}
    resnet = specs[RESNET].config()
    assert resnet.depths == [3, 4, 6, 3] and resnet.num_labels == 1000
    assert specs["hf:microsoft/beit-base-patch16-224-pt22k-ft22k"].config().num_labels == 21841
    detr101 = specs["hf:facebook/detr-resnet-101"].config()
    assert detr101.backbone_config.model_type == "resnet"  # transformers-native, no timm
    assert detr101.backbone_config.depths == [3, 4, 23, 3]
    assert detr101.num_labels == 91
    assert specs["hf:microsoft/conditional-detr-resnet-50"].config().num_queries == 300
    mask2former = specs["hf:facebook/mask2former-swin-tiny-coco-panoptic"].config()
    assert mask2former.backbone_config.model_type == "swin" and mask2former.num_labels == 133
    assert specs["hf:facebook/maskformer-swin-base-ade"].config().backbone_config.embed_dim == 128
    assert specs["hf:google/owlvit-base-patch32"].config().vision_config.image_size == 768


# --- python: ids ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("model_id", "known"),
    [
        ("python:workers.toy:mlp", True),
        ("python:pkg:fn", True),
        ("python:some.absent.module:factory", True),  # shape only, no import
        ("python:pkg.mod", False),
        ("python:pkg..mod:fn", False),
        ("python:pkg.mod:fn:extra", False),
        ("python:pkg-mod:fn", False),
        ("python:pkg.class:fn", False),  # a keyword cannot be a module name
        ("python::fn", False),
        ("hf:microsoft/resnet-50", True),
        ("hf:microsoft/resnet-51", False),
        ("microsoft/resnet-50", False),
    ],
)
def test_is_known(model_id, known):
    assert zoo.is_known(model_id) is known


def test_load_python_factory_returns_the_function():
    assert zoo.load_python_factory("python:workers.toy:mlp") is toy.mlp


def test_load_python_factory_errors_are_clear():
    with pytest.raises(ImportError, match="cannot import module 'no_such_pkg_zz.mod'"):
        zoo.load_python_factory("python:no_such_pkg_zz.mod:fn")
    with pytest.raises(AttributeError, match="no attribute 'nope'.*mlp"):
        zoo.load_python_factory("python:workers.toy:nope")
    with pytest.raises(TypeError, match="not callable"):
        zoo.load_python_factory("python:workers.toy:DEFAULT_INPUT_SIZE")
    with pytest.raises(ValueError, match="malformed"):
        zoo.load_python_factory("python:workers.toy")


# --- reduced builds -----------------------------------------------------------------------------------------


def test_small_overrides_cover_the_fast_models():
    assert {RESNET, VIT, DETR} <= set(zoo.SMALL_OVERRIDES)
    assert set(zoo.SMALL_OVERRIDES) <= BENCHMARK_IDS


@pytest.mark.parametrize("model_id", sorted(zoo.SMALL_OVERRIDES))
def test_small_model_builds_and_runs(model_id):
    model = small_model(model_id)
    assert not model.training
    assert sum(p.numel() for p in model.parameters()) < 1_000_000
    inputs = small_inputs(model_id, model, batch_size=2)
    assert inputs["pixel_values"].shape == (2, 3, SMALL, SMALL)
    assert inputs["pixel_values"].dtype == torch.float32
    with torch.no_grad():
        outputs = zoo.output_tensors(model(**inputs))
    assert outputs, "no tensors in the output"
    assert outputs[0].shape[0] == 2  # the task head's output (logits) is batch-first
    assert all(torch.isfinite(out).all() for out in outputs if out.is_floating_point())


def test_detr_family_gets_a_pixel_mask():
    model = small_model(DETR)
    inputs = small_inputs(DETR, model, batch_size=3)
    assert set(inputs) == {"pixel_values", "pixel_mask"}
    assert inputs["pixel_mask"].shape == (3, SMALL, SMALL)
    assert bool((inputs["pixel_mask"] == 1).all())
    with torch.no_grad():
        out = model(**inputs)
    assert out.logits.shape == (3, 10, 92)  # 10 queries (small), 91 COCO labels + "no object"
    assert out.pred_boxes.shape == (3, 10, 4)


def test_owlvit_gets_two_text_queries_per_image():
    model = small_model(OWLVIT)
    inputs = small_inputs(OWLVIT, model, batch_size=2)
    ids, mask = inputs["input_ids"], inputs["attention_mask"]
    assert ids.shape == mask.shape == (4, hf_models.TEXT_QUERY_LENGTH)
    vocab = model.config.text_config.vocab_size
    assert int(ids.min()) >= 0 and int(ids.max()) < vocab
    # eos (the highest id, where OWL-ViT pools) ends every query; padding is masked out
    eos_at = ids.argmax(dim=-1)
    assert bool((ids[torch.arange(4), eos_at] == vocab - 1).all())
    assert bool((mask.sum(dim=-1) == eos_at + 1).all())
    with torch.no_grad():
        out = model(**inputs)
    assert out.logits.shape[0] == 2 and out.logits.shape[-1] == 2  # [batch, patches, queries]


def test_vit_takes_image_size_from_its_config():
    model = small_model(VIT)
    entry = zoo.get_entry(VIT)
    inputs = entry.make_inputs(model, 1, 224, torch.Generator().manual_seed(0))
    assert inputs["pixel_values"].shape == (1, 3, SMALL, SMALL)
    resnet = small_model(RESNET)
    inputs = zoo.get_entry(RESNET).make_inputs(resnet, 1, 96, torch.Generator().manual_seed(0))
    assert inputs["pixel_values"].shape == (1, 3, 96, 96)


def test_build_and_inputs_are_deterministic():
    first, second = small_model(RESNET), small_model(RESNET)
    for (name, a), (_, b) in zip(first.state_dict().items(), second.state_dict().items(), strict=True):
        assert torch.equal(a, b), name
    same = small_inputs(RESNET, first, seed=1), small_inputs(RESNET, first, seed=1)
    other = small_inputs(RESNET, first, seed=2)
    assert torch.equal(same[0]["pixel_values"], same[1]["pixel_values"])
    assert not torch.equal(same[0]["pixel_values"], other["pixel_values"])


def test_build_leaves_the_callers_rng_alone():
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    small_model(RESNET)
    assert torch.equal(torch.rand(3), expected)


def test_overrides_reach_the_config_including_nested_and_aliases():
    overrides = copy.deepcopy(zoo.SMALL_OVERRIDES[DETR])
    overrides["hidden_size"] = 16  # DETR's alias of d_model
    snapshot = copy.deepcopy(overrides)
    model = zoo.get_entry(DETR).build(overrides)
    assert overrides == snapshot, "build must not mutate the overrides"
    assert model.config.d_model == 16
    assert model.config.backbone_config.depths == [1, 1, 1, 1]
    assert model.config.backbone_config.hidden_sizes == [16, 32, 64, 128]
    assert model.config.backbone_config.embedding_size == 16
    assert model.config.num_queries == 10


def test_unknown_override_raises_value_error_naming_valid_attributes():
    entry = zoo.get_entry(RESNET)
    with pytest.raises(ValueError, match=r"\['hiden_sizes'\].*valid attributes: .*'hidden_sizes'"):
        entry.build({"hiden_sizes": [8, 8, 8, 8]})
    with pytest.raises(ValueError, match=r"\['depth'\] for .*backbone_config.*'depths'"):
        zoo.get_entry(DETR).build({"backbone_config": {"depth": [1, 1, 1, 1]}})


def test_bad_override_value_is_a_value_error():
    with pytest.raises(ValueError, match="hidden_size"):
        zoo.get_entry(VIT).build({**zoo.SMALL_OVERRIDES[VIT], "hidden_size": "wide"})


# --- outputs ------------------------------------------------------------------------------------------------


def test_output_tensors_flattens_model_outputs_in_field_order():
    logits, hidden = torch.ones(1, 3), torch.zeros(1, 4)
    output = ImageClassifierOutput(logits=logits, hidden_states=(hidden, hidden + 1))
    flat = zoo.output_tensors(output)
    assert [t.shape for t in flat] == [(1, 3), (1, 4), (1, 4)]
    assert flat[0] is logits and torch.equal(flat[2], hidden + 1)


def test_output_tensors_flattens_nested_containers_stably():
    a, b, c, d = (torch.full((1,), float(i)) for i in range(4))

    @dataclass
    class Pair:
        left: torch.Tensor
        right: object

    nested = {"z": [a, (b, None)], "a": {"y": c, "x": "text"}, "m": Pair(d, 7)}
    assert [float(t) for t in zoo.output_tensors(nested)] == [2.0, 3.0, 0.0, 1.0]
    assert zoo.output_tensors(a)[0] is a
    assert zoo.output_tensors((None, 3, "x")) == []


def test_output_tensors_of_a_real_model_match_its_tuple_form():
    model = small_model(DETR)
    inputs = small_inputs(DETR, model)
    with torch.no_grad():
        flat = zoo.output_tensors(model(**inputs))
        as_tuple = zoo.output_tensors(model(**inputs, return_dict=False))
    assert len(flat) == len(as_tuple) == 4
    for x, y in zip(flat, as_tuple, strict=True):
        assert torch.equal(x, y)


# --- pretrained path ----------------------------------------------------------------------------------------


def _perturbed(model: torch.nn.Module) -> torch.nn.Module:
    # Weights that a seeded rebuild cannot reproduce, so equal outputs prove the weights were loaded.
    generator = torch.Generator().manual_seed(99)
    with torch.no_grad():
        for param in model.parameters():
            param.add_(0.05 * torch.randn(param.shape, generator=generator))
    return model


def _assert_same_weights(loaded: torch.nn.Module, model: torch.nn.Module) -> None:
    # Bit-equal weights; outputs are then compared with fp32 tolerances, because weights loaded
    # from a memory-mapped safetensors file sit at other alignments than freshly allocated ones,
    # which sends oneDNN's CPU convolutions down another (equally exact) summation order.
    expected, actual = model.state_dict(), loaded.state_dict()
    assert expected.keys() == actual.keys()
    for key, tensor in expected.items():
        assert torch.equal(actual[key], tensor), key


@pytest.mark.parametrize("model_id", [RESNET, DETR])
def test_load_pretrained_round_trip(model_id, tmp_path):
    model = _perturbed(small_model(model_id))
    model.save_pretrained(tmp_path)
    loaded = zoo.load_pretrained(model_id, str(tmp_path))
    assert type(loaded) is type(model)
    assert not loaded.training
    inputs = small_inputs(model_id, model)
    with torch.no_grad():
        expected = zoo.output_tensors(model(**inputs))
        actual = zoo.output_tensors(loaded(**inputs))
        rebuilt = zoo.output_tensors(small_model(model_id)(**inputs))
    _assert_same_weights(loaded, model)
    assert len(expected) == len(actual)
    for x, y in zip(expected, actual, strict=True):
        torch.testing.assert_close(y, x)
    assert not torch.equal(rebuilt[0], expected[0])


def test_load_pretrained_by_directory_uses_config_architectures(tmp_path):
    model = _perturbed(small_model(VIT))
    model.save_pretrained(tmp_path)
    loaded = zoo.load_pretrained(str(tmp_path), str(tmp_path))
    assert type(loaded).__name__ == "ViTForImageClassification"
    inputs = small_inputs(VIT, model)
    _assert_same_weights(loaded, model)
    with torch.no_grad():
        torch.testing.assert_close(loaded(**inputs).logits, model(**inputs).logits)


def test_load_pretrained_refuses_a_different_architecture(tmp_path):
    small_model(VIT).save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="'vit' config.*'resnet'"):
        zoo.load_pretrained(RESNET, str(tmp_path))


# --- toy factory --------------------------------------------------------------------------------------------


def test_toy_mlp_factory():
    model, inputs = toy.mlp(4)
    assert list(inputs) == ["x"] and inputs["x"].shape == (4, 128)
    layers = [type(m).__name__ for m in model.layers]
    assert layers == ["Linear", "GELU", "Linear", "GELU", "Linear"]
    assert model.layers[0].out_features == 256 and not model.training
    assert model(**inputs).shape == (4, 10)

    narrow, narrow_inputs = toy.mlp(2, 32, {"hidden": 16})
    assert narrow_inputs["x"].shape == (2, 32) and narrow.layers[0].weight.shape == (16, 32)

    again, again_inputs = toy.mlp(4)
    assert torch.equal(again.layers[0].weight, model.layers[0].weight)
    assert torch.equal(again_inputs["x"], inputs["x"])
    with pytest.raises(ValueError, match=r"\['width'\].*'hidden'"):
        toy.mlp(1, overrides={"width": 3})


def test_toy_conv_bn_factory_seeds_its_weights_and_has_trained_statistics():
    model, inputs = toy.conv_bn(2)
    assert inputs["x"].shape == (2, 3, 8, 8) and model(**inputs).shape == (2, 4) and not model.training
    bn = model.layers[1]
    assert not torch.equal(bn.running_var, torch.ones_like(bn.running_var))  # not the identity
    assert torch.equal(toy.conv_bn(2)[0].layers[0].weight, model.layers[0].weight)
    other, _ = toy.conv_bn(2, overrides={"seed": 1})
    assert not torch.equal(other.layers[0].weight, model.layers[0].weight)
    wide, wide_inputs = toy.conv_bn(1, 16, {"channels": 16})
    assert wide_inputs["x"].shape == (1, 3, 16, 16) and wide.layers[4].in_features == 16 * 14 * 14
    with pytest.raises(ValueError, match=r"\['width'\].*'channels'"):
        toy.conv_bn(1, overrides={"width": 3})


def test_toy_mlp_through_the_python_id():
    factory = zoo.load_python_factory("python:workers.toy:mlp")
    model, inputs = factory(2, None, {})
    assert model(**inputs).shape == (2, 10)


def test_model_class_of_every_registered_id_is_the_class_build_uses():
    for model_id in zoo.known_model_ids():
        cls = zoo.model_class(model_id)
        assert isinstance(cls, type) and issubclass(cls, torch.nn.Module), model_id
    assert type(small_model(RESNET)) is zoo.model_class(RESNET)


def test_a_python_model_job_and_a_plain_sweep_never_import_transformers(tmp_path):
    """transformers and the hf registry cost about 2 s of imports per job process and per CLI
    call, Inductor 2 s more: a python: model's job process and a sweep without hf: ids must not
    load transformers (it loads on first use of an hf: id), and validating configs without a mode
    or options must not load Inductor."""
    import subprocess
    import sys

    sweep = tmp_path / "s.yaml"
    sweep.write_text(
        "name: s\nmodels: [{id: 'python:workers.toy:mlp', name: mlp}]\nbatch_sizes: [1]\n"
        "configs: {default: {}}\nhardware: [cpu]\n"
    )
    code = (
        "import sys, torch\n"
        "from workers import zoo\n"
        "from workers.bench.run import JobRun\n"
        "from orchestrator.spec.sweep import load_spec\n"
        f"assert len(load_spec({str(sweep)!r}).models) == 1\n"
        "assert 'torch._inductor' not in sys.modules\n"
        "assert zoo.is_known('python:workers.toy:mlp') and not zoo.is_known('timm:x')\n"
        "import json, pathlib\n"
        "from compiler.config import CompileConfig\n"
        "from compiler.job import Job, MeasureSpec, ModelSpec\n"
        "job = Job(sweep='s', hardware='cpu', device='cpu', batch_size=1, dtype='fp32', timeout_s=60,\n"
        "          model=ModelSpec(id='python:workers.toy:mlp', name='mlp'), measure=MeasureSpec(),\n"
        "          config=CompileConfig(name='default'))\n"
        f"d = pathlib.Path({str(tmp_path)!r})\n"
        "(d / 'job.json').write_text(json.dumps(job.to_dict()))\n"
        "JobRun(d / 'job.json', d / 'result.json').imports()  # the job process's first phase\n"
        "model, inputs = zoo.load_python_factory('python:workers.toy:mlp')(2, None, None)\n"
        "assert len(zoo.output_tensors(model(**inputs))) == 1\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'transformers'"
        " or m in ('workers.hf_models', 'workers.hf_checkpoints')))\n"
        "assert zoo.is_known('hf:microsoft/resnet-50') and 'transformers' in sys.modules\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]", out


def test_model_outputs_keep_their_field_order_once_transformers_is_loaded():
    out = ImageClassifierOutput(logits=torch.ones(1), loss=torch.zeros(1))  # field order: loss, logits
    assert [t.item() for t in zoo.output_tensors(out)] == [0.0, 1.0]
