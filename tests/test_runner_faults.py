"""Real job subprocesses that crash, hang, raise and go wrong become results with a status."""

from __future__ import annotations

import dataclasses
import os
import time
import uuid

import psutil
import pytest

from compiler.config import CompileConfig
from compiler.job import Job, MeasureSpec, ModelSpec
from workers.runner import run_job


def _job(factory: str, timeout_s: float = 60.0, backend: str = "eager") -> Job:
    return Job(
        sweep="faults",
        hardware="cpu",
        device="cpu",
        model=ModelSpec(id=f"python:tests.faulty:{factory}", name=factory),
        batch_size=2,
        dtype="fp32",
        config=CompileConfig(name="c", backend=backend),
        measure=MeasureSpec(warmup=1, iterations=3),
        timeout_s=timeout_s,
    )


def test_segfault_becomes_crash():
    result = run_job(_job("segfault"), threads=1)
    assert result["status"] == "crash"
    assert "SIGSEGV" in result["error"]
    assert "build" in result["error"]  # the phase it died in


def test_exception_in_forward_becomes_runtime_error():
    result = run_job(_job("raising"), threads=1)
    assert result["status"] == "runtime_error"
    assert "this model always fails" in result["error"]
    # the process's traceback is kept in the error; how the process and the runner speak is not
    # returned (a key that is no column would be dropped from the row)
    assert "--- traceback ---" in result["error"] and "in boom" in result["error"]
    assert not {"final", "phase", "traceback"} & set(result)


def test_failed_allocation_becomes_oom():
    result = run_job(_job("oom"), threads=1)
    assert result["status"] == "oom", result.get("error")
    assert "allocate" in result["error"]


def test_compiled_output_that_differs_becomes_accuracy_fail():
    result = run_job(_job("wrong_when_compiled"), threads=1)
    assert result["status"] == "accuracy_fail", result.get("error")
    assert result["max_abs_err"] == pytest.approx(1.0, rel=1e-6)
    assert result["eager_ms"] > 0 and result["compiled_ms"] > 0


def test_every_process_is_judged_by_the_fp64_rule():
    """Compiled and eager differ by more than fp32's 1e-3, but the compiled output is closer to
    fp64 than eager's: the first process passes the harness rule, and so must the later ones
    (compiling warm from its cache). They were once held to max relative error against their
    own eager output, and two H100 confirmations failed so (docs/results/h100-tune-runtime.md)."""
    job = _job("closer_to_fp64_when_compiled", backend="inductor")
    job = dataclasses.replace(job, measure=dataclasses.replace(job.measure, repeats=2))
    result = run_job(job, threads=1)
    assert result["status"] == "ok", result.get("error")
    assert result["repeats"] == 2 and result["job_processes"] == 2
    assert result["max_rel_err"] > 1e-3  # the old check against eager would have failed it
    assert result["rmse_compiled"] < result["rmse_eager"] / 100
    assert result["phase_accuracy_s"] > 0  # summed over both processes' accuracy phases


def test_ok_job_measures_everything():
    job = dataclasses.replace(_job("raising"), model=ModelSpec(id="python:workers.toy:mlp", name="mlp"))
    result = run_job(job, threads=1)
    assert result["status"] == "ok", result.get("error")
    for key in (
        "eager_ms",
        "compiled_ms",
        "eager_b2b_ms",
        "compiled_b2b_ms",
        "compile_s",
        "speedup",
        "peak_mem_bytes",
        "subprocess_s",
    ):
        assert result[key] > 0, key
    assert result["graph_count"] == 1 and result["graph_breaks"] == 0


def test_hang_is_killed_at_timeout_with_its_whole_process_tree():
    marker = f"co-test-{uuid.uuid4().hex}"
    os.environ["CO_TEST_MARKER"] = marker
    try:
        t0 = time.monotonic()
        # long enough for the imports (torch, transformers) on a busy 2-core machine
        result = run_job(_job("hang_with_child", timeout_s=15.0), threads=1)
        took = time.monotonic() - t0
    finally:
        del os.environ["CO_TEST_MARKER"]
    assert result["status"] == "timeout"
    assert "15 s" in result["error"] and "build" in result["error"]
    assert took < 15.0 + 10.0  # killed promptly: the timeout plus the TERM->KILL grace
    time.sleep(0.5)
    survivors = [p for p in psutil.process_iter(["cmdline"]) if marker in " ".join(p.info["cmdline"] or [])]
    assert not survivors, f"grandchild survived the timeout: {survivors}"


def test_a_missing_scratch_root_is_created_on_the_node(tmp_path):
    job = dataclasses.replace(_job("raising"), model=ModelSpec(id="python:workers.toy:mlp", name="mlp"))
    scratch_root = tmp_path / "not" / "yet"
    result = run_job(job, threads=1, scratch_root=str(scratch_root), keep_scratch=True)
    assert result["status"] == "ok", result.get("error")
    assert [p.name.startswith("job-") for p in scratch_root.iterdir()] == [True]
