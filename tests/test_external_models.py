"""timm: and torchvision: ids on a machine without those packages (this CPU machine and CI).

Building the models needs the packages; tests/gpu/test_gpu.py does that on the GPU machine, whose
image has both.
"""

from __future__ import annotations

import pytest

from orchestrator.spec.sweep import SpecError, load_spec
from workers import external


@pytest.mark.parametrize(
    ("model_id", "expected"),
    [
        ("timm:resnet50", ("timm", "resnet50")),
        ("torchvision:deeplabv3_resnet50", ("torchvision", "deeplabv3_resnet50")),
    ],
)
def test_parse_id(model_id, expected):
    assert external.is_external_id(model_id)
    assert external.parse_id(model_id) == expected


@pytest.mark.parametrize("model_id", ["timm:", "torchvision:res net", "timm:a/b", "keras:resnet50"])
def test_malformed_ids_are_refused_with_an_example(model_id):
    with pytest.raises(ValueError, match="expected timm:<model name> or torchvision:<model name>"):
        external.parse_id(model_id)


@pytest.mark.skipif(external.installed("timm"), reason="checks the message for a missing package")
def test_missing_package_names_the_install_command():
    problem = external.check_id("timm:resnet50")
    assert "not installed" in problem and "pip install 'compile-orchestrator[timm]'" in problem
    with pytest.raises(ValueError, match=r"the project's timm extra"):
        external.build("timm:resnet50", {})


@pytest.mark.skipif(external.installed("torchvision"), reason="checks the message for a missing package")
def test_sweep_file_with_a_missing_library_fails_validation_at_its_line(tmp_path):
    sweep = tmp_path / "s.yaml"
    sweep.write_text(
        "name: s\nmodels:\n  - python:workers.toy:mlp\n  - torchvision:resnet50\n"
        "batch_sizes: [1]\nconfigs:\n  - {name: d}\nhardware: [cpu]\n"
    )
    with pytest.raises(SpecError) as caught:
        load_spec(sweep)
    text = str(caught.value)
    assert f"{sweep}:4:" in text and "pip install 'compile-orchestrator[torchvision]'" in text


def test_default_names_keep_the_library_apart():
    from orchestrator.spec.models import default_name as _default_name

    assert _default_name("timm:resnet50") == "timm-resnet50"
    assert _default_name("torchvision:resnet50") == "torchvision-resnet50"
