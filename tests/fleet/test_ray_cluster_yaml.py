"""ray_cluster.yaml (the AWS cluster-launcher config) against Ray's own schema, offline.

`ray up` does, in order (ray/autoscaler/_private/commands.py `_bootstrap_config`):
`prepare_config` (merge with Ray's AWS defaults.yaml, merge setup commands, check the docker
section, fill per-type min/max workers), then the AWS provider's
`fillout_available_node_types_resources` (EC2 DescribeInstanceTypes: needs AWS credentials and
network), then `validate_config` (ray-schema.json plus cross-field checks), then the provider's
`bootstrap_config` (IAM role, key pair, subnets, security groups: AWS calls; the AMI check at its
end is local). Here everything that is local runs for real: prepare_config, validate_config,
the legacy-field check and the AMI resolution of the AWS bootstrap, Ray's label syntax check and
the NVML-name -> accelerator type mapping Ray applies on the nodes. Nothing of Ray is mocked; the
network is blocked so that any attempt to reach AWS fails the test instead of hanging.
"""

from __future__ import annotations

import copy
import re
import socket
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from ray._private.accelerators import NvidiaGPUAcceleratorManager
from ray._private.label_utils import validate_node_label_syntax
from ray.autoscaler._private.aws.config import DEFAULT_AMI, _check_ami
from ray.autoscaler._private.providers import _get_default_config
from ray.autoscaler._private.util import check_legacy_fields, prepare_config, validate_config

from orchestrator.fleet.inventory import ACCEL_LABEL, classes_from_nodes

ROOT = Path(__file__).resolve().parents[2]
CONFIG_PATH = ROOT / "ray_cluster.yaml"
PROJECT_MOUNT = "/home/ray/compile-orchestrator"

# The stack the cluster image must hold: the Ray and Python versions this project is developed
# and tested with (Ray 2.60.0 on Python 3.11).
IMAGE_RAY_VERSION = "2.60.0"
IMAGE_PYTHON_TAG = "py311"

# EC2 instance type -> (vCPUs, GPUs, accelerator type), from the AWS instance type pages.
INSTANCES: dict[str, tuple[int, int, str | None]] = {
    "m5.2xlarge": (8, 0, None),
    "c6i.8xlarge": (32, 0, None),
    "p4d.24xlarge": (96, 8, "A100"),
    "p3.2xlarge": (8, 1, "V100"),
    "g4dn.xlarge": (4, 1, "T4"),
}
# The NVML device name of each accelerator type on those instances.
NVML_NAMES = {
    "A100": "NVIDIA A100-SXM4-40GB",
    "V100": "Tesla V100-SXM2-16GB",
    "T4": "Tesla T4",
}
ACCELERATOR_TYPES = {"A100", "V100", "T4"}
ACCEL_PREFIX = "accelerator_type:"


@pytest.fixture(autouse=True)
def no_network(monkeypatch):
    """Any socket connection (an AWS call) fails at once."""

    def refuse(self, *args, **kwargs):
        raise OSError("network access in an offline test")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket.socket, "connect_ex", refuse)


@pytest.fixture(scope="module")
def raw() -> dict[str, Any]:
    with CONFIG_PATH.open() as f:
        return yaml.safe_load(f)


@pytest.fixture
def config(raw) -> dict[str, Any]:
    return copy.deepcopy(raw)


@pytest.fixture
def prepared(config) -> dict[str, Any]:
    return prepare_config(config)


def _node_types(config: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return config["available_node_types"]


def _worker_types(config: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {k: v for k, v in _node_types(config).items() if k != config["head_node_type"]}


def _accel_resources(node_type: dict[str, Any]) -> dict[str, int]:
    return {k: v for k, v in node_type["resources"].items() if k.startswith(ACCEL_PREFIX)}


# --- Ray's own validation -------------------------------------------------------------------


def test_passes_rays_validation(prepared):
    validate_config(prepared)  # ray-schema.json + head type, min/max workers, synced files
    check_legacy_fields(prepared)  # the first step of the AWS bootstrap


def test_aws_bootstrap_ami_check_resolves_every_node_type(prepared):
    """`latest_dlami` is resolved by the local part of the AWS bootstrap, not a placeholder."""
    resolved = copy.deepcopy(prepared)
    _check_ami(resolved)
    region = prepared["provider"]["region"]
    for name, node_type in _node_types(resolved).items():
        assert node_type["node_config"]["ImageId"] == DEFAULT_AMI[region], name


def test_no_aws_default_leaks_in(raw, prepared):
    """prepare_config merges Ray's AWS defaults.yaml key by key (top level only): every command
    list must come from this file, or Ray's defaults (a nightly Ray wheel install) would run."""
    defaults = _get_default_config(raw["provider"])
    command_keys = [k for k in defaults if k.endswith("_commands")]
    assert command_keys
    for key in command_keys:
        assert key in raw, f"{key} would come from Ray's AWS defaults.yaml"
    assert raw["head_node_type"] in _node_types(raw)
    assert set(_node_types(prepared)) == set(_node_types(raw))


@pytest.mark.parametrize(
    "breakage, message",
    [
        (lambda c: c.update(max_workrs=3), "max_workrs' was unexpected"),  # unknown top-level key
        (lambda c: c.update(max_workers="many"), "'many' is not of type 'integer'"),
        (lambda c: c["available_node_types"]["t4"]["resources"].update(GPU=0.5), "0.5 is not of type"),
        (lambda c: c["available_node_types"]["a100"].update(labels={"x": 1}), "1 is not of type 'string'"),
        (lambda c: c["docker"].update(gpus="all"), "'gpus' was unexpected"),
        (lambda c: c.update(head_node_type="gpu_head"), "must be one of `available_node_types`"),
        (lambda c: c["available_node_types"]["cpu_worker"].update(min_workers=20), "sum of `min_workers`"),
    ],
    ids=[
        "unknown-key",
        "max_workers-string",
        "fractional-gpu",
        "label-not-string",
        "docker-unknown-key",
        "unknown-head-type",
        "min-over-max",
    ],
)
def test_broken_copies_fail_validation(config, breakage, message):
    breakage(config)
    with pytest.raises((jsonschema.ValidationError, ValueError), match=re.escape(message)):
        validate_config(prepare_config(config))


# --- what the file must say for this project ------------------------------------------------


def test_head_runs_no_jobs(raw):
    head = _node_types(raw)[raw["head_node_type"]]
    assert head["resources"]["CPU"] == 0
    assert head["resources"].get("GPU", 0) == 0
    assert not _accel_resources(head)
    assert head["max_workers"] == 0
    # The project's own inventory counts no job slot on it.
    node = {"NodeID": "head", "Alive": True, "Resources": head["resources"], "Labels": {}}
    assert classes_from_nodes([node]) == {}


def test_resources_match_the_instance_types(raw):
    for name, node_type in _node_types(raw).items():
        instance = node_type["node_config"]["InstanceType"]
        assert instance in INSTANCES, f"{name}: add {instance} to INSTANCES"
        vcpus, gpus, accel = INSTANCES[instance]
        resources = node_type["resources"]
        if name != raw["head_node_type"]:
            assert resources["CPU"] == vcpus, name
        assert resources.get("GPU", 0) == gpus, name
        if accel is None:
            assert not _accel_resources(node_type), name
            assert ACCEL_LABEL not in node_type.get("labels", {}), name


def test_accelerator_workers_are_pinned_to_their_class(raw):
    seen = set()
    for name, node_type in _worker_types(raw).items():
        _, gpus, accel = INSTANCES[node_type["node_config"]["InstanceType"]]
        if not gpus:
            continue
        assert _accel_resources(node_type) == {f"{ACCEL_PREFIX}{accel}": 1}, name
        assert accel in ACCELERATOR_TYPES
        assert node_type["labels"][ACCEL_LABEL] == accel, name
        # The raylet derives the type from the NVML name and sets the resource to 1 itself.
        assert NvidiaGPUAcceleratorManager._gpu_name_to_accelerator_type(NVML_NAMES[accel]) == accel
        # GPU containers get the devices; the shared run_options don't (the head has no GPU).
        assert "--gpus all" in node_type["docker"]["worker_run_options"], name
        seen.add(accel)
    assert seen == ACCELERATOR_TYPES
    assert not any("--gpus" in opt for opt in raw["docker"]["run_options"])


def test_labels_pass_rays_label_syntax(raw):
    for node_type in _node_types(raw).values():
        validate_node_label_syntax(node_type.get("labels"))


def test_project_inventory_sees_the_expected_classes(raw):
    """The hardware classes orchestrator/fleet/inventory.py derives from one node of each type."""
    nodes = [
        {
            "NodeID": name,
            "Alive": True,
            "Resources": {k: float(v) for k, v in t["resources"].items()},
            "Labels": t.get("labels", {}),
        }
        for name, t in _node_types(raw).items()
    ]
    classes = classes_from_nodes(nodes)
    assert {name: (hw.device, hw.slots, hw.cpus_per_job) for name, hw in classes.items()} == {
        "A100": ("cuda", 8, 9),  # each GPU's share of the cores, less 3 for the processes started ahead
        "T4": ("cuda", 1, 4),  # 4 cores: too few to set any aside
        "V100": ("cuda", 1, 5),
        "cpu": ("cpu", 1, 32),
    }


def test_docker_image_is_the_projects_stack(raw):
    docker = raw["docker"]
    match = re.fullmatch(r"rayproject/ray:(\d+\.\d+\.\d+)-(py\d+)-(gpu|cu\d+)", docker["image"])
    assert match, docker["image"]
    assert match.group(1) == IMAGE_RAY_VERSION
    assert match.group(2) == IMAGE_PYTHON_TAG
    assert docker["container_name"]
    assert docker["pull_before_run"] is True
    assert "--ulimit nofile=65536:65536" in docker["run_options"]


def test_setup_commands_install_this_project(raw):
    local = raw["file_mounts"][PROJECT_MOUNT]
    pyproject = (ROOT / local / "pyproject.toml").read_text()
    assert re.search(r'^name = "compile-orchestrator"$', pyproject, re.M)
    # the roles a node runs (jobs of hf: models, the shared cache, NVML), at the versions CI ran
    install = f"pip install -e '{PROJECT_MOUNT}[fleet,hf,gpu]' -c {PROJECT_MOUNT}/constraints.txt"
    assert install in raw["setup_commands"]
    assert (ROOT / local / "constraints.txt").is_file()


def test_start_commands(raw):
    head = " ; ".join(raw["head_start_ray_commands"])
    for flag in (
        "ray start --head",
        "--port=6379",
        "--dashboard-host=0.0.0.0",
        "--autoscaling-config=~/ray_bootstrap_config.yaml",
    ):
        assert flag in head
    assert raw["head_start_ray_commands"][0] == "ray stop"
    assert raw["worker_start_ray_commands"][0] == "ray stop"
    assert "ray start --address=$RAY_HEAD_IP:6379" in " ; ".join(raw["worker_start_ray_commands"])


def test_provider_and_cluster_settings(raw):
    assert raw["cluster_name"] == "compile-orchestrator"
    provider = raw["provider"]
    assert provider["type"] == "aws"
    assert provider["region"] == "us-west-2"
    assert all(z.startswith("us-west-2") for z in provider["availability_zone"].split(","))
    assert provider["cache_stopped_nodes"] is False
    assert raw["auth"] == {"ssh_user": "ubuntu"}
    assert raw["idle_timeout_minutes"] > 0
    assert raw["max_workers"] == sum(t["max_workers"] for t in _worker_types(raw).values())
