"""Imports a job process skips: optional packages transformers loads as it imports a model's
code, for features no job uses.

Where they are installed, transformers' modules import some optional packages at module level,
under `if is_<package>_available():`: scipy.optimize for the Hungarian matching of the detection
and segmentation losses (`transformers.loss.loss_for_object_detection`, loaded with every model
through `modeling_utils`, and MaskFormer's own: 0.7 s on a 2-core machine with transformers
5.24), scikit-learn for assisted generation (`transformers.generation.candidate_generator` in
5.17: 1.5 s on the H100 host). A job computes no loss and generates nothing. While the model's
code loads (`without_unused_backends`), transformers sees these packages as absent, so those
modules skip the imports. After it the checks are transformers' own again, and in each module
that skipped such an import, every name the skipped block would have bound is a `Deferred`
stand-in that imports the real object at its first use (a call or an attribute), so a loss or a
generation run later still works. A module whose skipped block does more than import keeps
seeing the package as absent. Dynamo and Inductor, which the compile needs, are not touched
(transformers 5 loads part of them at import; they count as imports either way).
"""

from __future__ import annotations

import ast
import contextlib
import importlib
import sys
from collections.abc import Callable, Iterator
from typing import Any

UNUSED_BACKENDS = ("scipy", "sklearn")
"""Optional packages no job needs, as transformers' `is_<name>_available` names them."""


def _absent() -> bool:
    return False


class Deferred:
    """Stands in for `from SOURCE import NAME`, or for `import SOURCE` when NAME is None (which
    binds SOURCE's top package): imports it at the first call or attribute access, then
    behaves as it."""

    def __init__(self, source: str, name: str | None):
        self._source, self._name = source, name
        self._target: Any = None

    def _resolve(self) -> Any:
        if self._target is None:
            if self._name is None:
                importlib.import_module(self._source)
                self._target = sys.modules[self._source.split(".")[0]]
            else:
                try:  # a submodule (`from scipy import linalg`)
                    self._target = importlib.import_module(f"{self._source}.{self._name}")
                except ImportError:  # a function or a class
                    self._target = getattr(importlib.import_module(self._source), self._name)
        return self._target

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._resolve()(*args, **kwargs)

    def __getattr__(self, attr: str) -> Any:
        if attr.startswith("__"):
            raise AttributeError(attr)
        return getattr(self._resolve(), attr)

    def __repr__(self) -> str:
        what = self._source if self._name is None else f"{self._source}.{self._name}"
        return f"<{what}, imported at its first use (workers.lean_imports)>"


@contextlib.contextmanager
def without_unused_backends(packages: tuple[str, ...] = UNUSED_BACKENDS) -> Iterator[None]:
    """For the block, transformers' `is_<package>_available` says False for every one of
    `packages`; after it the checks are restored and the modules that skipped an import get
    `Deferred` stand-ins (`_restore_module`). Nothing changes where transformers is absent."""
    try:
        from transformers import utils
        from transformers.utils import import_utils
    except ImportError:
        yield
        return
    saved: dict[tuple[Any, str], Callable[[], bool]] = {}
    for package in packages:
        check = f"is_{package}_available"
        for module in (utils, import_utils):
            if callable(getattr(module, check, None)):
                saved[(module, check)] = getattr(module, check)
                setattr(module, check, _absent)
    try:
        yield
    finally:
        for (module, check), original in saved.items():
            setattr(module, check, original)
        originals = {check: original for (module, check), original in saved.items() if module is import_utils}
        for name, module in list(sys.modules.items()):
            if name.startswith("transformers") and module is not None:
                for check, original in originals.items():
                    if getattr(module, check, None) is _absent:
                        _restore_module(module, check, original)


def _restore_module(module: Any, check: str, original: Callable[[], bool]) -> None:
    """Give `module` its real `check` back and, where the package is installed, bind what its
    skipped `if check():` blocks import as `Deferred` stand-ins; a module whose block does
    anything but import keeps the package absent, as it loaded."""
    blocks = _skipped_imports(module, check)
    if blocks is None:
        return
    setattr(module, check, original)
    if not original():
        return
    for bound, (source, name) in blocks.items():
        if bound not in vars(module):
            setattr(module, bound, Deferred(source, name))


def _skipped_imports(module: Any, check: str) -> dict[str, tuple[str, str | None]] | None:
    """{name bound: (source, name imported or None for a module)} of the module-level
    `if check():` blocks of `module`'s source; None where its source cannot be read or a block
    holds anything but absolute imports, or has an `else`."""
    try:
        with open(module.__file__, encoding="utf-8") as f:
            tree = ast.parse(f.read())
    except (OSError, TypeError, SyntaxError, ValueError):
        return None
    bound: dict[str, tuple[str, str | None]] = {}
    for node in tree.body:
        test = node.test if isinstance(node, ast.If) else None
        if not (isinstance(test, ast.Call) and isinstance(test.func, ast.Name) and test.func.id == check):
            continue
        if node.orelse:  # what the module bound instead stays
            return None
        for stmt in node.body:
            if isinstance(stmt, ast.ImportFrom) and stmt.level == 0 and stmt.module:
                for alias in stmt.names:
                    bound[alias.asname or alias.name] = (stmt.module, alias.name)
            elif isinstance(stmt, ast.Import):
                for alias in stmt.names:
                    if alias.asname:  # `import a.b as c` binds a.b itself
                        parent, _, last = alias.name.rpartition(".")
                        bound[alias.asname] = (parent, last) if parent else (alias.name, None)
                    else:  # `import a.b` binds a, with a.b imported
                        bound[alias.name.split(".")[0]] = (alias.name, None)
            else:
                return None
    return bound
