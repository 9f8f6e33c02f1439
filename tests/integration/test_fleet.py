"""A heterogeneous fleet on one machine: `ray.cluster_utils.Cluster` with fake A100 and T4 nodes
(GPU resources and accelerator labels, as Ray sets them on real GPU nodes) and a CPU node.

Jobs of the fake GPU classes run a synthetic task body (this machine has no GPU); jobs of the
CPU class run the real job subprocess, faults included. Placement is checked from the node id
each row records, which the task reads from Ray itself. Capability-aware planning (cells a class
cannot run become rows, not tasks) runs on the same cluster.
"""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from orchestrator.fleet.driver import SweepOptions, run_sweep
from orchestrator.fleet.inventory import MissingHardwareError
from orchestrator.spec.sweep import parse_spec
from store.schema import read_results, read_table

pytestmark = pytest.mark.integration

GPU_CLASSES = ("A100", "T4")


def make_cluster():
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0})
    nodes: dict[str, list] = {"A100": [], "T4": [], "cpu": []}
    for cls, count in (("A100", 2), ("T4", 1)):
        for _ in range(count):
            resources = {f"accelerator_type:{cls}": 1}
            if cls == "T4":
                # Also the A100's resource, as Ray adds for the GPU it detects on a node that an
                # operator labelled as another class (two classes simulated on one multi-GPU host):
                # placement by label keeps A100 jobs off it.
                resources["accelerator_type:A100"] = 1
            nodes[cls].append(
                cluster.add_node(
                    num_cpus=1,
                    num_gpus=1,
                    labels={"ray.io/accelerator-type": cls},
                    resources=resources,
                )
            )
    nodes["cpu"].append(cluster.add_node(num_cpus=2))
    cluster.wait_for_nodes()
    return cluster, {cls: {n.node_id for n in ns} for cls, ns in nodes.items()}, nodes


def task_body(seconds: float, started_dir: str | None = None):
    """Synthetic result on the fake GPU classes; the real job subprocess on the CPU class.
    With `started_dir`, each synthetic task first drops a file named after its node there."""

    def body(job_dict, threads, scratch_root=None, extra_path=(), lock_clocks=False):
        import pathlib
        import time

        import ray

        if started_dir:
            pathlib.Path(started_dir, ray.get_runtime_context().get_node_id()).touch()

        if job_dict["hardware"] == "cpu":
            from workers.task import execute_job

            return execute_job(job_dict, threads, scratch_root, extra_path)
        time.sleep(seconds)
        return {
            "status": "ok",
            "eager_ms": 2.0,
            "compiled_ms": 1.0,
            "speedup": 2.0,
            "compile_s": 0.1,
            "node_id": ray.get_runtime_context().get_node_id(),
            "device_name": "fake",
            "kernel_choices": fake_kernel_choices(),
        }

    return body


def fake_kernel_choices() -> list[dict]:
    """What a max-autotune GPU job reports (compiler.kernels): one GEMM, two candidates."""
    return [
        {
            "op": "mm",
            "op_index": 0,
            "input_shapes": ["16x768", "768x3072"],
            "choice": choice,
            "kind": kind,
            "config": "{}",
            "time_ms": ms,
            "rank": rank,
            "is_winner": rank == 1,
            "from_cache": False,
        }
        for choice, kind, ms, rank in (
            ("triton_mm_3", "triton_template", 0.05, 1),
            ("mm", "extern", 0.07, 2),
        )
    ]


SWEEP = """\
name: fleet
models:
  - {{id: python:workers.toy:mlp, name: mlp}}
  - {{id: python:tests.faulty:segfault, name: segfault}}
batch_sizes: [{batch_sizes}]
configs:
  dynamo: {{backend: eager}}
measure: {{warmup: 1, iterations: 3, flops: false}}
hardware: {hardware}
"""


@pytest.fixture(scope="module")
def fleet():
    """One cluster for the tests that leave its nodes alone (the lost-node test makes its own)."""
    cluster, node_ids, _ = make_cluster()
    try:
        yield cluster, node_ids
    finally:
        cluster.shutdown()


def test_every_job_lands_on_a_node_of_its_class(fleet, tmp_path):
    cluster, node_ids = fleet
    spec = parse_spec(SWEEP.format(batch_sizes="1, 2", hardware="auto"), "fleet.yaml")
    summary = run_sweep(
        spec,
        SweepOptions(out_dir=tmp_path, address=cluster.address, cpus_per_job=1),
        stream=io.StringIO(),
        task_body=task_body(0.3),
    )
    rows = read_results(tmp_path).to_pylist()
    assert summary.hardware == {"A100": 2, "T4": 1, "cpu": 2}
    assert len(rows) == 3 * 2 * 2 == summary.planned
    for r in rows:
        assert r["node_id"] in node_ids[r["hardware"]], (r["job_name"], r["node_id"])
    # Both A100 nodes were used: the class's window spans its nodes.
    assert {r["node_id"] for r in rows if r["hardware"] == "A100"} == node_ids["A100"]
    # The fake GPU jobs' kernel choices reached their table, keyed by job and run, one winner each.
    choices = read_table(tmp_path, "kernel_choices").to_pylist()
    gpu_jobs = {(r["job_id"], r["run_id"]) for r in rows if r["hardware"] != "cpu"}
    assert {(c["job_id"], c["run_id"]) for c in choices} == gpu_jobs
    assert len(choices) == 2 * len(gpu_jobs) and sum(c["is_winner"] for c in choices) == len(gpu_jobs)
    # The CPU class ran the real job process: the MLP compiled and ran, the segfault became a row.
    cpu = {(r["model"], r["batch_size"]): r for r in rows if r["hardware"] == "cpu"}
    assert {m for (m, _), r in cpu.items() if r["status"] == "ok"} == {"mlp"}
    assert all(
        r["status"] == "crash" and "SIGSEGV" in r["error"] for (m, _), r in cpu.items() if m == "segfault"
    )


def test_absent_class_is_an_error_before_anything_runs_unless_allowed(fleet, tmp_path):
    cluster, _ = fleet
    spec = parse_spec(SWEEP.format(batch_sizes="1", hardware="[A100, V100]"), "fleet.yaml")
    with pytest.raises(MissingHardwareError) as err:
        run_sweep(
            spec,
            SweepOptions(out_dir=tmp_path / "a", address=cluster.address),
            stream=io.StringIO(),
            task_body=task_body(0.0),
        )
    assert "V100" in str(err.value) and "A100" in str(err.value) and "T4" in str(err.value)
    assert read_results(tmp_path / "a").num_rows == 0
    summary = run_sweep(
        spec,
        SweepOptions(out_dir=tmp_path / "b", address=cluster.address, allow_missing=True),
        stream=io.StringIO(),
        task_body=task_body(0.0),
    )
    rows = read_results(tmp_path / "b").to_pylist()
    assert summary.hardware == {"A100": 2}
    assert {r["hardware"] for r in rows} == {"A100"} and len(rows) == 2


CAPS_SWEEP = """\
name: caps
models:
  - {id: python:workers.toy:mlp, name: mlp}
batch_sizes: [1]
dtypes: [fp32, bf16]
configs:
  default: {}
  gemm-triton: {options: {max_autotune: true, max_autotune_gemm_backends: TRITON}}
measure: {warmup: 1, iterations: 3, flops: false}
hardware: [A100, T4]
"""


def test_unsupported_cells_are_rows_not_tasks(fleet, tmp_path: Path):
    """Capability-aware sweeps on the fake mixed fleet: cells the capability table rules out on a
    class (bf16 on T4, Triton-only GEMMs on a 40-SM T4) become `unsupported` rows with the reason,
    and no task runs for them; the other cells run as usual (a synthetic task body)."""
    cluster, _ = fleet
    spec = parse_spec(CAPS_SWEEP, "caps.yaml")
    started = tmp_path / "started"
    started.mkdir()
    stream = io.StringIO()
    summary = run_sweep(
        spec,
        SweepOptions(out_dir=tmp_path / "out", address=cluster.address),
        stream=stream,
        task_body=task_body(0.0, str(started)),
    )
    rows = {r["job_name"]: r for r in read_results(tmp_path / "out").to_pylist()}
    unsupported = {n for n, r in rows.items() if r["status"] == "unsupported"}
    assert unsupported == {
        "T4/mlp/bs1/bf16/default",
        "T4/mlp/bs1/bf16/gemm-triton",
        "T4/mlp/bs1/fp32/gemm-triton",
    }
    assert {n for n, r in rows.items() if r["status"] == "ok"} == set(rows) - unsupported
    assert "T4 (sm75) has no native bf16" in rows["T4/mlp/bs1/bf16/default"]["error"]
    assert "capability table v1" in rows["T4/mlp/bs1/bf16/default"]["error"]
    assert "max_autotune_gemm_backends=TRITON" in rows["T4/mlp/bs1/fp32/gemm-triton"]["error"]
    assert all(rows[n]["node_id"] is None for n in unsupported)  # never placed
    assert summary.planned == 8 and summary.counts == {"ok": 5, "unsupported": 3}
    assert "3 unsupported, 5 to run" in stream.getvalue()
    # A resumed sweep counts them as done: nothing runs again.
    again = run_sweep(
        spec,
        SweepOptions(out_dir=tmp_path / "out", address=cluster.address, resume=True),
        stream=io.StringIO(),
        task_body=task_body(0.0, str(started)),
    )
    assert again.skipped == 8 and not again.counts
