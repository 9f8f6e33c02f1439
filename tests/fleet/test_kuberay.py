"""deploy/kuberay/ (a RayCluster and a RayJob) against KubeRay's CRD schemas, offline and fast.

The schemas are the ray.io/v1 openAPIV3Schema of KubeRay's CRDs at a pinned commit, pruned to the
fields the manifests use (tests/data/kuberay/README.md says where from and what was left out).
They are applied strictly, as `kubectl apply` (default --validate=strict) does: a field the
schema does not know is an error, not silently dropped as the API server's pruning would. Then
what no schema can say: the head has no GPU, each worker group's accelerator_type resource is the
class Ray and orchestrator/fleet/inventory.py derive from its GPU model, and the RayJob's
entrypoint is an `orchestrate nightly` command line that orchestrate's own parser accepts.
"""

from __future__ import annotations

import copy
import json
import re
import shlex
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from ray._private.accelerators import NvidiaGPUAcceleratorManager
from ray.scripts.scripts import start as ray_start

from compiler.hardware import accelerator_type
from orchestrator.cli import build_parser
from orchestrator.commands.nightly import cmd_nightly
from orchestrator.fleet.inventory import ACCEL_LABEL, ACCEL_RESOURCE_PREFIX, classes_from_nodes
from orchestrator.spec.sweep import load_spec
from store.storage import check_uri

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy" / "kuberay"
CRDS = ROOT / "tests" / "data" / "kuberay"
PINNED_COMMIT = "1184bc872c0801e59c18caf8a1a4eb5f2800ce93"
PROJECT_IN_IMAGE = "/home/ray/compile-orchestrator"

# GPU class -> the NVML device name of the GPU model each worker group is pinned to. NVIDIA GPU
# feature discovery labels a node nvidia.com/gpu.product with this name, spaces as dashes.
NVML_NAMES = {
    "A100": "NVIDIA A100-SXM4-80GB",
    "V100": "Tesla V100-SXM2-16GB",
    "T4": "Tesla T4",
}
GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"
GPU_RESOURCE = "nvidia.com/gpu"


# --- loading and strict validation ----------------------------------------------------------


def _load(path: Path) -> dict[str, Any]:
    with path.open() as f:
        return yaml.safe_load(f)


def _crd_version(crd: dict[str, Any], version: str = "v1") -> dict[str, Any]:
    (found,) = [v for v in crd["spec"]["versions"] if v["name"] == version]
    return found


def strict(schema: Any) -> Any:
    """The schema with unknown fields rejected: every object schema that lists its properties and
    neither allows extra ones nor preserves unknown fields gets additionalProperties: false."""
    if isinstance(schema, list):
        return [strict(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {
        k: strict(v) if k in ("items", "additionalProperties", "anyOf", "allOf", "oneOf", "not") else v
        for k, v in schema.items()
    }
    if "properties" in schema:
        out["properties"] = {name: strict(sub) for name, sub in schema["properties"].items()}
        if "additionalProperties" not in schema and not schema.get("x-kubernetes-preserve-unknown-fields"):
            out["additionalProperties"] = False
    return out


CASES = {
    "raycluster": (DEPLOY / "raycluster.yaml", CRDS / "ray.io_rayclusters.v1.pruned.yaml"),
    "rayjob": (DEPLOY / "rayjob.yaml", CRDS / "ray.io_rayjobs.v1.pruned.yaml"),
}


@pytest.fixture(scope="module")
def crds() -> dict[str, dict[str, Any]]:
    return {name: _load(crd) for name, (_, crd) in CASES.items()}


@pytest.fixture(scope="module")
def validators(crds) -> dict[str, jsonschema.Draft4Validator]:
    out = {}
    for name, crd in crds.items():
        schema = strict(_crd_version(crd)["schema"]["openAPIV3Schema"])
        jsonschema.Draft4Validator.check_schema(schema)
        out[name] = jsonschema.Draft4Validator(schema)
    return out


@pytest.fixture(scope="module")
def manifests() -> dict[str, dict[str, Any]]:
    return {name: _load(path) for name, (path, _) in CASES.items()}


@pytest.fixture
def cluster(manifests) -> dict[str, Any]:
    return copy.deepcopy(manifests["raycluster"])


@pytest.fixture
def job(manifests) -> dict[str, Any]:
    return copy.deepcopy(manifests["rayjob"])


def _errors(validator: jsonschema.Draft4Validator, doc: dict[str, Any]) -> list[str]:
    return [
        f"{'/'.join(map(str, e.absolute_path)) or '<root>'}: {e.message}" for e in validator.iter_errors(doc)
    ]


# --- the schema -----------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(CASES))
def test_manifest_passes_the_crd_schema(name, manifests, validators):
    assert _errors(validators[name], manifests[name]) == []


@pytest.mark.parametrize("name", sorted(CASES))
def test_manifest_is_of_the_crds_group_version_and_kind(name, manifests, crds):
    crd, doc = crds[name], manifests[name]
    assert doc["apiVersion"] == f"{crd['spec']['group']}/v1"
    assert doc["kind"] == crd["spec"]["names"]["kind"]
    assert _crd_version(crd)["served"] is True
    # metadata is `type: object` in a CRD (the API server checks it itself): a DNS-1123 name
    assert re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", doc["metadata"]["name"])
    assert len(doc["metadata"]["name"]) <= 63


@pytest.mark.parametrize("name", sorted(CASES))
def test_pinned_schema_names_its_source(name):
    header = CASES[name][1].read_text()
    assert "github.com/ray-project/kuberay" in header
    assert PINNED_COMMIT in header
    assert PINNED_COMMIT in (CRDS / "README.md").read_text()


def _worker(c: dict[str, Any], i: int = 0) -> dict[str, Any]:
    return c["spec"]["workerGroupSpecs"][i]


def _container(group: dict[str, Any]) -> dict[str, Any]:
    return group["template"]["spec"]["containers"][0]


BROKEN_CLUSTERS = {
    # a misspelled field in a worker group: unknown, and the real one is missing
    "misspelled-worker-field": (
        lambda c: _worker(c).update(rayStartParam=_worker(c).pop("rayStartParams")),
        "'rayStartParam' was unexpected",
    ),
    "misspelled-pod-field": (
        lambda c: _worker(c, 2)["template"]["spec"].update(nodeSelecter={GPU_PRODUCT_LABEL: "Tesla-T4"}),
        "'nodeSelecter' was unexpected",
    ),
    "misspelled-top-level": (
        lambda c: c["spec"].update(workerGroupSpec=[]),
        "'workerGroupSpec' was unexpected",
    ),
    "missing-group-name": (lambda c: _worker(c, 1).pop("groupName"), "'groupName' is a required property"),
    "missing-head": (lambda c: c["spec"].pop("headGroupSpec"), "'headGroupSpec' is a required property"),
    "replicas-not-integer": (lambda c: _worker(c).update(replicas="one"), "'one' is not of type 'integer'"),
    # ray start parameters are strings in the CRD: an unquoted YAML number is refused
    "ray-start-param-not-string": (
        lambda c: _worker(c)["rayStartParams"].update({"num-gpus": 1}),
        "1 is not of type 'string'",
    ),
    "gpu-quantity-not-a-quantity": (
        lambda c: _container(_worker(c))["resources"]["limits"].update({GPU_RESOURCE: "one"}),
        "'one' does not match",
    ),
    "container-without-name": (
        lambda c: _container(_worker(c, 2)).pop("name"),
        "'name' is a required property",
    ),
    "env-from-secret-misspelled": (
        lambda c: c["spec"]["headGroupSpec"]["template"]["spec"]["containers"][0]["env"][0][
            "valueFrom"
        ].update(secretRef={"name": "x"}),
        "'secretRef' was unexpected",
    ),
}


BROKEN_JOBS = {
    "misspelled-field": (
        lambda j: j["spec"].update(clusterSelecter=j["spec"].pop("clusterSelector")),
        "'clusterSelecter' was unexpected",
    ),
    "missing-entrypoint": (lambda j: j["spec"].pop("entrypoint"), "'entrypoint' is a required property"),
    "entrypoint-as-list": (
        lambda j: j["spec"].update(entrypoint=shlex.split(j["spec"]["entrypoint"])),
        "is not of type 'string'",
    ),
}


BROKEN = {"raycluster": BROKEN_CLUSTERS, "rayjob": BROKEN_JOBS}


@pytest.mark.parametrize(
    "name, breakage", [(name, b) for name, table in BROKEN.items() for b in sorted(table)]
)
def test_broken_copies_fail(name, breakage, manifests, validators):
    """A test that can fail: each broken copy of a manifest is refused, with the reason."""
    change, message = BROKEN[name][breakage]
    doc = copy.deepcopy(manifests[name])
    change(doc)
    errors = _errors(validators[name], doc)
    assert any(message in e for e in errors), errors


def test_strictness_is_what_catches_a_misspelling(cluster, crds):
    """The CRD schema as written accepts an unknown field (the API server would prune it without a
    word); only the strict reading, as kubectl's, refuses it."""
    _worker(cluster)["template"]["spec"]["nodeSelecter"] = {GPU_PRODUCT_LABEL: "Tesla-T4"}
    raw = jsonschema.Draft4Validator(_crd_version(crds["raycluster"])["schema"]["openAPIV3Schema"])
    assert _errors(raw, cluster) == []
    strict_errors = _errors(jsonschema.Draft4Validator(strict(raw.schema)), cluster)
    assert any("'nodeSelecter' was unexpected" in e for e in strict_errors)


# --- the RayCluster: what the schema cannot say ---------------------------------------------


def _resources_param(group: dict[str, Any]) -> dict[str, float]:
    """rayStartParams `resources` as `ray start` receives it: KubeRay pastes `--resources=<value>`
    into the container's shell command, so the value is a shell word holding JSON."""
    value = group["rayStartParams"].get("resources")
    if value is None:
        return {}
    (word,) = shlex.split(f"--resources={value}")
    return json.loads(word.removeprefix("--resources="))


def _head(c: dict[str, Any]) -> dict[str, Any]:
    return c["spec"]["headGroupSpec"]


def _all_groups(c: dict[str, Any]) -> list[dict[str, Any]]:
    return [_head(c), *c["spec"]["workerGroupSpecs"]]


def test_head_has_no_gpu_and_runs_no_job(cluster):
    head = _head(cluster)
    assert head["rayStartParams"]["num-gpus"] == "0"
    assert head["rayStartParams"]["num-cpus"] == "0"
    assert not _resources_param(head)
    pod = head["template"]["spec"]
    for container in pod["containers"]:
        for kind in ("requests", "limits"):
            assert GPU_RESOURCE not in container.get("resources", {}).get(kind, {})
    assert GPU_PRODUCT_LABEL not in pod.get("nodeSelector", {})
    assert not any(t.get("key") == GPU_RESOURCE for t in pod.get("tolerations", []))
    # orchestrate's inventory counts no job slot on it
    assert classes_from_nodes([_ray_node("head", head)]) == {}


def test_one_worker_group_per_gpu_class_pinned_to_its_gpu_model(cluster):
    seen = []
    for group in cluster["spec"]["workerGroupSpecs"]:
        accel = {k: v for k, v in _resources_param(group).items() if k.startswith(ACCEL_RESOURCE_PREFIX)}
        assert len(accel) == 1, group["groupName"]
        ((key, amount),) = accel.items()
        cls = key.removeprefix(ACCEL_RESOURCE_PREFIX)
        assert amount == 1
        assert group["groupName"] == cls.lower()
        product = group["template"]["spec"]["nodeSelector"][GPU_PRODUCT_LABEL]
        nvml = NVML_NAMES[cls]
        assert product == nvml.replace(" ", "-"), f"{cls}: GPU feature discovery labels {nvml!r} so"
        # The class Ray gives a node with that GPU, and the class the project computes for it
        # (compiler/hardware.py, what a serving process looks its presets up by), are this one.
        assert NvidiaGPUAcceleratorManager._gpu_name_to_accelerator_type(nvml) == cls
        assert accelerator_type(nvml) == cls
        seen.append(cls)
    assert sorted(seen) == sorted(NVML_NAMES)


def test_worker_gpus_match_ray_start_and_tolerate_the_gpu_taint(cluster):
    for group in cluster["spec"]["workerGroupSpecs"]:
        (container,) = group["template"]["spec"]["containers"]
        res = container["resources"]
        assert res["limits"][GPU_RESOURCE] == res["requests"][GPU_RESOURCE] == 1, group["groupName"]
        assert group["rayStartParams"]["num-gpus"] == str(res["limits"][GPU_RESOURCE])
        assert res["limits"]["cpu"] == res["requests"]["cpu"]  # Ray takes num-cpus from the limit
        assert {"key": GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"} in group["template"][
            "spec"
        ]["tolerations"]
        assert group["minReplicas"] <= group["replicas"] <= group["maxReplicas"], group["groupName"]


def _ray_node(node_id: str, group: dict[str, Any], with_label: bool = False) -> dict[str, Any]:
    """The node one pod of `group` becomes, as `ray.nodes()` reports it: CPU from num-cpus or the
    container's cpu limit, GPU from num-gpus, custom resources from `resources`."""
    params = group["rayStartParams"]
    limits = group["template"]["spec"]["containers"][0]["resources"]["limits"]
    resources = {
        "CPU": float(params.get("num-cpus", limits["cpu"])),
        "GPU": float(params.get("num-gpus", limits.get(GPU_RESOURCE, 0))),
        **{k: float(v) for k, v in _resources_param(group).items()},
    }
    labels = {}
    if with_label and resources["GPU"]:
        (key,) = [k for k in resources if k.startswith(ACCEL_RESOURCE_PREFIX)]
        labels[ACCEL_LABEL] = key.removeprefix(ACCEL_RESOURCE_PREFIX)
    return {"NodeID": node_id, "Alive": True, "Resources": resources, "Labels": labels}


@pytest.mark.parametrize("with_label", [False, True], ids=["resource-only", "with-ray-label"])
def test_project_inventory_sees_one_class_per_group(cluster, with_label):
    """What orchestrator/fleet/inventory.py makes of one pod of each group: from the
    accelerator_type resource alone, and with the label Ray also sets from NVML."""
    nodes = [_ray_node(g.get("groupName", "head"), g, with_label) for g in _all_groups(cluster)]
    classes = classes_from_nodes(nodes)
    assert {name: (hw.device, hw.slots, hw.cpus_per_job) for name, hw in classes.items()} == {
        "A100": ("cuda", 1, 9),  # each GPU's share of the cores, less 3 for the processes started ahead
        "T4": ("cuda", 1, 4),
        "V100": ("cuda", 1, 4),
    }


def test_ray_start_params_are_ray_start_options(cluster):
    options = {p.name for p in ray_start.params}
    for group in _all_groups(cluster):
        for key in group["rayStartParams"]:
            assert key.replace("-", "_") in options, key


def test_pods_mount_what_they_declare(cluster):
    for group in _all_groups(cluster):
        pod = group["template"]["spec"]
        volumes = {v["name"] for v in pod.get("volumes", [])}
        for container in pod["containers"]:
            for mount in container.get("volumeMounts", []):
                assert mount["name"] in volumes
        assert {"name": "dshm", "emptyDir": {"medium": "Memory"}} in pod["volumes"]


def test_every_pod_runs_the_projects_image(cluster):
    ray_version = cluster["spec"]["rayVersion"]
    images = {c["image"] for g in _all_groups(cluster) for c in g["template"]["spec"]["containers"]}
    (image,) = images
    assert image.endswith(f":{ray_version}-py311-gpu")
    dockerfile = (DEPLOY / "Dockerfile").read_text()
    assert re.search(rf"^FROM rayproject/ray:{re.escape(ray_version)}-py311-gpu$", dockerfile, re.M)
    # the roles a node runs (jobs of hf: models, the shared cache, NVML), at the versions CI ran
    assert (
        f"pip install --no-cache-dir -e '{PROJECT_IN_IMAGE}[fleet,hf,gpu]' -c constraints.txt" in dockerfile
    )
    assert f"-t {image} ." in dockerfile
    # the same Ray as the cluster-launcher config's image
    launcher = _load(ROOT / "ray_cluster.yaml")
    assert launcher["docker"]["image"] == f"rayproject/ray:{ray_version}-py311-gpu"


def test_head_gets_object_store_credentials_from_a_secret(cluster):
    (container,) = _head(cluster)["template"]["spec"]["containers"]
    env = {e["name"]: e for e in container["env"]}
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        assert "value" not in env[name], f"{name} must not be written into the manifest"
        ref = env[name]["valueFrom"]["secretKeyRef"]
        assert ref == {"name": "compile-orchestrator-s3", "key": name, "optional": True}


# --- the RayJob: what the schema cannot say -------------------------------------------------


def _nightly_args(entrypoint: str):
    argv = shlex.split(entrypoint)
    assert argv[0] == "orchestrate"
    return build_parser().parse_args(argv[1:])


def test_rayjob_runs_on_the_raycluster(job, cluster):
    assert job["spec"]["clusterSelector"] == {"ray.io/cluster": cluster["metadata"]["name"]}


def test_rayjob_entrypoint_is_an_orchestrate_nightly_that_parses(job):
    args = _nightly_args(job["spec"]["entrypoint"])
    assert args.command == "nightly"
    assert args.func is cmd_nightly
    assert args.address == "auto"  # the cluster the driver runs in
    check_uri(args.history)  # the form `orchestrate` accepts, without contacting the store
    assert args.history.split("://")[0] in ("s3", "gs")
    # the sweep file is the image's copy of one in this repository, and a valid one
    sweep = str(args.sweep)
    assert sweep.startswith(PROJECT_IN_IMAGE + "/")
    local = ROOT / sweep.removeprefix(PROJECT_IN_IMAGE + "/")
    assert local.is_file()
    load_spec(local)


@pytest.mark.parametrize(
    "entrypoint",
    [
        "orchestrate nightly sweeps/vision.yaml --histroy s3://b/p",  # misspelled flag
        "orchestrate nightly sweeps/vision.yaml",  # --history is required
        "orchestrate nightly",  # no sweep
        "orchestrate nighty sweeps/vision.yaml --history s3://b/p",  # no such command
    ],
)
def test_a_wrong_entrypoint_does_not_parse(entrypoint):
    with pytest.raises(SystemExit) as exc:
        _nightly_args(entrypoint)
    assert exc.value.code == 2
