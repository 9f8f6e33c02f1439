"""A sweep given as Python data (a notebook's dict) instead of a YAML file.

The data is copied into what a sweep file reads as (`yamlsrc`): strings, numbers, true/false,
None, lists and mappings, with names or numbers as keys; a tuple counts as a list. Anything else
(a `Path`, a NumPy integer, a set, an object), a list that contains itself, nesting deeper than
Python's stack, or more than `MAX_VALUES` values is an error at its key path, and the copy goes
through the same checks as a file (`sweep._build`). With no line to name, every error names
its key path: `sweep['configs']['ro']['mode']: ...`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from orchestrator.spec.checks import show
from orchestrator.spec.yamlsrc import MAX_VALUES, LocatedYaml, PathKey

LABEL = "sweep"
"""What a key path starts with in an error: `sweep['batch_sizes'][0]: ...`."""

_SCALARS = (str, int, float, bool)


class _Stop(Exception):
    """Data that cannot be copied at all (too large): one error, nothing else checked."""


def located_data(data: Any) -> LocatedYaml:
    """`data` as a sweep file's data, copied (the caller's objects are never kept or changed), with
    an error for each value no sweep file could hold."""
    src = LocatedYaml(LABEL, None, keyed=True)
    counted = [0]
    try:
        src.data = _plain(data, (), src, set(), counted)
    except _Stop as exc:
        src.data = None
        src.error((), str(exc))
    except RecursionError:
        src.data = None
        src.error((), "nested too deeply to read (thousands of levels)")
    return src


def _plain(value: Any, path: PathKey, src: LocatedYaml, active: set[int], counted: list[int]) -> Any:
    """A copy of `value` in plain data; None (with an error at `path`) where it is none."""
    counted[0] += 1
    if counted[0] > MAX_VALUES:
        raise _Stop(f"more than {MAX_VALUES} values; a sweep needs a few hundred")
    if value is None or isinstance(value, _SCALARS):
        return value
    if not isinstance(value, (Mapping, list, tuple)):
        src.error(
            path,
            f"the value {show(value)} is a {type(value).__name__}; a sweep holds strings, numbers, "
            "True/False, None, lists and dicts: convert it (str(), int(), float(), list())",
        )
        return None
    if id(value) in active:
        src.error(path, "refers to a list or dict that contains it (a cycle)")
        return None
    active.add(id(value))
    try:
        if isinstance(value, Mapping):
            return _mapping(value, path, src, active, counted)
        return [_plain(v, path + (i,), src, active, counted) for i, v in enumerate(value)]
    finally:
        active.discard(id(value))


def _mapping(
    value: Mapping, path: PathKey, src: LocatedYaml, active: set[int], counted: list[int]
) -> dict[Any, Any]:
    copy: dict[Any, Any] = {}
    for key, item in value.items():
        if not isinstance(key, _SCALARS):  # as in a file: a key is a name or a number
            src.error(path, f"a mapping key must be a name or number, got {show(key)}")
            continue
        copy[key] = _plain(item, path + (key,), src, active, counted)
    return copy
