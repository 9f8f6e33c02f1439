"""Latency samples as a row stores them: a summary (median, p10, p90), the spread of one figure
measured several times, and the flat sample list cut back into the groups of the processes that
measured it (`split_groups`; a results row's, `row_groups`). Part of the one statistics module (`compiler.statistics`); the
intervals over these groups are `compiler.statistics.intervals`.

Standard library only."""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class LatencySummary:
    median_ms: float
    p10_ms: float
    p90_ms: float
    samples_ms: tuple[float, ...]


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile of an already sorted list, q in [0, 100]."""
    if not sorted_values:
        return math.nan
    pos = (len(sorted_values) - 1) * q / 100.0
    lo, hi = math.floor(pos), math.ceil(pos)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


def summarize(samples_ms: Sequence[float]) -> LatencySummary:
    s = sorted(samples_ms)
    return LatencySummary(statistics.median(s), percentile(s, 10), percentile(s, 90), tuple(samples_ms))


def spread(values: Sequence[float]) -> float:
    """max / min - 1 of positive figures (the same cell measured several times): 0.05 is 5%."""
    return max(values) / min(values) - 1.0


def split_groups(samples: Sequence[float], sizes: Sequence[int] | None) -> list[list[float]]:
    """A flat sample list as stored in a row, cut into its per-process groups.

    `sizes` is the row's `samples_per_repeat` (how many samples each process contributed, in
    order); None (a row written before repeats existed) means one process."""
    samples = list(samples)
    if not sizes:
        return [samples] if samples else []
    if sum(sizes) != len(samples):
        raise ValueError(f"samples_per_repeat {list(sizes)} sums to {sum(sizes)}, not {len(samples)} samples")
    groups, start = [], 0
    for n in sizes:
        groups.append(samples[start : start + n])
        start += n
    return [g for g in groups if g]


def row_groups(row: Mapping[str, Any], side: str, device: bool = False) -> list[list[float]]:
    """A results row's samples of `side` (`eager`, `compiled`, `baseline`), one group per process:
    `<side>_samples_ms` cut by `samples_per_repeat`, or with `device` its device-time samples
    `<side>_device_samples_ms` cut by `device_samples_per_repeat` ([] where the row holds none)."""
    kind, per = (
        ("device_samples_ms", "device_samples_per_repeat") if device else ("samples_ms", "samples_per_repeat")
    )
    samples = row.get(f"{side}_{kind}") or []
    return split_groups(samples, row.get(per)) if samples else []
