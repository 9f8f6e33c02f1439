"""Kernel choices as data: real CPU autotuning (Inductor's C++ GEMM template against MKL, which
max-autotune benchmarks on CPU once `freezing` folds the weights), recorded in the job process,
carried to the `kernel_choices` table by the sink, and queried as the README shows."""

from __future__ import annotations

import dataclasses

import pyarrow.compute as pc
import pytest

from compiler.config import CompileConfig
from compiler.kernels import KernelChoiceRecorder
from orchestrator.rows import make_row, side_rows
from orchestrator.schema import read_results, read_table
from orchestrator.sink import ResultSink
from workers import toy
from workers.job import Job, MeasureSpec, ModelSpec
from workers.runner import run_job

TUNED = CompileConfig(name="tuned", options={"max_autotune": True}, freezing=True)


def test_recorder_sees_every_candidate_and_then_the_autotune_cache(
    restore_inductor_config, tmp_path, monkeypatch
):
    import torch._dynamo

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))  # nothing autotuned before
    model, inputs = toy.linear(8)
    TUNED.apply_globals()
    runs = []
    for _ in range(2):  # the second compile finds the timings in Inductor's autotune cache
        torch._dynamo.reset()
        with torch.no_grad(), KernelChoiceRecorder() as recorder:
            torch.compile(model, **TUNED.compile_kwargs())(**inputs)
        runs.append(recorder.rows)
    fresh, cached = runs
    assert {r["kind"] for r in fresh} >= {"cpp_template", "extern"}, fresh
    assert {r["op"] for r in fresh} == {"packed_linear"} and {r["op_index"] for r in fresh} == {0}
    assert [r["is_winner"] for r in fresh].count(True) == 1
    winner = next(r for r in fresh if r["is_winner"])
    assert winner["rank"] == 1 and winner["time_ms"] == min(r["time_ms"] for r in fresh)
    assert fresh[0]["input_shapes"][0] == "8x64" and fresh[0]["input_dtypes"][0] == "float32"
    assert not any(r["from_cache"] for r in fresh) and all(r["from_cache"] for r in cached)
    assert [(r["kind"], r["rank"]) for r in cached] == [(r["kind"], r["rank"]) for r in fresh]


@pytest.fixture
def restore_inductor_config():
    import torch._dynamo
    import torch._inductor.config as inductor_config

    saved = inductor_config.freezing
    yield
    inductor_config.freezing = saved
    torch._dynamo.reset()


@pytest.fixture(scope="module")
def tuned_job() -> Job:
    return Job(
        sweep="kc",
        hardware="cpu",
        device="cpu",
        model=ModelSpec(id="python:workers.toy:linear", name="linear"),
        batch_size=8,
        dtype="fp32",
        config=TUNED,
        measure=MeasureSpec(warmup=2, iterations=6, rounds=3, flops=False),
        timeout_s=600,
    )


@pytest.fixture(scope="module")
def tuned_result(tuned_job) -> dict:
    return run_job(tuned_job, threads=1)


def test_a_tuned_job_reports_its_choices_and_the_sink_writes_them(tuned_job, tuned_result, tmp_path, capsys):
    assert tuned_result["status"] == "ok", tuned_result.get("error")
    sink = ResultSink(tmp_path)
    sink.add(make_row(tuned_job, tuned_result, run_id="r1"), side_rows(tuned_job, tuned_result, run_id="r1"))
    sink.close()
    choices = read_table(tmp_path, "kernel_choices")
    assert choices.num_rows == len(tuned_result["kernel_choices"]) >= 2
    assert set(choices.column("job_id").to_pylist()) == set(
        read_results(tmp_path).column("job_id").to_pylist()
    )
    assert set(choices.column("hardware").to_pylist()) == {"cpu"}
    assert pc.sum(choices.column("is_winner")).as_py() == 1

    # The README's query: which GEMM kernel won for this shape on this hardware class.
    wins = choices.filter(
        pc.and_(
            pc.equal(choices["hardware"], "cpu"),
            pc.and_(choices["is_winner"], pc.equal(pc.list_element(choices["input_shapes"], 0), "8x64")),
        )
    ).select(["op", "choice", "kind", "time_ms"])
    assert wins.num_rows == 1 and wins.column("op")[0].as_py() == "packed_linear"

    # `orchestrate kernels OUT`: the same answer, one line per op signature
    from orchestrator.cli import main

    assert main(["kernels", str(tmp_path), "--hardware", "cpu"]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if "packed_linear" in x)
    assert (
        "| 8x64" in line and f"{wins.column('kind')[0].as_py()}: {wins.column('choice')[0].as_py()}" in line
    )
    assert main(["kernels", str(tmp_path), "--hardware", "H100"]) == 2


def test_an_untuned_job_has_no_choices(tuned_job, tmp_path):
    plain = dataclasses.replace(tuned_job, config=CompileConfig(name="default"))
    assert side_rows(plain, {"status": "ok"}, run_id="r1") == {}
