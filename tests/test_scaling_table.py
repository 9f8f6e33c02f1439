"""benchmarks/scaling.py's figures from two run directories the test writes (real run.json and
Parquet through the project's own writers)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from orchestrator.spec.sweep import parse_spec
from store import runlog
from store.sink import ResultSink

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "scaling.py"


@pytest.fixture(scope="module")
def scaling():
    spec = importlib.util.spec_from_file_location("scaling_benchmark", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _run_dir(path: Path, slots: int, makespan: float, job_seconds: list[float]) -> None:
    spec = parse_spec(
        "name: s\nmodels: [python:workers.toy:mlp]\nbatch_sizes: [1]\nconfigs: {d: {}}\n", "s.yaml"
    )
    hardware = {
        "H200": {"name": "H200", "device": "cuda", "node_ids": ["n"], "slots": slots, "cpus_per_job": 16}
    }
    runlog.start_run(path, "r1", spec, [], hardware, planned=len(job_seconds), skipped=0)
    sink = ResultSink(path)
    for i, seconds in enumerate(job_seconds):
        sink.add(
            {"job_id": f"j{i}", "run_id": "r1", "hardware": "H200", "status": "ok", "subprocess_s": seconds,
             "device_name": "NVIDIA H200", "eager_ms": 2.0, "compiled_ms": 1.0, "speedup": 2.0,
             "model": "m", "batch_size": 1, "dtype": "fp32", "config": f"c{i}"}
        )  # fmt: skip
    sink.close()
    runlog.finish_run(path, "r1", {"ok": len(job_seconds)}, dispatch_s=makespan)


def test_efficiency_and_utilization(scaling, tmp_path):
    _run_dir(tmp_path / "serial", 1, 100.0, [24.0] * 4)
    _run_dir(tmp_path / "parallel", 2, 60.0, [25.0] * 4)
    text, met = scaling.table(tmp_path)
    assert "= 100.0 / (2 x 60.0) = **0.833**" in text  # below 0.85
    assert "slot utilization over the parallel makespan: **83.3%**" in text  # 100 s of jobs / 120 slot-s
    assert "job-time inflation, parallel / serial mean job time: 1.042" in text
    assert met is False and "targets: MISSED" in text


def test_targets_met(scaling, tmp_path):
    _run_dir(tmp_path / "serial", 1, 100.0, [24.5] * 4)
    _run_dir(tmp_path / "parallel", 2, 50.5, [25.0] * 4)
    text, met = scaling.table(tmp_path)
    assert met is True and "| parallel | 2 | 4 | 4 | 50.5 | 100.0 | 25.0 | 99.0% |" in text
