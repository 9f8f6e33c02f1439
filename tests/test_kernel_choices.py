"""Kernel choices as data: real CPU autotuning (Inductor's C++ GEMM template against MKL, which
max-autotune benchmarks on CPU once `freezing` folds the weights), recorded in the job process,
carried to the `kernel_choices` table by the sink, and queried as docs/output.md shows. Each op's
choices are streamed to disk as they are timed, so a job killed mid-autotune keeps them, marked
partial."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pyarrow.compute as pc
import pytest

from compiler.config import CompileConfig
from compiler.job import Job, MeasureSpec, ModelSpec
from compiler.kernels import KernelChoiceRecorder, read_choice_stream
from store.rows import make_row, side_rows
from store.schema import read_results, read_table
from store.sink import ResultSink
from workers.bench import STALL_ENV, choices_stream
from workers.runner import keep_streamed_choices, run_job

TUNED = CompileConfig(name="tuned", options={"max_autotune": True}, freezing=True)


class Node:
    """An input node as the saver sees it (size, stride, dtype)."""

    def __init__(self, *size):
        self.size = size

    def get_size(self):
        return self.size

    def get_stride(self):
        return (self.size[-1], 1)

    def get_dtype(self):
        return "torch.float32"


def test_the_recorder_flags_timings_from_the_autotune_cache():
    """`from_cache`: Inductor counts each fresh benchmark; a saver call with no new count read the
    autotune cache. (The real autotuning is in the job test below; this one drives the saver.)"""
    from torch._dynamo.utils import counters

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


def _stream_ops(path, shapes: list[tuple[int, int, int]], after_op=None) -> KernelChoiceRecorder:
    """Drive a streaming recorder with one two-candidate mm per (m, k, n)."""
    a, b = "choice_a", "choice_b"
    with KernelChoiceRecorder(stream=path, after_op=after_op) as recorder:
        for i, (m, k, n) in enumerate(shapes):
            recorder._save({a: 0.2 + i, b: float("inf")}, "mm", [Node(m, k), Node(k, n)], [a, b])
    return recorder


def test_the_recorder_writes_each_op_to_its_stream_before_the_compile_goes_on(tmp_path):
    stream = choices_stream(tmp_path / "result.json")  # beside the process's RESULT.json
    assert stream == tmp_path / "result.kernel_choices.jsonl"
    on_disk = []
    recorder = _stream_ops(
        stream, [(8, 64, 32), (8, 32, 16)], after_op=lambda ops: on_disk.append(read_choice_stream(stream)[0])
    )
    assert on_disk == [1, 2]  # each op's line was readable when the next op began
    ops, rows = read_choice_stream(stream)
    assert ops == 2 and [r["op_index"] for r in rows] == [0, 0, 1, 1]
    # the stream's rows are the recorder's own, marked partial, without what only a finished
    # compile knows (the kernel emitted)
    assert all(r["partial"] for r in rows) and not any("emitted" in r for r in rows)
    settled = ("partial", "emitted", "fusion_benchmarked")
    assert [{k: v for k, v in r.items() if k not in settled} for r in recorder.rows] == [
        {k: v for k, v in r.items() if k != "partial"} for r in rows
    ]
    assert rows[1]["time_ms"] is None and rows[0]["is_winner"]  # an infinite time is a failed candidate
    assert {r["partial"] for r in recorder.rows} == {False}  # the compile returned: whole


def test_a_torn_last_line_is_the_op_in_progress_and_is_skipped(tmp_path):
    stream = tmp_path / "s.jsonl"
    _stream_ops(stream, [(8, 64, 32), (8, 32, 16)])
    whole = stream.read_text()
    stream.write_text(whole + whole.splitlines()[0][:57])  # killed while writing a third op
    ops, rows = read_choice_stream(stream)
    assert ops == 2 and len(rows) == 4
    assert read_choice_stream(tmp_path / "never-written.jsonl") == (0, [])


def test_a_result_cut_short_takes_the_streamed_choices_and_a_finished_one_keeps_its_own(tmp_path):
    stream = tmp_path / "s.jsonl"
    recorder = _stream_ops(stream, [(8, 64, 32), (8, 32, 16), (8, 16, 8)])
    killed = {"phase": "compile", "eager_ms": 1.0}  # RESULT.json as the process last wrote it
    assert keep_streamed_choices(killed, stream) == (
        "after autotuning 3 ops (6 candidates kept in kernel_choices, marked partial)"
    )
    assert killed["autotuned_ops"] == 3 and len(killed["kernel_choices"]) == 6
    assert {r["partial"] for r in killed["kernel_choices"]} == {True}
    # a compile that returned reported its whole rows itself: the stream is not counted again
    finished = {"compile_s": 2.0, "kernel_choices": recorder.rows, "autotuned_ops": 3}
    assert keep_streamed_choices(finished, stream) is None
    assert finished["kernel_choices"] is recorder.rows and finished["autotuned_ops"] == 3
    assert keep_streamed_choices({"phase": "compile"}, tmp_path / "none.jsonl") is None


def test_partial_choices_reach_the_tables_marked_and_orchestrate_kernels_shows_them(
    tuned_job, make_result, tmp_path, capsys
):
    """What the driver does with a timed-out job's result: partial rows in kernel_choices, the
    count in results, and `orchestrate kernels` showing them instead of saying nothing autotuned."""
    from orchestrator.cli import main

    stream = tmp_path / "s.jsonl"
    _stream_ops(stream, [(8, 64, 32), (8, 32, 16)])
    result = make_result(status="timeout", eager_ms=1.0, compiled_ms=None, compile_s=None, phase="compile")
    result["error"] = "timed out after 60 s in phase 'compile', " + keep_streamed_choices(result, stream)
    del result["phase"]  # the runner returns no phase: it is in the error
    out = tmp_path / "out"
    sink = ResultSink(out)
    sink.add(make_row(tuned_job, result, run_id="r1"), side_rows(tuned_job, result, run_id="r1"))
    sink.close()
    choices = read_table(out, "kernel_choices").to_pylist()
    assert len(choices) == 4 and {r["partial"] for r in choices} == {True}
    assert {r["emitted"] for r in choices} == {None} and {r["fusion_benchmarked"] for r in choices} == {None}
    (row,) = read_results(out).to_pylist()
    assert row["status"] == "timeout" and row["autotuned_ops"] == 2
    assert "after autotuning 2 ops (4 candidates kept in kernel_choices" in row["error"]

    assert main(["kernels", str(out)]) == 0
    printed = capsys.readouterr().out
    lines = [x for x in printed.splitlines() if "| mm |" in x]
    assert len(lines) == 2 and all("| 1 (1 partial) |" in x and "none (partial compile)" in x for x in lines)
    assert "2 of 2 autotuned ops come from 1 compile(s) that did not finish" in printed


def test_kernels_without_rows_names_the_compiles_that_never_finished_an_op(
    tuned_job, make_result, tmp_path, capsys
):
    from orchestrator.cli import main

    result = make_result(status="timeout", compiled_ms=None, error="timed out after 60 s in phase 'compile'")
    sink = ResultSink(tmp_path)
    sink.add(make_row(tuned_job, result, run_id="r1"), side_rows(tuned_job, result, run_id="r1"))
    sink.close()
    assert main(["kernels", str(tmp_path)]) == 2
    assert "1 job(s) ended in their compile before autotuning finished an op" in capsys.readouterr().err


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
    assert not any(r["partial"] for r in rows) and tuned_result["autotuned_ops"] == 1  # a whole compile
    assert set(choices.column("job_id").to_pylist()) == set(
        read_results(tmp_path).column("job_id").to_pylist()
    )
    assert set(choices.column("hardware").to_pylist()) == {"cpu"}
    assert pc.sum(choices.column("is_winner")).as_py() == 1
    assert pc.sum(choices.column("emitted")).as_py() == 1  # one kernel in the generated code

    # docs/output.md's query: which GEMM kernel won for this shape on this hardware class.
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


@pytest.mark.integration
def test_a_job_killed_by_its_timeout_mid_autotune_keeps_the_choices_it_had_made(
    tuned_job, monkeypatch, tmp_path, capsys
):
    """A real CPU max-autotune compile with freezing (three Linear layers of distinct shapes: three
    packed_linear ops, each timed as Inductor's C++ GEMM template against MKL) killed by the job's
    real timeout after two of its ops. The test hook stalls the job process inside the compile
    once two ops are on disk, so the timeout lands there however busy the machine is, as long
    as two ops take less than the timeout (about 13 s of the 40 on an idle 2-core machine)."""
    monkeypatch.setenv(STALL_ENV, "2")
    job = dataclasses.replace(
        tuned_job, model=ModelSpec(id="python:workers.toy:mlp", name="mlp"), timeout_s=40
    )
    result = run_job(job, threads=1)
    assert f"{STALL_ENV}: stalled the compile after 2 autotuned ops" in (result.get("notes") or ""), (
        "the timeout landed before two ops were autotuned (a machine too busy for this test's timeout?): "
        + str(result.get("error"))[:500]
    )
    rows = result["kernel_choices"]
    assert result["status"] == "timeout" and result["autotuned_ops"] == 2
    assert (
        f"timed out after 40 s in phase 'compile', after autotuning 2 ops ({len(rows)} candidates kept in "
        "kernel_choices, marked partial)" in result["error"]
    )
    assert {r["op_index"] for r in rows} == {0, 1} and {r["op"] for r in rows} == {"packed_linear"}
    assert [r["input_shapes"][0] for r in rows if r["is_winner"]] == ["8x128", "8x256"]
    assert {r["kind"] for r in rows} >= {"cpp_template", "extern"}
    assert all(r["partial"] and r["time_ms"] and not r["from_cache"] for r in rows)

    sink = ResultSink(tmp_path)
    sink.add(make_row(job, result, run_id="r1"), side_rows(job, result, run_id="r1"))
    sink.close()
    choices = read_table(tmp_path, "kernel_choices").to_pylist()
    assert len(choices) == len(rows) and {r["partial"] for r in choices} == {True}
    assert {r["emitted"] for r in choices} == {None}  # the compile never generated code
    (row,) = read_results(tmp_path).to_pylist()
    assert row["status"] == "timeout" and row["autotuned_ops"] == 2

    from orchestrator.cli import main

    assert main(["kernels", str(tmp_path)]) == 0
    printed = capsys.readouterr().out
    assert sum("packed_linear" in x and "none (partial compile)" in x for x in printed.splitlines()) == 2
    assert "2 of 2 autotuned ops come from 1 compile(s) that did not finish" in printed


@pytest.mark.integration
def test_a_job_process_killed_mid_autotune_keeps_the_choices_it_had_made(tuned_job, monkeypatch, tmp_path):
    """The crash path: the job process is SIGKILLed (as the kernel's OOM killer would) while it
    compiles, after two ops are on disk. The runner classifies the crash and keeps those ops."""
    import signal
    import threading
    import time

    import psutil

    monkeypatch.setenv(STALL_ENV, "2")
    job = dataclasses.replace(
        tuned_job, model=ModelSpec(id="python:workers.toy:mlp", name="mlp"), timeout_s=600
    )
    scratch = tmp_path / "scratch"
    out: dict = {}
    worker = threading.Thread(target=lambda: out.update(run_job(job, threads=1, scratch_root=str(scratch))))
    worker.start()
    killed = None
    deadline = time.monotonic() + 300
    while worker.is_alive() and killed is None and time.monotonic() < deadline:
        for stream in scratch.glob("job-*/*.jsonl"):
            if read_choice_stream(stream)[0] >= 2:
                bench = [
                    p
                    for p in psutil.Process().children(recursive=True)
                    if "workers.bench" in " ".join(p.cmdline())
                ]
                for p in bench:
                    p.send_signal(signal.SIGKILL)
                killed = len(bench)
        time.sleep(0.2)
    worker.join(timeout=120)
    assert killed, f"the job never got two ops on disk: {str(out.get('error'))[:500]}"
    assert (
        out["status"] == "crash"
        and "killed by SIGKILL" in out["error"]
        and "in phase 'compile'" in out["error"]
    )
    assert "after autotuning 2 ops" in out["error"] and out["autotuned_ops"] == 2
    rows = out["kernel_choices"]
    assert {r["op_index"] for r in rows} == {0, 1} and all(r["partial"] for r in rows)
