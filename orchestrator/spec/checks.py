"""What every part of a sweep file's validation shares: the limits, the name rule and small checks
that report to a `LocatedYaml` (file and line)."""

from __future__ import annotations

import math
import re
from typing import Any

from orchestrator.spec.yamlsrc import LocatedYaml, PathKey

NAME_RE = re.compile(r"\A[A-Za-z0-9][A-Za-z0-9_.+-]{0,99}\Z")
"""Names of sweeps, models, configs and hardware classes: they become directory and job names."""

# Values beyond these are typos or fuzz, not sweeps: refused with the limit in the message.
MAX_BATCH_SIZE = 65536
"""Far above any batch a single accelerator holds for the models this tool runs."""
MAX_INPUT_SIZE = 65536
"""Image side in pixels, or sequence length in tokens."""
MAX_TIMEOUT_S = 7 * 24 * 3600.0
"""A week: longer than any one job's compile and timing."""
MEASURE_LIMITS = {"warmup": 100_000, "iterations": 100_000, "rounds": 1_000, "repeats": 100}
"""Per measure key: the most any device could finish within a job's time limit."""
MAX_TIMED_CALLS = 1_000_000
"""iterations x rounds x repeats: timed calls per side of one cell."""
MAX_JOBS_PER_CLASS = 100_000
"""models x batch sizes x dtypes x configs."""


def show(value: Any) -> str:
    """A value for an error message: its repr, cut short."""
    text = repr(value)
    return text if len(text) <= 60 else text[:56] + " ..."


def check_keys(src: LocatedYaml, mapping: dict, allowed: set[str], path: PathKey, what: str) -> None:
    for key in mapping:
        if key not in allowed:
            src.error(
                path + (key,), f"unknown key {show(key)} in {what}; valid keys: {', '.join(sorted(allowed))}"
            )


def is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def positive_number(src: LocatedYaml, value: Any, path: PathKey, what: str) -> float | None:
    """A time limit in seconds: positive, finite, at most `MAX_TIMEOUT_S`."""
    if value is None:
        return None
    if not is_number(value) or not value > 0 or (isinstance(value, float) and not math.isfinite(value)):
        src.error(path, f"{what} must be a positive number of seconds, got {show(value)}")
        return None
    if value > MAX_TIMEOUT_S:  # an int of any size compares; only float() of a huge one overflows
        src.error(
            path,
            f"{what} {show(value)} s is more than a week (at most {MAX_TIMEOUT_S:g} s); is it in seconds?",
        )
        return None
    return float(value)


def named_mapping(value: Any) -> bool:
    """A mapping whose keys are all names (strings)."""
    return isinstance(value, dict) and all(isinstance(k, str) for k in value)


def mixed_keys(value: Any, where: str = "overrides") -> str | None:
    """Where a mapping inside `value` mixes key types (1 and "a"): its keys cannot be ordered, so
    the job's id (a hash of its sorted JSON) could not be computed."""
    if isinstance(value, dict):
        if len({type(k) for k in value}) > 1:
            return f"{where} mixes key types ({', '.join(sorted({type(k).__name__ for k in value}))}): quote the numbers"
        for k, v in value.items():
            if problem := mixed_keys(v, f"{where}.{k}"):
                return problem
    elif isinstance(value, list):
        for i, v in enumerate(value):
            if problem := mixed_keys(v, f"{where}[{i}]"):
                return problem
    return None


def duplicates(src: LocatedYaml, values: list[tuple[int, Any]], key: str) -> None:
    """Report repeated values; `values` holds (index in the file's list, value) of the valid items."""
    seen: set = set()
    for i, v in values:
        if v in seen:
            src.error((key, i), f"{show(v)} appears twice in {key!r}")
        seen.add(v)
