"""When a row's timing cannot be trusted: `timing_doubts` gives the reasons, from what the row
recorded about its host and its samples while it timed. Every reader marks such a row (the sweep's
closing summary, `report`, `presets`, `tune`, the nightly and the benchmark records) and the
tuner never decides on one. Part of the one statistics module (`compiler.statistics`); its limits
are the thresholds' `doubt_*` keys.

A row is doubted where, while one of its processes timed:

- other processes took more than `doubt_other_share` of the job's cores (`host_other_share`: their
  busy time less the job process's own CPU time); for a row written before that column, where the
  host's 1-minute load exceeded `doubt_load_per_core` per core the job ran on;
- it ran unpinned because the cores it wanted were held by other jobs (another sweep's core
  locks: its samples shared cores with whatever ran there);
- the GPU slowed its clocks for heat or a hardware event (`throttle_reasons`);
- the host dispatch probe after one round was `doubt_probe_ratio` times slower than after another;
- its speedup interval's high end is more than `doubt_interval_ratio` times its low end.

Standard library only.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from compiler.statistics.thresholds import Thresholds, load_thresholds

SLOWDOWN_REASONS = frozenset(
    {"hw_slowdown", "hw_thermal_slowdown", "sw_thermal_slowdown", "hw_power_brake_slowdown"}
)
"""NVML clock-event reasons that slow the GPU below what it runs at on a healthy node (power
capping, `sw_power_cap`, is how a GPU runs heavy kernels, and idling is no slowdown)."""

HELD_CORES = "cores this job wants were free"
"""The words of the note a job writes when another job held the cores it wanted
(`workers.affinity.reserve_cores`)."""

SPREAD_DOUBT = "its speedup interval"
"""How the doubt of a too-wide interval begins (the one a quiet host does not cure: more samples do)."""

MARK = "!"
"""The mark every reader puts beside a doubted figure."""


def _core_count(affinity: Any) -> int:
    """The number of cores in "0-3,8" (1 where the row does not say)."""
    count = 0
    for part in str(affinity or "").split(","):
        lo, _, hi = part.strip().partition("-")
        if lo.isdigit():
            count += int(hi) - int(lo) + 1 if hi.isdigit() else 1
    return max(1, count)


def _numbers(values: Any) -> list[float]:
    return [float(v) for v in values or [] if isinstance(v, (int, float)) and not isinstance(v, bool)]


def other_share_doubt(shares: Any, thresholds: Thresholds | None = None, doing: str = "timed") -> str | None:
    """Why a measurement taken over processes whose `shares` (`compiler.host_state.other_share`,
    one per process, None where unknown) of their cores went to other processes cannot be
    trusted: the largest over `doubt_other_share`; None where none is, or none is known. A row's
    timing (`timing_doubts`) and an export's cold prepare (what a serving process pays before its
    first request) are judged alike."""
    other = _numbers(shares)
    t = thresholds or load_thresholds()
    if other and max(other) > t.doubt_other_share:
        return f"other processes took {max(other):.0%} of its cores while it {doing}"
    return None


def _host_doubts(row: Mapping[str, Any], t: Thresholds) -> list[str]:
    reasons = []
    if _numbers(row.get("host_other_share")):
        if found := other_share_doubt(row.get("host_other_share"), t):
            reasons.append(found)
    else:
        loads, cores = _numbers(row.get("host_load_1m")), _core_count(row.get("cpu_affinity"))
        if loads and max(loads) / cores > t.doubt_load_per_core:
            reasons.append(f"host load {max(loads):.1f} on its {cores} cores while it timed")
    notes = str(row.get("notes") or "")
    if row.get("cpu_pinned") is False and HELD_CORES in notes:
        held = next(n for n in notes.split(";") if HELD_CORES in n)
        reasons.append(f"ran unpinned: {held.split('not pinned to cores:', 1)[-1].strip()}")
    slowed = sorted(SLOWDOWN_REASONS.intersection(row.get("throttle_reasons") or []))
    if slowed:
        reasons.append(f"GPU clocks slowed ({', '.join(slowed)})")
    probes = [p for p in _numbers(row.get("host_probe_us")) if p > 0]
    if len(probes) > 1 and max(probes) / min(probes) > t.doubt_probe_ratio:
        reasons.append(f"host dispatch probe varied {max(probes) / min(probes):.1f}x between rounds")
    return reasons


def timing_doubts(
    row: Mapping[str, Any], thresholds: Thresholds | None = None, spread: bool = True
) -> list[str]:
    """Why `row`'s timing cannot be trusted ([] where it can, or the row has no timing). With
    `spread=False` its speedup interval's width is not judged (what a cell's eager reference asks:
    a wide interval says nothing against the job's eager samples)."""
    if row.get("status") != "ok":
        return []
    t = thresholds or load_thresholds()
    reasons = _host_doubts(row, t)
    lo, hi = row.get("speedup_ci_low"), row.get("speedup_ci_high")
    if (
        spread
        and isinstance(lo, (int, float))
        and isinstance(hi, (int, float))
        and lo > 0
        and hi / lo > t.doubt_interval_ratio
    ):
        reasons.append(f"{SPREAD_DOUBT} [{lo:.2f}, {hi:.2f}] spans {hi / lo:.1f}x")
    return reasons


def doubt_text(reasons: list[str]) -> str:
    """The reasons as one clause for a table's footnote or a note ("" where there are none)."""
    return "; ".join(reasons)


UNDECIDED = "timing doubted"
"""Why `presets` and `tune` leave a cell undecided (its `no_preset` entry's `undecided`)."""


def doubted_status(reasons: list[str]) -> str:
    """The status of an ok config whose timing is doubted, in a cell's `no_preset` entry."""
    return f"ok, {UNDECIDED} {MARK}: {doubt_text(reasons)}"
