"""Kernel choices as data: real CPU autotuning (Inductor's C++ GEMM template against MKL, which
max-autotune benchmarks on CPU once `freezing` folds the weights), recorded in the job process,
carried to the `kernel_choices` table by the sink, and queried as the README shows."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pyarrow.compute as pc
import pytest

from compiler.config import CompileConfig
from compiler.kernels import KernelChoiceRecorder
from orchestrator.store.rows import make_row, side_rows
from orchestrator.store.schema import read_results, read_table
from orchestrator.store.sink import ResultSink
from workers.job import Job, MeasureSpec, ModelSpec
from workers.runner import run_job

TUNED = CompileConfig(name="tuned", options={"max_autotune": True}, freezing=True)


def test_the_recorder_flags_timings_from_the_autotune_cache():
    """`from_cache`: Inductor counts each fresh benchmark; a saver call with no new count read the
    autotune cache. (The real autotuning is in the job test below; this one drives the saver.)"""
    from torch._dynamo.utils import counters

    class Node:
        def __init__(self, *size):
            self.size = size

        def get_size(self):
            return self.size

        def get_stride(self):
            return (self.size[-1], 1)

        def get_dtype(self):
            return "torch.float32"

    a, b = "choice_a", "choice_b"
    with KernelChoiceRecorder() as recorder:
        counters["inductor"]["select_algorithm_autotune"] += 1  # a fresh benchmark of this op
        recorder._save({a: 0.2, b: 0.1}, "mm", [Node(8, 64), Node(64, 32)], [a, b])
        recorder._save({a: 0.2, b: 0.1}, "mm", [Node(8, 64), Node(64, 32)], [a, b], "extra")  # cached
    fresh, cached = recorder.rows[:2], recorder.rows[2:]
    assert [r["from_cache"] for r in fresh] == [False, False] and [r["from_cache"] for r in cached] == [
        True
    ] * 2
    assert [r["is_winner"] for r in fresh] == [False, True] and [r["rank"] for r in fresh] == [2, 1]
    assert fresh[0]["input_shapes"] == ["8x64", "64x32"] and fresh[0]["input_dtypes"] == ["float32"] * 2
    assert [r["op_index"] for r in recorder.rows] == [0, 0, 1, 1]


class ExternKernelCaller:  # choice_kind goes by the class name, as for Inductor's own callers
    def __init__(self, name):
        self.name = name


class TritonTemplateCaller(ExternKernelCaller):
    pass


def test_an_epilogue_fusion_settlement_marks_the_emitted_kernel_not_the_fastest():
    """Inductor settles a MultiTemplateBuffer during fusion: here the template, fused with its
    epilogue, is emitted though the extern kernel was faster unfused. The recorder sees the call
    before Inductor's own method (which refuses these stand-ins with an AssertionError)."""
    from torch._inductor import ir

    class Node:
        def get_size(self):
            return (8, 8)

    ext, tem = ExternKernelCaller("extern_mm"), TritonTemplateCaller("triton_mm_3")
    ext2, tem2 = ExternKernelCaller("extern_addmm"), TritonTemplateCaller("triton_addmm_1")
    with KernelChoiceRecorder() as recorder:
        recorder._save({ext: 0.10, tem: 0.12}, "mm", [Node(), Node()], [ext, tem])
        recorder._save({ext2: 0.20, tem2: 0.15}, "addmm", [Node(), Node()], [ext2, tem2])
        with pytest.raises(AssertionError):
            ir.MultiTemplateBuffer.finalize_as_triton_caller(SimpleNamespace(choices=[ext, tem]), tem)
    assert (
        ir.MultiTemplateBuffer.finalize_as_triton_caller.__name__ == "finalize_as_triton_caller"
    )  # unwrapped
    by_choice = {r["choice"]: r for r in recorder.rows}
    assert by_choice["extern_mm"]["is_winner"] and not by_choice["extern_mm"]["emitted"]
    assert by_choice["triton_mm_3"]["emitted"] and not by_choice["triton_mm_3"]["is_winner"]
    # settled without a MultiTemplateBuffer: the winner is what is emitted
    assert by_choice["triton_addmm_1"]["emitted"] and by_choice["triton_addmm_1"]["is_winner"]
    assert not by_choice["extern_addmm"]["emitted"]
    assert (
        by_choice["triton_mm_3"]["fusion_benchmarked"] and not by_choice["extern_addmm"]["fusion_benchmarked"]
    )


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
    rows = tuned_result["kernel_choices"]  # Inductor's C++ GEMM template against MKL, really timed
    assert {r["kind"] for r in rows} >= {"cpp_template", "extern"}, rows
    assert {r["op"] for r in rows} == {"packed_linear"} and {r["op_index"] for r in rows} == {0}
    winner = next(r for r in rows if r["is_winner"])
    assert winner["rank"] == 1 and winner["time_ms"] == min(r["time_ms"] for r in rows)
    assert rows[0]["input_shapes"][0] == "8x64" and not any(r["from_cache"] for r in rows)
    assert set(choices.column("job_id").to_pylist()) == set(
        read_results(tmp_path).column("job_id").to_pylist()
    )
    assert set(choices.column("hardware").to_pylist()) == {"cpu"}
    assert pc.sum(choices.column("is_winner")).as_py() == 1
    assert pc.sum(choices.column("emitted")).as_py() == 1  # one kernel in the generated code

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
