"""compiler/torch_private.py: the private torch APIs, each behind one function that names the torch
releases it was checked on; a clear message on any other, and the real thing on this torch. (A
package loaded through it: tests/tune/test_export_apply.py; kernel choices: test_kernel_choices.py;
capture statistics and the accuracy rule: test_measure_method.py.) On an unchecked torch (a
version string: nothing of torch itself is mocked) each use costs what the adapter's docstring
says, and the row's notes or error say why."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from compiler import torch_private
from compiler.kernels import KernelChoiceRecorder
from compiler.torch_private import (
    ACCURACY_SAME,
    AOTI_BUILD,
    AOTI_LOADER,
    COMPILE_METRICS,
    FEEDBACK_SAVER,
    TEMPLATE_SETTLEMENT,
    TRITON_AUTOTUNERS,
    TorchPrivateError,
)

ROOT = Path(__file__).resolve().parents[1]
UNCHECKED = "2.99.0"


@pytest.fixture
def unchecked(monkeypatch):
    """This process's torch as a newer, unchecked release names itself."""
    monkeypatch.delenv(torch_private.UNCHECKED_ENV, raising=False)
    monkeypatch.setattr(torch_private, "torch_version", lambda: UNCHECKED)


def refusal(api) -> str:
    """The start of what `api` says on the unchecked torch."""
    return (
        f"{api.name} is a private torch API, checked on torch 2.11, 2.13; "
        f"this is torch {UNCHECKED}, where it was not checked"
    )


def _savers() -> list:
    from torch._inductor import select_algorithm

    return select_algorithm.get_algorithm_selector_cache().feedback_saver_fns


def test_this_torch_is_one_the_apis_were_checked_on():
    assert torch_private.release("2.13.0+cpu") == "2.13" and torch_private.release("2.11.0+cu130") == "2.11"
    assert torch_private.release() in AOTI_LOADER.checked_on
    for api in torch_private.APIS:
        torch_private.require(api)  # no error: CI's torch (constraints.txt) is a checked one


@pytest.mark.parametrize("api", torch_private.APIS, ids=lambda a: a.name.split(".")[-1])
def test_an_unchecked_torch_is_refused_with_what_to_do(api, monkeypatch):
    monkeypatch.delenv(torch_private.UNCHECKED_ENV, raising=False)
    with pytest.raises(TorchPrivateError) as caught:
        torch_private.require(api, "2.99.0+cu140")
    text = str(caught.value)
    assert text.startswith(f"{api.name} is a private torch API, checked on torch 2.11, 2.13; ")
    assert "this is torch 2.99.0+cu140, where it was not checked" in text
    assert "constraints.txt" in text and f"{torch_private.UNCHECKED_ENV}=1" in text
    monkeypatch.setenv(torch_private.UNCHECKED_ENV, "1")  # try anyway
    torch_private.require(api, "2.99.0+cu140")


def test_an_api_that_moved_is_the_same_clear_message():
    """What a checked release would say if its build lacked the API (torch's own AttributeError)."""
    from torch._inductor import select_algorithm

    with pytest.raises(TorchPrivateError, match=r"lacks it or changed it \(AttributeError: .*no_such_saver"):
        torch_private.use(FEEDBACK_SAVER, lambda: select_algorithm.no_such_saver)


def test_feedback_savers_are_added_and_removed_on_this_torch():
    def saver(*args):
        pass

    torch_private.add_feedback_saver(saver)
    try:
        assert saver in _savers()
    finally:
        torch_private.remove_feedback_saver(saver)
    assert saver not in _savers()
    torch_private.remove_feedback_saver(saver)  # removing one that is not there: nothing happens


def test_the_recorder_on_an_unchecked_torch_records_nothing_and_says_why(monkeypatch):
    monkeypatch.delenv(torch_private.UNCHECKED_ENV, raising=False)
    monkeypatch.setattr(torch_private, "torch_version", lambda: "2.99.0")  # as a newer torch says
    before = list(_savers())
    warned = pytest.warns(RuntimeWarning, match="no kernel choices recorded: .* checked on torch 2.11, 2.13")
    with warned, KernelChoiceRecorder() as recorder:
        assert _savers() == before  # nothing registered: the compile would go on unrecorded
    assert recorder.unavailable and recorder.rows == []
    # and the row says so, in its notes (`workers.bench.compile`)
    from workers.bench.compile import _record_kernels

    run = SimpleNamespace(notes=[], result={})
    _record_kernels(run, recorder, set())
    assert run.notes[0] == f"no kernel choices recorded: {recorder.unavailable}"
    assert run.notes[1].startswith("no Triton kernel rows recorded: ")  # (TRITON_AUTOTUNERS, below)
    assert len(run.notes) == 2 and "kernel_choices" not in run.result


# --- TEMPLATE_SETTLEMENT: which candidate Inductor emitted -----------------------------------------


class ExternKernelCaller:  # stand-ins for Inductor's candidates (choice_kind goes by class name)
    def __init__(self, name):
        self.name = name


class TritonTemplateCaller(ExternKernelCaller):
    pass


class Node:
    def get_size(self):
        return (8, 8)


def test_template_settlements_are_watched_and_unwatched_on_this_torch():
    from torch._inductor import ir, scheduler

    originals = (
        ir.MultiTemplateBuffer.finalize_as_triton_caller,
        ir.MultiTemplateBuffer.finalize_as_triton_callers,
        scheduler.Scheduler._replace_node,
    )
    seen = []
    undo = torch_private.watch_template_settlement(
        lambda *a: seen.append("template"), lambda *a: seen.append("templates"), lambda *a: 1 / 0
    )
    try:
        assert ir.MultiTemplateBuffer.finalize_as_triton_caller is not originals[0]
        with pytest.raises(Exception):  # noqa: B017 (Inductor's own method refuses the stand-in, after the watcher)
            ir.MultiTemplateBuffer.finalize_as_triton_caller(SimpleNamespace(choices=[]), object())
        with pytest.raises(Exception) as caught:  # a watcher that fails leaves Inductor's own error
            scheduler.Scheduler._replace_node(SimpleNamespace(), None, None, 0, None)
        assert not isinstance(caught.value, ZeroDivisionError)
    finally:
        undo()
    assert seen == ["template"]
    assert (
        ir.MultiTemplateBuffer.finalize_as_triton_caller,
        ir.MultiTemplateBuffer.finalize_as_triton_callers,
        scheduler.Scheduler._replace_node,
    ) == originals


def test_an_unchecked_settlement_records_the_choices_without_emitted_and_says_why(unchecked, monkeypatch):
    """A newer torch on which only the settlement is not checked: its choices are recorded, with
    `emitted` and `fusion_benchmarked` null (not guessed from the winner), and the notes say why.
    (Dynamo's counters are not checked there either: `from_cache` is null.)"""
    from torch._inductor import ir

    from workers.bench.compile import _record_kernels

    with pytest.raises(TorchPrivateError) as caught:
        torch_private.watch_template_settlement(print, print, print)
    assert str(caught.value).startswith(refusal(TEMPLATE_SETTLEMENT))
    saver = dataclasses.replace(FEEDBACK_SAVER, checked_on=(*FEEDBACK_SAVER.checked_on, "2.99"))
    monkeypatch.setattr(torch_private, "FEEDBACK_SAVER", saver)
    original = ir.MultiTemplateBuffer.finalize_as_triton_caller
    ext, tem = ExternKernelCaller("extern_mm"), TritonTemplateCaller("triton_mm_3")
    warned = pytest.warns(RuntimeWarning, match="kernel choices recorded without `emitted`: .*_replace_node")
    with warned, KernelChoiceRecorder() as recorder:
        assert ir.MultiTemplateBuffer.finalize_as_triton_caller is original  # nothing wrapped
        recorder._save({ext: 0.10, tem: 0.12}, "mm", [Node(), Node()], [ext, tem])
    assert recorder.unavailable is None and str(recorder.emitted_unavailable) == str(caught.value)
    assert [r["choice"] for r in recorder.rows if r["is_winner"]] == ["extern_mm"]
    assert {(r["emitted"], r["fusion_benchmarked"], r["from_cache"]) for r in recorder.rows} == {
        (None, None, None)
    }
    run = SimpleNamespace(notes=[], result={})
    _record_kernels(run, recorder, set())
    assert run.result["kernel_choices"] == recorder.rows and run.result["autotuned_ops"] == 1
    assert run.notes[0] == f"kernel choices recorded without `emitted`: {recorder.emitted_unavailable}"


# --- TRITON_AUTOTUNERS: the generated Triton kernels --------------------------------------------------


def test_triton_kernels_are_looked_up_on_this_torch():
    from compiler.kernels import autotuner_ids, triton_kernel_rows

    assert torch_private.loaded_triton_autotuners() == []  # CPU: Inductor emits C++, not Triton
    assert autotuner_ids() == set() and triton_kernel_rows() == []


def test_an_unchecked_torch_records_no_triton_kernels_and_says_why(unchecked):
    from compiler.kernels import autotuner_ids, triton_kernel_rows
    from workers.bench.compile import _record_kernels

    for call in (torch_private.loaded_triton_autotuners, triton_kernel_rows):
        with pytest.raises(TorchPrivateError) as caught:
            call()
        assert str(caught.value).startswith(refusal(TRITON_AUTOTUNERS))
    assert autotuner_ids() == set()  # the baseline's kernels: none to leave out, nothing to fail
    nothing = SimpleNamespace(rows=[], ops=0, stream_error=None, unavailable=None, emitted_unavailable=None)
    run = SimpleNamespace(notes=[], result={})
    _record_kernels(run, nothing, set())  # the job goes on
    assert run.notes == [f"no Triton kernel rows recorded: {caught.value}"] and run.result == {}


# --- COMPILE_METRICS: graphs, breaks, recompiles, compile times, cache counts ---------------------------


def test_compile_metrics_are_torchs_own_on_this_torch():
    from torch._dynamo.utils import counters

    from compiler import capture

    assert torch_private.dynamo_counters() is counters
    assert isinstance(torch_private.compilation_metrics(), list)
    assert isinstance(torch_private.inductor_kernel_count(), int)
    assert capture.capture_stats().unavailable == ()


def test_an_unchecked_torch_gives_null_capture_statistics_and_says_why_once(unchecked):
    from torch._dynamo.utils import counters

    from compiler import capture
    from workers.bench.compile import _record_capture

    for call in (
        torch_private.dynamo_counters,
        torch_private.compilation_metrics,
        torch_private.inductor_kernel_count,
        torch_private.clear_compile_metrics,
    ):
        with pytest.raises(TorchPrivateError) as caught:
            call()
        assert str(caught.value).startswith(refusal(COMPILE_METRICS))
    counters["co_test"]["kept"] += 1
    try:
        capture.reset(dynamo=False)  # no error: only Dynamo would be reset
        assert counters["co_test"]["kept"] == 1
    finally:
        del counters["co_test"]
    stats = capture.capture_stats()
    assert stats.unavailable == (str(caught.value),)  # three refused reads, one reason
    row = stats.to_dict()
    assert "unavailable" not in row and set(row.values()) == {None}  # null, not zero: not read
    assert capture.fxgraph_cache_counts() == {"fxgraph_cache_hits": None, "fxgraph_cache_misses": None}
    run = SimpleNamespace(notes=[], result={})
    _record_capture(run, stats)
    _record_capture(run, stats)  # (a second compile of the process: the note stays one)
    assert run.notes == [f"no capture statistics recorded: {caught.value}"]
    assert run.result["graph_breaks"] is None and run.result["break_reasons"] is None


# --- ACCURACY_SAME: the benchmark harness's accuracy rule ------------------------------------------------


def test_an_unchecked_torch_cannot_judge_accuracy_and_the_job_says_why(unchecked):
    """The accuracy rule itself: no verdict (ok or accuracy_fail) without it, but the job's error
    (`workers.bench.run.main` ends a job whose phase raised `runtime_error`, with `JobRecord.fail`)."""
    from compiler.measure import check_against_fp64
    from workers.bench.record import JobRecord

    x = torch.randn(4, 8)
    labels = torch.tensor([3, 1, 2])
    for outputs in ([x], [labels]):  # refused before any output is looked at
        with pytest.raises(TorchPrivateError) as caught:
            check_against_fp64(outputs, [t.clone() for t in outputs], [t.double() for t in outputs], "fp32")
        assert str(caught.value).startswith(refusal(ACCURACY_SAME))
    run = SimpleNamespace(result={}, notes=[], shared_cache=None)  # a job process before its compile stack
    JobRecord.fail(run, "runtime_error", caught.value)
    assert run.result["status"] == "runtime_error"
    assert run.result["error"].startswith(f"TorchPrivateError: {refusal(ACCURACY_SAME)}")


def test_the_accuracy_rule_is_torchs_own_on_this_torch():
    same = torch_private.harness_same()
    x = torch.randn(16)
    assert same(x, x.clone(), fp64_ref=x.double(), tol=1e-3, equal_nan=True, exact_dtype=False)
    assert not same(x, x + 1, fp64_ref=x.double(), tol=1e-3, log_error=lambda *a: None)
    with pytest.raises(TorchPrivateError, match=r"lacks it or changed it \(TypeError: "):
        same(x, x, no_such_argument=1)  # what a changed signature says


# --- AOTI_BUILD: what AOTInductor builds a package with ---------------------------------------------------

STATIC_ONLY_CXX = """#!/bin/sh
case "$1" in -print-file-name=*) echo "${1#-print-file-name=}"; exit 0 ;; esac
exec g++ "$@"
"""
"""A C++ compiler with only the static libstdc++ (it answers a bare name: `aoti.links_shared_runtime`)."""


@pytest.fixture
def static_only_cxx(tmp_path, monkeypatch) -> str:
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    cxx = tmp_path / "bin" / "g++"
    cxx.parent.mkdir()
    cxx.write_text(STATIC_ONLY_CXX)
    cxx.chmod(0o755)
    return str(cxx)


def test_a_package_build_asks_inductor_on_this_torch(static_only_cxx, tmp_path):
    from compiler import aoti

    assert torch_private.inductor_cpp_compiler() and torch_private.inductor_cache_dir() == str(
        tmp_path / "inductor"
    )
    options = aoti.runtime_link_options(static_only_cxx)
    assert Path(options["cpp.cxx"][1]).is_relative_to(tmp_path / "inductor" / "aoti-runtime")


def test_an_unchecked_torch_links_packages_as_inductor_does_and_says_why(unchecked, static_only_cxx):
    from compiler import aoti

    for call in (torch_private.inductor_cpp_compiler, torch_private.inductor_cache_dir):
        with pytest.raises(TorchPrivateError) as caught:
            call()
        assert str(caught.value).startswith(refusal(AOTI_BUILD))
    for cxx in (static_only_cxx, None):  # the compiler named, or Inductor's own
        with pytest.warns(
            RuntimeWarning, match=r"the package links libstdc\+\+ as Inductor links it: .*cpp_builder"
        ):
            assert aoti.runtime_link_options(cxx) == {}  # as on any other error


# --- the adapter is the one place -----------------------------------------------------------------------


def _code(path: Path) -> str:
    """The module's code without its docstrings and comments (which may name an API)."""
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        first = body[0] if isinstance(body, list) and body else None
        if (
            isinstance(first, ast.Expr)
            and isinstance(first.value, ast.Constant)
            and isinstance(first.value.value, str)
        ):
            body[0] = ast.Pass()
    return ast.unparse(tree)


NEEDLES = (
    # REMOTE_CACHE, COMPILE_WORKERS, AUTOTUNE_FILE (compiler/torch_private_cache.py)
    "_inductor.remote_cache",
    "inductor import remote_cache",
    "backend_override_cls",
    "cache_stats",
    "_worker_compile_triton",
    "PersistentCache",
    "AlgorithmSelectorCache",
    # AOTI_LOADER
    "pt2_archive._package",
    "_C._aoti",
    # FEEDBACK_SAVER
    "select_algorithm.add_feedback_saver",
    "feedback_saver_fns",
    # TEMPLATE_SETTLEMENT
    "finalize_as_triton_caller",
    "_replace_node",
    # TRITON_AUTOTUNERS
    "PyCodeCache",
    "CachingAutotuner",
    # COMPILE_METRICS and ACCURACY_SAME (every use of Dynamo's utilities, however imported)
    "_dynamo.utils",
    "dynamo.utils import counters",
    "get_compilation_metrics",
    "clear_compilation_metrics",
    "utils import same",
    "inductor import metrics",
    "_inductor.metrics",
    # AOTI_BUILD
    "cpp_builder",
    "cache_dir_utils",
    # BUNDLE_FORMAT
    "_appending_byte_serializer",
    "compiler._cache",
    "_artifact_types",
    "_ensure_cache_artifacts_registered",
)
PACKAGES = ("compiler", "workers", "orchestrator", "store", "reports", "benchmarks")
EXEMPT = {
    # The CPU ISA probe's cache, left outside on purpose (torch_private's docstring): it asks for
    # Inductor's compiler and cache directory to key and seed that cache, and its caller skips it on
    # any error.
    ("compiler/isa_probe.py", "cpp_builder"),
    ("compiler/isa_probe.py", "cache_dir_utils"),
    # Hand-run measurement scripts, not a job's code: they read Dynamo's counters (and bundle.py its
    # compile_times, in a try) for the lines they print. dynamo_cache.py is the canary meant to be
    # run on a torch nobody checked yet, so an adapter refusing it would defeat it.
    ("benchmarks/bundle.py", "_dynamo.utils"),
    ("benchmarks/bundle.py", "dynamo.utils import counters"),
    ("benchmarks/dynamo_cache.py", "_dynamo.utils"),
    ("benchmarks/dynamo_cache.py", "dynamo.utils import counters"),
}


def _reaches(path: Path) -> list[str]:
    """The needles `path`'s code names (not its docstrings or comments)."""
    if not any(n in path.read_text() for n in NEEDLES):  # cheap first: most modules name none
        return []
    code = _code(path)
    return [n for n in NEEDLES if n in code]


def test_no_other_module_reaches_these_apis():
    """The adapter is the one place: no module of the project names them itself, but the exempt."""
    found, exempted = [], set()
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            if path.name in ("torch_private.py", "torch_private_cache.py"):
                continue
            name = path.relative_to(ROOT).as_posix()
            for needle in _reaches(path):
                if (name, needle) in EXEMPT:
                    exempted.add((name, needle))
                else:
                    found.append(f"{name}: {needle}")
    assert found == []
    assert exempted == EXEMPT  # an exemption no longer needed goes


def test_the_scan_finds_a_direct_use_and_not_a_mention(tmp_path):
    module = tmp_path / "m.py"
    module.write_text(
        '"""Reads torch._dynamo.utils.counters and PyCodeCache, as its docstring says."""\n'
        "def f():\n"
        '    """Mentions get_compilation_metrics."""\n'
        "    # and cpp_builder in a comment\n"
        "    from torch._dynamo.utils import counters\n"
        "    import torch._inductor.codecache as c\n"
        "    return counters, c.PyCodeCache\n"
    )
    assert _reaches(module) == ["PyCodeCache", "_dynamo.utils", "dynamo.utils import counters"]
    module.write_text('"""Reads torch._dynamo.utils.counters."""\n# cpp_builder\nX = 1\n')
    assert _reaches(module) == []
