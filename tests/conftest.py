"""Shared fixtures of the fast tier: real `Job`s of a small sweep and hand-made task results."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from orchestrator.matrix import expand
from orchestrator.spec import SweepSpec, parse_spec
from workers.job import Job

TABLE_SPEC = """\
name: tables
models:
  - {id: hf:microsoft/resnet-50, name: resnet}
  - {id: "python:workers.toy:mlp", name: mlp}
batch_sizes: [1, 4]
dtypes: [fp32]
configs:
  default: {}
  ro: {mode: reduce-overhead}
  tuned: {options: {max_autotune: true}}
"""

TABLE_STACK = {"python": "3.11", "torch": "2.13.0", "triton": "absent", "transformers": "4.50.0"}


@pytest.fixture(scope="session")
def table_spec() -> SweepSpec:
    return parse_spec(TABLE_SPEC, "tables.yaml")


@pytest.fixture(scope="session")
def table_jobs(table_spec) -> dict[str, Job]:
    """name -> Job for hardware A100 (cuda) and cpu: 2 models x 2 batch sizes x 3 configs each."""
    jobs = expand(table_spec, {"A100": "cuda", "cpu": "cpu"}, stack=TABLE_STACK)
    return {j.name: j for j in jobs}


def _result(
    status: str = "ok", eager_ms: float | None = 10.0, compiled_ms: float | None = 5.0, **extra
) -> dict:
    result: dict[str, Any] = {
        "status": status,
        "device_name": "NVIDIA A100-SXM4-80GB",
        "node_id": "node-1",
        "hostname": "worker-1",
        "eager_ms": eager_ms,
        "eager_p10_ms": eager_ms,
        "eager_p90_ms": eager_ms,
        "compiled_ms": compiled_ms,
        "compiled_p10_ms": compiled_ms,
        "compiled_p90_ms": compiled_ms,
        "speedup": eager_ms / compiled_ms if eager_ms and compiled_ms else None,
        "compile_s": 12.5,
        "eager_peak_mem_bytes": 3 * 2**30,
        "peak_mem_bytes": 5 * 2**30,
        "graph_count": 1,
        "graph_breaks": 0,
        "max_abs_err": 1e-6,
        "max_rel_err": 1e-7,
        "torch_version": "2.13.0",
        "python_version": "3.11.9",
        "started_at": "2025-01-02T03:04:05+00:00",
        "subprocess_s": 20.0,
        "error": None if status == "ok" else f"it ended as {status}",
    }
    result.update(extra)
    return result


@pytest.fixture(scope="session")
def make_result() -> Callable[..., dict]:
    """make_result(status="ok", eager_ms=10.0, compiled_ms=5.0, **extra): a task's result dict."""
    return _result
