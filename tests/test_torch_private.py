"""compiler/torch_private.py: the private torch APIs, each behind one function that names the torch
releases it was checked on; a clear message on any other, and the real thing on this torch. (A
package loaded through it: tests/tune/test_export_apply.py; kernel choices: test_kernel_choices.py.)"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from compiler import torch_private
from compiler.kernels import KernelChoiceRecorder
from compiler.torch_private import AOTI_LOADER, FEEDBACK_SAVER, TorchPrivateError

ROOT = Path(__file__).resolve().parents[1]


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
    # and the row says so, in its notes (`workers.bench_compile`)
    from types import SimpleNamespace

    from workers.bench_compile import _record_kernels

    run = SimpleNamespace(notes=[], result={})
    _record_kernels(run, recorder, set())
    assert run.notes == [f"no kernel choices recorded: {recorder.unavailable}"]


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


def test_no_other_module_reaches_these_apis():
    """The adapter is the one place: no module of the project names them itself."""
    needles = (
        "pt2_archive._package",
        "_C._aoti",
        "select_algorithm.add_feedback_saver",
        "feedback_saver_fns",
    )
    found = []
    for package in ("compiler", "workers", "orchestrator", "store", "reports"):
        for path in sorted((ROOT / package).rglob("*.py")):
            if path.name == "torch_private.py":
                continue
            if any(n in path.read_text() for n in needles):  # a docstring's mention is no use
                found += [f"{path.relative_to(ROOT)}: {n}" for n in needles if n in _code(path)]
    assert found == []
