"""The job matrix and stable job ids; selecting jobs; hardware classes of a cluster."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from compiler.config import CompileConfig
from compiler.job import Job, MeasureSpec, ModelSpec, software_stack
from orchestrator.fleet import inventory
from orchestrator.fleet.inventory import MissingHardwareError, classes_from_nodes, resolve
from orchestrator.spec.matrix import expand, select
from orchestrator.spec.sweep import parse_spec

REPO = Path(__file__).resolve().parents[2]

SPEC = """\
name: m
models:
  - hf:microsoft/resnet-50
  - {id: "python:workers.toy:mlp", name: mlp, overrides: {width: 8, depth: 2}}
batch_sizes: [1, 4, 16]
dtypes: [fp32, bf16]
configs:
  default: {}
  ro: {mode: reduce-overhead}
  tuned: {options: {max_autotune: true, coordinate_descent_tuning: true}}
"""

# One cell, so a variant's single id can be compared with this one's.
BASE = """\
name: one
models:
  - id: hf:microsoft/resnet-50
    name: r
    overrides: {embedding_size: 16, depths: [1, 1, 1, 1]}
batch_sizes: [1]
dtypes: [fp32]
configs:
  c: {options: {max_autotune: true, coordinate_descent_tuning: true}}
"""

STACK = {"python": "3.11", "torch": "2.13.0", "triton": "absent", "transformers": "4.50.0"}


def only_id(text: str, hardware: dict | None = None, stack: dict | None = None) -> str:
    jobs = expand(parse_spec(text), hardware or {"cpu": "cpu"}, stack=STACK if stack is None else stack)
    assert len(jobs) == 1
    return jobs[0].job_id


# --- expansion ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "hardware",
    [{"cpu": "cpu"}, {"A100": "cuda", "T4": "cuda"}, {"A100": "cuda", "T4": "cuda", "cpu": "cpu"}],
    ids=["cpu", "2gpu", "3classes"],
)
def test_job_count_is_the_product_of_the_axes(hardware):
    spec = parse_spec(SPEC)
    jobs = expand(spec, hardware)
    assert len(jobs) == 2 * 3 * 2 * 3 * len(hardware)
    assert len({j.job_id for j in jobs}) == len(jobs)
    assert len({j.name for j in jobs}) == len(jobs)
    assert {j.hardware for j in jobs} == set(hardware)
    assert all(j.device == hardware[j.hardware] for j in jobs)
    assert all(j.sweep == "m" and j.measure == spec.measure for j in jobs)


def test_expand_nests_hardware_model_batch_dtype_config():
    jobs = expand(parse_spec(SPEC), {"A100": "cuda", "cpu": "cpu"}, stack=STACK)
    assert jobs[0].name == "A100/resnet-50/bs1/fp32/default"
    assert jobs[1].name == "A100/resnet-50/bs1/fp32/ro"
    assert jobs[3].name == "A100/resnet-50/bs1/bf16/default"
    assert jobs[6].name == "A100/resnet-50/bs4/fp32/default"
    assert jobs[-1].name == "cpu/mlp/bs16/bf16/tuned"


def test_expand_uses_the_software_stack_by_default():
    jobs = expand(parse_spec(BASE), {"cpu": "cpu"})
    assert jobs[0].stack == software_stack()
    assert set(software_stack()) >= {"python", "torch"}


def test_job_ids_are_stable_across_processes():
    in_process = [[j.name, j.job_id] for j in expand(parse_spec(SPEC), {"cpu": "cpu", "T4": "cuda"})]
    code = (
        "import json, sys\n"
        "from orchestrator.spec.sweep import parse_spec\n"
        "from orchestrator.spec.matrix import expand\n"
        "jobs = expand(parse_spec(sys.stdin.read()), {'cpu': 'cpu', 'T4': 'cuda'})\n"
        "print(json.dumps([[j.name, j.job_id] for j in jobs]))\n"
    )
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    proc = subprocess.run(
        [sys.executable, "-c", code],
        input=SPEC,
        capture_output=True,
        text=True,
        cwd=REPO,
        env=env,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    other = json.loads(proc.stdout.strip().splitlines()[-1])
    assert other == in_process


def test_job_id_is_a_short_hex_digest():
    job_id = only_id(BASE)
    assert len(job_id) == 20
    int(job_id, 16)


# --- what the id depends on -----------------------------------------------------------------------

SAME = {
    "keys reordered": """\
configs:
  c: {options: {coordinate_descent_tuning: true, max_autotune: true}}
dtypes: [fp32]
batch_sizes: [1]
models:
  - overrides: {depths: [1, 1, 1, 1], embedding_size: 16}
    name: r
    id: hf:microsoft/resnet-50
name: one
""",
    "model display name": BASE.replace("name: r\n", "name: resnet-tiny\n"),
    "model timeout": BASE.replace("name: r\n", "name: r\n    timeout_s: 33\n"),
    "config timeout": BASE.replace("c: {options", "c: {timeout_s: 12, options"),
    "sweep timeout": BASE + "timeout_s: 77\n",
    "dtype alias": BASE.replace("dtypes: [fp32]", "dtypes: [float32]"),
    "description": BASE + "description: another label\n",
}

DIFFERENT = {
    "batch size": BASE.replace("batch_sizes: [1]", "batch_sizes: [2]"),
    "dtype": BASE.replace("dtypes: [fp32]", "dtypes: [bf16]"),
    "option value": BASE.replace("max_autotune: true", "max_autotune: false"),
    "option removed": BASE.replace("max_autotune: true, ", ""),
    "mode instead of options": BASE.replace(
        "c: {options: {max_autotune: true, coordinate_descent_tuning: true}}", "c: {mode: max-autotune}"
    ),
    "fullgraph": BASE.replace("c: {options", "c: {fullgraph: true, options"),
    "dynamic": BASE.replace("c: {options", "c: {dynamic: false, options"),
    "config name": BASE.replace("  c: {", "  c2: {"),
    "override value": BASE.replace("depths: [1, 1, 1, 1]", "depths: [1, 1, 2, 1]"),
    "override added": BASE.replace("embedding_size: 16,", "embedding_size: 16, hidden_act: gelu,"),
    "no overrides": BASE.replace("    overrides: {embedding_size: 16, depths: [1, 1, 1, 1]}\n", ""),
    "model id": BASE.replace("hf:microsoft/resnet-50", "hf:google/vit-base-patch16-224"),
    "input size": BASE.replace("name: r\n", "name: r\n    input_size: 64\n"),
    "measure": BASE + "measure: {iterations: 7}\n",
}


@pytest.mark.parametrize("variant", list(SAME))
def test_job_id_unchanged_by_labels_and_policy(variant):
    assert only_id(SAME[variant]) == only_id(BASE)


@pytest.mark.parametrize("variant", list(DIFFERENT))
def test_job_id_changes_with_what_is_measured(variant):
    assert only_id(DIFFERENT[variant]) != only_id(BASE)


def test_all_variant_ids_are_distinct():
    ids = [only_id(BASE)] + [only_id(text) for text in DIFFERENT.values()]
    assert len(set(ids)) == len(ids)


def test_job_id_changes_with_hardware():
    a100 = only_id(BASE, {"A100": "cuda"})
    assert a100 != only_id(BASE, {"T4": "cuda"})
    assert a100 != only_id(BASE, {"cpu": "cpu"})
    assert a100 == only_id(BASE, {"A100": "cuda"})


def test_job_id_changes_with_software_stack():
    base = only_id(BASE, stack=STACK)
    assert base != only_id(BASE, stack={**STACK, "torch": "2.12.0"})
    assert base != only_id(BASE, stack={**STACK, "triton": "3.4.0"})
    assert base != only_id(BASE, stack={})
    assert base == only_id(BASE, stack=dict(reversed(list(STACK.items()))))


# --- serialization --------------------------------------------------------------------------------


def test_job_dict_round_trip():
    jobs = expand(parse_spec(SPEC), {"cpu": "cpu", "A100": "cuda"}, stack=STACK)
    for job in jobs:
        back = Job.from_dict(job.to_dict())
        assert back == job
        assert back.job_id == job.job_id
        via_json = Job.from_dict(json.loads(json.dumps(job.to_dict())))
        assert via_json == job
        assert via_json.job_id == job.job_id
    tuned = next(j for j in jobs if j.config.name == "tuned" and j.model.name == "mlp")
    data = json.loads(json.dumps(tuned.to_dict()))
    assert data["config"]["options"] == {"max_autotune": True, "coordinate_descent_tuning": True}
    assert data["model"]["overrides"] == {"width": 8, "depth": 2}
    assert data["stack"] == STACK


# --- select ---------------------------------------------------------------------------------------

SELECT_SPEC = """\
name: s
models: [hf:microsoft/resnet-50, "python:workers.toy:mlp"]
batch_sizes: [1, 16]
configs: {default: {}, ro: {mode: reduce-overhead}}
"""


def names(jobs) -> set[str]:
    return {j.name for j in jobs}


@pytest.fixture(scope="module")
def sel_jobs():
    jobs = expand(parse_spec(SELECT_SPEC), {"cpu": "cpu"}, stack=STACK)
    assert len(jobs) == 8
    return jobs


def test_select_without_pattern_keeps_everything(sel_jobs):
    assert select(sel_jobs, None) == sel_jobs
    assert select(sel_jobs, "") == sel_jobs


def test_select_glob_matches_the_whole_name(sel_jobs):
    assert names(select(sel_jobs, "*/bs1/*")) == {
        "cpu/resnet-50/bs1/fp32/default",
        "cpu/resnet-50/bs1/fp32/ro",
        "cpu/mlp/bs1/fp32/default",
        "cpu/mlp/bs1/fp32/ro",
    }
    assert select(sel_jobs, "mlp*") == []  # a glob is anchored: names start with the hardware
    assert names(select(sel_jobs, "cpu/mlp/bs?/fp32/ro")) == {"cpu/mlp/bs1/fp32/ro"}
    assert names(select(sel_jobs, "cpu/mlp/bs1[6]/*")) == {
        "cpu/mlp/bs16/fp32/default",
        "cpu/mlp/bs16/fp32/ro",
    }


def test_select_plain_word_matches_anywhere(sel_jobs):
    assert len(select(sel_jobs, "bs1")) == 8  # bs1 and bs16
    assert names(select(sel_jobs, "resnet")) == {j.name for j in sel_jobs if j.model.name == "resnet-50"}
    assert names(select(sel_jobs, "bs16/fp32/ro")) == {
        "cpu/resnet-50/bs16/fp32/ro",
        "cpu/mlp/bs16/fp32/ro",
    }
    assert select(sel_jobs, "vit") == []


def test_select_comma_separated_patterns_are_a_union(sel_jobs):
    got = select(sel_jobs, "mlp/bs16/fp32/default , */resnet-50/bs1/*/ro")
    assert names(got) == {"cpu/mlp/bs16/fp32/default", "cpu/resnet-50/bs1/fp32/ro"}
    assert [j.name for j in got] == [j.name for j in sel_jobs if j.name in names(got)]  # order kept


# --- inventory ------------------------------------------------------------------------------------


def gpu_node(node_id, cpus, gpus, label=None, resource=None, alive=True):
    resources = {"CPU": float(cpus), "GPU": float(gpus), "memory": 1e9}
    if resource:
        resources[f"accelerator_type:{resource}"] = 1.0
    labels = {"ray.io/node-id": node_id}
    if label:
        labels["ray.io/accelerator-type"] = label
    return {"NodeID": node_id, "Alive": alive, "Resources": resources, "Labels": labels}


def cpu_node(node_id, cpus, alive=True):
    return {"NodeID": node_id, "Alive": alive, "Resources": {"CPU": float(cpus)}, "Labels": {}}


NODES = [
    gpu_node("a1", cpus=32, gpus=4, label="A100", resource="A100"),
    gpu_node("a2", cpus=12, gpus=2, label="A100"),
    gpu_node("t1", cpus=8, gpus=1, resource="T4"),
    cpu_node("c1", 16),
    cpu_node("c2", 8),
    cpu_node("dead-cpu", 2, alive=False),
    gpu_node("dead-gpu", cpus=8, gpus=8, label="H100", alive=False),
]


def test_classes_from_nodes():
    classes = classes_from_nodes(NODES)
    assert list(classes) == ["A100", "T4", "cpu"]
    a100, t4, cpu = classes["A100"], classes["T4"], classes["cpu"]
    assert (a100.device, a100.slots, a100.node_ids) == ("cuda", 6, ["a1", "a2"])
    # a GPU job's share of its node's cores, less up to 3 spare for the processes started ahead
    assert a100.cpus_per_job == 4  # min(32 // 4 - 3, 12 // 2 - 2): a job keeps 4 cores at least
    assert (t4.device, t4.slots, t4.node_ids, t4.cpus_per_job) == ("cuda", 1, ["t1"], 5)
    # CPU jobs default to all cores of the smallest alive CPU node (not the dead 2-core one).
    assert (cpu.device, cpu.cpus_per_job, cpu.slots, cpu.node_ids) == ("cpu", 8, 3, ["c1", "c2"])


def test_classes_from_nodes_with_cpus_per_job():
    classes = classes_from_nodes(NODES, cpus_per_job=4)
    assert (classes["cpu"].cpus_per_job, classes["cpu"].slots) == (4, 6)
    assert (classes["A100"].cpus_per_job, classes["A100"].slots) == (4, 6)  # GPU slots are GPUs


def test_cpu_node_smaller_than_cpus_per_job_gives_no_class():
    assert classes_from_nodes([cpu_node("c", 2)], cpus_per_job=4) == {}


def test_gpu_node_without_accelerator_type_and_lowercase_alive():
    nodes = [
        gpu_node("g", cpus=4, gpus=2),
        {"NodeID": "x", "alive": False, "Resources": {"CPU": 64.0}},
        {"NodeID": "z", "Alive": True, "Resources": {"CPU": 4.0, "GPU": 0.0}},
    ]
    classes = classes_from_nodes(nodes)
    assert list(classes) == ["GPU", "cpu"]
    assert (classes["GPU"].slots, classes["GPU"].cpus_per_job) == (2, 2)  # too few to set 2 aside
    assert (classes["cpu"].slots, classes["cpu"].node_ids) == (1, ["z"])


def test_node_class_label_wins_over_resource():
    node = gpu_node("g", cpus=8, gpus=1, label="H100", resource="A100")
    assert inventory.node_class(node) == ("H100", "cuda")
    assert inventory.node_class(cpu_node("c", 4)) == ("cpu", "cpu")


def test_head_node_without_cpus_does_not_shrink_cpu_jobs():
    head = {"NodeID": "head", "Alive": True, "Resources": {"memory": 1e9, "node:__internal_head__": 1.0}}
    classes = classes_from_nodes([head, cpu_node("w", 16)])
    assert (classes["cpu"].cpus_per_job, classes["cpu"].slots) == (16, 1)


def test_resolve_auto_subset_and_missing():
    present = classes_from_nodes(NODES)
    assert list(resolve("auto", present)) == ["A100", "T4", "cpu"]
    subset = resolve(("T4", "cpu"), present)
    assert list(subset) == ["T4", "cpu"]
    assert subset["T4"] is present["T4"]
    with pytest.raises(MissingHardwareError) as info:
        resolve(("H100", "T4"), present)
    message = str(info.value)
    assert "'H100'" in message
    assert "A100, T4, cpu" in message
    assert "'T4'" not in message.split("classes present")[0]
    with pytest.raises(MissingHardwareError, match="none"):
        resolve(("cpu",), {})


def test_job_ids_of_one_repeat_are_those_written_before_repeats_existed():
    """Outputs written before `measure.repeats` existed still resume: same ids at repeats 1 (their
    `fp32` was the strict policy, `fp32-strict` now: it keeps their ids, and the stock `fp32`
    hashes apart, so their rows never pass for its jobs; random weights, the default, neither)."""
    job = Job(
        sweep="s",
        hardware="cpu",
        device="cpu",
        model=ModelSpec(id="python:workers.toy:mlp", name="mlp"),
        batch_size=2,
        dtype="fp32-strict",
        config=CompileConfig(name="default"),
        measure=MeasureSpec(warmup=2, iterations=6),
        timeout_s=300,
        stack={"torch": "2.13.0"},
    )
    assert job.job_id == "8fb60815b3f371a684d2"  # computed by the code of commit 12fcec1
    assert dataclasses.replace(job, dtype="fp32").job_id != job.job_id
    assert (
        dataclasses.replace(job, model=dataclasses.replace(job.model, weights="random")).job_id == job.job_id
    )
    three = dataclasses.replace(job, measure=MeasureSpec(warmup=2, iterations=6, repeats=3))
    assert three.job_id != job.job_id
    frozen = dataclasses.replace(job, config=CompileConfig(name="default", freezing=True))
    assert frozen.job_id not in (job.job_id, three.job_id)
