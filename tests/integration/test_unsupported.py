"""Capability-aware sweeps on a fake mixed fleet: cells the capability table rules out on a class
(bf16 on T4, Triton-only GEMMs on a 40-SM T4) become `unsupported` rows with the reason, and no
task runs for them; the other cells run as usual (a synthetic task body: this machine has no GPU)."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from orchestrator.fleet.driver import SweepOptions, run_sweep
from orchestrator.spec.sweep import parse_spec
from orchestrator.store.schema import read_results
from tests.integration.test_fleet import task_body

pytestmark = pytest.mark.integration

SWEEP = """\
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


def test_unsupported_cells_are_rows_not_tasks(tmp_path: Path):
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0})
    try:
        for cls in ("A100", "T4"):
            cluster.add_node(
                num_cpus=1,
                num_gpus=1,
                labels={"ray.io/accelerator-type": cls},
                resources={f"accelerator_type:{cls}": 1},
            )
        cluster.wait_for_nodes()
        spec = parse_spec(SWEEP, "caps.yaml")
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
    finally:
        cluster.shutdown()
