"""Verdicts on comparisons: whether a setting made a cell faster (`gain_verdict`), whether a run
regressed against a baseline (`latency_verdict` on a latency interval, `figure_verdict` and
`once_per_run_verdict` on a figure measured once per run), when a latency comparison cannot be
decided (`undecided_reason`), and which latency figure judges a cell (`judged_figure`). Part of
the one statistics module (`compiler.statistics`); the thresholds are
`compiler.statistics.thresholds`, the intervals `compiler.statistics.intervals`.

Only numpy is needed; nothing here imports torch, Ray or the orchestrator."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from compiler.statistics.intervals import Interval, beats
from compiler.statistics.student_t import t_quantile
from compiler.statistics.thresholds import Thresholds


def host_bound_share(device_ms: float | None, wall_ms: float | None) -> float | None:
    """How much of the wall latency of a call the device sat idle: 1 - device / wall, in [0, 1]
    (None without both figures). A launch-bound call (small kernels, the host issuing them one by
    one) has a high share; its wall time moves with the host's speed, its device time does not."""
    if not device_ms or not wall_ms or device_ms <= 0 or wall_ms <= 0:
        return None
    return min(1.0, max(0.0, 1.0 - device_ms / wall_ms))


def judged_figure(share: float | None, thresholds: Thresholds) -> tuple[str, str]:
    """Which latency figure a comparison judges a cell on, and why: ``("device", why)`` for a
    host-bound cell (its device idle at least `host_bound_share` of the wall time: device time is
    what a regression in generated kernels moves there, while the wall time moves with the host),
    ``("wall", why)`` otherwise. A wall-time change shown with confidence counts either way (more
    guards or Python per call are a regression too)."""
    if share is None:
        return "wall", "wall time (no device time measured)"
    if share >= thresholds.host_bound_share:
        return "device", f"device time: host-bound, the device idle {share:.0%} of the wall time"
    return "wall", f"wall time: device-bound, the device idle {share:.0%} of the wall time"


def family_level(level: float, tests: int) -> float:
    """The confidence level of each of `tests` intervals that decide one verdict together, so
    that the verdict's false-alarm rate stays within 1 - `level` (Bonferroni)."""
    return 1 - (1 - level) / max(1, tests)


def undecided_reason(
    current_processes: int, baseline_processes: int, thresholds: Thresholds, history: bool = False
) -> str | None:
    """Why a latency comparison cannot be decided (None when it can): a side measured in fewer
    than `min_processes` processes has an interval of one process's calls, which cannot cover
    the spread between processes; in history mode the other side pooling `noise_processes`
    processes (runs of the window) estimates that spread for it (`ratio_interval`'s
    `borrow_between`)."""
    few = [
        (name, n)
        for name, n in (("this run", current_processes), ("the baseline", baseline_processes))
        if n < thresholds.min_processes
    ]
    if not few:
        return None
    if history and len(few) == 1:
        other = baseline_processes if few[0][0] == "this run" else current_processes
        if other >= thresholds.noise_processes:
            return None
    sides = " and ".join(f"{name} ({n} process{'es' if n != 1 else ''})" for name, n in few)
    return (
        f"undecided: one process per cell in {sides} cannot show the spread between processes; "
        f"set measure.repeats: 3"
    )


def borrows_between(current_processes: int, baseline_processes: int, thresholds: Thresholds) -> bool:
    """Whether a history-mode comparison decided by `undecided_reason` lends one side's process
    spread to the other (`ratio_interval(..., borrow_between=True)`)."""
    return min(current_processes, baseline_processes) < thresholds.min_processes


def latency_verdict(ratio: Interval, thresholds: Thresholds) -> str:
    """`regression`, `improvement` or `unchanged` for a ratio current / baseline of latencies."""
    if math.isnan(ratio.low):
        return "unchanged"
    if ratio.low > 1 + thresholds.latency_change:
        return "regression"
    if ratio.high < 1 / (1 + thresholds.latency_change):
        return "improvement"
    return "unchanged"


def gain_verdict(gain: Interval, thresholds: Thresholds) -> str:
    """What a setting did to a cell, from the interval of `without / with` latencies: `faster`
    (`beats`), `slower` (wholly below 1), `no gain` (it cannot be faster by more than the
    `latency_change` the project counts), or `unclear` (too noisy to tell: a wide interval)."""
    if math.isnan(gain.low):
        return "unclear"
    if beats(gain):
        return "faster"
    if gain.high < 1.0:
        return "slower"
    if gain.high < 1 + thresholds.latency_change:
        return "no gain"
    return "unclear"


def figure_verdict(current: float | None, baseline: float | None, change: float, floor: float) -> str:
    """The same for a figure measured once per run (compile time, peak memory): a change beyond
    both the relative `change` and the absolute `floor`."""
    if current is None or baseline is None:
        return "unchanged"
    if current > baseline * (1 + change) and current - baseline > floor:
        return "regression"
    if current < baseline / (1 + change) and baseline - current > floor:
        return "improvement"
    return "unchanged"


def once_per_run_verdict(
    current: float | None, reference: Sequence[float], change: float, floor: float, thresholds: Thresholds
) -> tuple[str, str]:
    """A figure each run measures once (a cell's cold compile time) against the same figure of
    the reference runs (the baseline last; in history mode the window's runs before it): the
    verdict and its reason, or `("unchanged", "")`.

    One value a side cannot show how much the figure moves between runs of one stack (cold
    compiles of one cell on an H100 ranged 10.9-17.6 s over five sweeps, the first on a fresh
    machine slowest). With fewer than `noise_processes` reference runs a change beyond
    `change` and `floor` is a `watch`. With more, their spread decides: the change must also
    leave the 1 - alpha prediction interval of a new run (log scale, Student's t with n - 1
    degrees of freedom) around their geometric mean."""
    values = [float(v) for v in reference if v is not None and v > 0]
    if current is None or current <= 0 or not values:
        return "unchanged", ""
    if len(values) < thresholds.noise_processes:
        verdict = figure_verdict(current, values[-1], change, floor)
        if verdict == "unchanged":
            return verdict, ""
        return "watch", (
            f"one value a run cannot show its run-to-run spread ({verdict} if decided); "
            f"compare against a window of runs (--history, nightly) to decide"
        )
    centre, bound = _log_prediction(values, 1 - (1 - thresholds.level) / 2)
    verdict = figure_verdict(current, math.exp(centre), change, floor)
    outside = abs(math.log(current) - centre) > bound
    if verdict == "unchanged" or not outside:
        return "unchanged", ""
    return (
        verdict,
        f"outside the spread of the {len(values)} reference runs (geometric mean {math.exp(centre):.1f})",
    )


def prediction_high(values: Sequence[float], thresholds: Thresholds) -> float | None:
    """The most a new run of a figure measured once per run (`values`: each run's, all > 0; e.g. a
    fresh process's prepare seconds) takes at the thresholds' confidence `level`, one-sided: the
    upper end of the prediction interval of one new value (log scale, Student's t with n - 1
    degrees of freedom around their geometric mean). None for fewer than two values (one shows no
    spread). What an export judges a prepare budget by (`workers.bench.serving_prepare`): the
    slowest of three processes fitting says little where they spread (SegFormer's 9.0-9.8 s at
    export took 9.7-10.6 s in the next three)."""
    values = [float(v) for v in values]
    if len(values) < 2 or min(values) <= 0:
        return None
    centre, bound = _log_prediction(values, thresholds.level)
    return math.exp(centre + bound)


def _log_prediction(values: Sequence[float], p: float) -> tuple[float, float]:
    """(the mean of `values`' logs, the half-width of the prediction interval of one new value's
    log at quantile `p` of Student's t with n - 1 degrees of freedom)."""
    logs = np.log(values)
    width = t_quantile(p, len(values) - 1) * float(np.std(logs, ddof=1)) * math.sqrt(1 + 1 / len(values))
    return float(np.mean(logs)), width
