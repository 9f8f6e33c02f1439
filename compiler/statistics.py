"""The one statistics module: latency summaries and confidence intervals that cover the
process-to-process spread. Measurement (a job's row), the tuner and the regression report all use
it, so a "faster than" means the same thing everywhere.

Latency samples come in *groups*, one per process that measured them (a job with
``measure.repeats: N`` has N). Two calls in one process share its state: the clocks it ran at,
the cores it was placed on, the memory layout its allocator chose, the kernels its compile
picked. Resampling calls alone (an iid bootstrap) therefore measures the noise inside one
process and claims far more certainty than a figure measured again tomorrow has. The intervals
here come from a **hierarchical (two-stage) bootstrap**: resample processes, then calls within
each, on log latencies, with two corrections that keep it honest for the few processes a sweep
can afford:

1. *No double counting.* Resampling processes and then calls counts the within-process noise
   twice (once in the spread of the process medians, once in the call resampling). Each
   process's median is first shrunk toward the common centre so that their spread is only the
   between-process part left after subtracting the within-process variance (Davison & Hinkley,
   *Bootstrap Methods and their Application*, 1997, section 3.8). Samples that are iid across
   processes thus get (almost) the interval an iid bootstrap gives; a real process effect widens
   it by as much as the process medians disagree.
2. *Few processes.* With P processes the between-process variance rests on P - 1 degrees of
   freedom. The percentile interval is widened about the estimate by t(df) / z, with df from
   Welch-Satterthwaite: P - 1 when the process effect dominates, unbounded when it is nil.

A row measured in one process (N = 1) gets the plain within-process bootstrap and says so:
``Interval.processes == 1`` and ``Interval.scope == "one process"``.

Only numpy is needed; nothing here imports torch, Ray or the orchestrator.
"""

from __future__ import annotations

import dataclasses
import json
import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

LEVEL = 0.95
N_BOOT = 2000
_CHUNK_ELEMENTS = 4_000_000  # bootstrap draws materialized at once (x 8 bytes)


# --- summaries ----------------------------------------------------------------------------------


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


# --- intervals ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Interval:
    """A point estimate and its confidence interval."""

    estimate: float
    low: float
    high: float
    level: float
    processes: int
    """How many processes the samples came from (per side; the fewer side for a ratio)."""
    df: float
    """Degrees of freedom of the between-process part (inf: no process effect detected)."""
    between_share: float
    """Share of the estimate's variance that comes from differences between processes, from the
    variance components (0 for one process, or when the process medians agree within noise)."""

    @property
    def scope(self) -> str:
        """What the interval covers: "processes" (the spread between processes is in it) or
        "one process" (calls within a single process only)."""
        return "processes" if self.processes > 1 else "one process"

    def contains(self, value: float) -> bool:
        return self.low <= value <= self.high

    @property
    def relative_half_width(self) -> float:
        """Half the interval's width over the estimate: 0.05 reads "within 5%"."""
        return (self.high - self.low) / 2 / self.estimate if self.estimate else math.nan


def _no_interval(level: float) -> Interval:
    return Interval(math.nan, math.nan, math.nan, level, 0, math.nan, math.nan)


def median_interval(
    groups: Sequence[Sequence[float]], level: float = LEVEL, n_boot: int = N_BOOT, seed: int = 0
) -> Interval:
    """The pooled median of every group's samples, with its hierarchical-bootstrap interval."""
    side = _Side.of(groups, level)
    if side is None:
        return _no_interval(level)
    rng = np.random.default_rng(seed)
    shift = side.shrunk_centers(side.shrink_factor())
    reps = _two_stage(side, shift, _process_draws(rng, n_boot, side.p), rng)
    between, within = side.between_var() / side.p, side.within_mean() / side.p
    return _interval(
        float(np.median(side.pooled_raw)),
        reps,
        level,
        side.p,
        _welch_df([(between, side.p)], within),
        between,
        within,
    )


def ratio_interval(
    numerator: Sequence[Sequence[float]],
    denominator: Sequence[Sequence[float]],
    *,
    paired: bool,
    level: float = LEVEL,
    n_boot: int = N_BOOT,
    seed: int = 0,
    borrow_between: bool = False,
) -> Interval:
    """median(pooled numerator) / median(pooled denominator), with its interval.

    `paired=True`: group i of both sides came from the same process (eager and compiled of one
    job process): processes are resampled jointly, so what a process does to both sides alike
    (slow clocks, a slow host) cancels in the ratio. `paired=False`: independent measurements
    (two runs compared by a regression report): each side's processes are resampled on their own.

    `borrow_between` (unpaired only): a side measured in one process gets the other side's
    between-process variance (when that side has several processes), drawn as a normal shift of
    its centre per replicate and counted with the other side's degrees of freedom. The regression
    report's history mode uses it: a window of runs estimates the process noise a one-process
    run cannot show. Without it a one-process side adds no between-process variance at all.
    """
    num, den = _Side.of(numerator, level), _Side.of(denominator, level)
    if num is None or den is None:
        return _no_interval(level)
    estimate = float(np.median(num.pooled_raw) / np.median(den.pooled_raw))
    rng = np.random.default_rng(seed)
    if paired:
        if num.p != den.p:
            raise ValueError(f"paired sides need the same processes: {num.p} vs {den.p} groups")
        p = num.p
        d = num.centers - den.centers  # per-process log ratio
        v_d = num.within + den.within
        s2 = float(np.var(d, ddof=1)) if p > 1 else 0.0
        sigma_b2 = max(0.0, s2 - float(np.mean(v_d))) if p > 1 else 0.0
        c = _shrink(sigma_b2, s2, p)
        excess = (1.0 - c) * (d - d.mean()) / 2.0  # move both sides toward the common log ratio
        draws = _process_draws(rng, n_boot, p)
        reps = _two_stage(num, num.centers - excess, draws, rng) - _two_stage(
            den, den.centers + excess, draws, rng
        )
        between, within = sigma_b2 / p, float(np.mean(v_d)) / p
        df = _welch_df([(between, p)], within)
        return _interval(estimate, reps, level, p, df, between, within)
    reps_num = _two_stage(
        num, num.shrunk_centers(num.shrink_factor()), _process_draws(rng, n_boot, num.p), rng
    )
    reps_den = _two_stage(
        den, den.shrunk_centers(den.shrink_factor()), _process_draws(rng, n_boot, den.p), rng
    )
    parts = [(num.between_var() / num.p, num.p), (den.between_var() / den.p, den.p)]
    if borrow_between:
        for i, (side, other) in enumerate(((num, den), (den, num))):
            if side.p == 1 and other.p > 1:
                lent = other.between_var()
                shift = rng.normal(0.0, math.sqrt(lent), n_boot)
                if i == 0:
                    reps_num = reps_num + shift
                else:
                    reps_den = reps_den + shift
                parts[i] = (lent, other.p)
    within = num.within_mean() / num.p + den.within_mean() / den.p
    df = _welch_df(parts, within)
    between = sum(b for b, _ in parts)
    processes = min(p for _, p in parts)  # a lent spread counts as the processes it came from
    return _interval(estimate, reps_num - reps_den, level, processes, df, between, within)


def beats(ratio: Interval) -> bool:
    """Whether a ratio `baseline time / candidate time` shows the candidate faster by a margin
    the samples support: its whole interval lies above 1. The one "faster than" rule of the
    project (the tuner's winner over the stock mode, ...)."""
    return ratio.low > 1.0


def paired_speedup(
    baseline_samples: Sequence[float], candidate_samples: Sequence[float], sizes: Sequence[int] | None
) -> Interval:
    """baseline / candidate, paired by process, from a row's flat sample columns and its
    `samples_per_repeat` (both sides were timed in the same processes)."""
    return ratio_interval(
        split_groups(baseline_samples, sizes), split_groups(candidate_samples, sizes), paired=True
    )


# --- comparing two runs ---------------------------------------------------------------------------

THRESHOLDS_FILE = Path(__file__).with_name("thresholds.json")
THRESHOLDS_VERSION = 3
_MAX_THRESHOLDS_BYTES = 65536
_ADDED_IN_V2 = {"host_bound_share": 0.25, "min_processes": 2, "noise_processes": 3}
"""Keys version 2 added, with the values a version-1 file is read with."""
_ADDED_IN_V3 = {
    "accuracy_tf32": 1e-2,
    "accuracy_fp16": 1e-2,
    "accuracy_bf16": 5e-2,
    "accuracy_stock_factor": 2.0,
    "accuracy_floor": 1e-5,
    "accuracy_min_spread": 1e-2,
    "accuracy_min_sensitivity": 1e-2,
    "accuracy_max_sensitivity": 100.0,
}
"""Keys version 3 added (the accuracy budgets of `compiler.accuracy`), with the values an older
file is read with."""


@dataclass(frozen=True)
class Thresholds:
    """When a change between two runs counts, from a versioned JSON file (`thresholds.json`
    beside this module by default): the regression report's only thresholds."""

    version: int
    level: float
    """Confidence level of the latency intervals."""
    latency_change: float
    """A cell's compiled latency regressed when the interval of current / baseline lies wholly
    above 1 + this (improved: wholly below 1 / (1 + this)). The interval covers the spread
    between processes, so two runs of one stack (an A/A pair) do not regress."""
    compile_time_change: float
    """Cold compile time regressed when it grew by more than this fraction..."""
    compile_time_floor_s: float
    """...and by more than this many seconds (a one-number figure: no interval)."""
    memory_change: float
    memory_floor_mb: float
    window_runs: int
    """History mode: the baseline pools this many previous runs."""
    consecutive: int
    """History mode: a latency, compile-time or memory regression must hold on this many runs in a
    row (each against its own window) before it counts (PyTorch's dashboard: 2)."""
    host_bound_share: float = 0.25
    """A GPU cell is host-bound when its device sat idle for at least this share of the wall
    latency (1 - device time / wall time); it is then judged on device time (`judged_figure`)."""
    min_processes: int = 2
    """A latency verdict needs at least this many processes per cell on each side: one process's
    interval cannot cover the spread between processes (`undecided_reason`)."""
    noise_processes: int = 3
    """History mode: a side with too few processes is decided anyway when the other side pools at
    least this many (runs of the window), whose spread estimates the process noise it lacks."""
    accuracy_tf32: float = 1e-2
    """The `tf32` accuracy budget: max relative error against fp64 (`compiler.accuracy`)."""
    accuracy_fp16: float = 1e-2
    """The `fp16` budget."""
    accuracy_bf16: float = 5e-2
    """The `bf16` budget."""
    accuracy_stock_factor: float = 2.0
    """The `stock` budget: at most this many times the stock policy's own eager error against fp64
    on the cell..."""
    accuracy_floor: float = 1e-5
    """...and never less than this (an error below it is float32 rounding, not a precision's)."""
    accuracy_min_spread: float = 1e-2
    """Random weights: an output whose (max - min) / max |x| is below this, or below the budget's
    tolerance, is too constant to judge a precision (an error the budget allows could erase all
    of its variation, and normalized by its magnitude looks small): undetermined."""
    accuracy_min_sensitivity: float = 1e-2
    """Random weights: outputs that move less than this fraction of a tiny relative input change
    barely depend on the inputs (biases carry them), so no precision's error reaches them:
    undetermined."""
    accuracy_max_sensitivity: float = 100.0
    """Random weights: outputs that amplify a relative input change of the budget's rounding more
    than this many times are ill-conditioned (a saturated or discontinuous head); their error says
    more of the random weights than of the arithmetic: undetermined."""


def load_thresholds(path: str | Path | None = None) -> Thresholds:
    """The thresholds in `path` (default `thresholds.json` here); a bad file raises ValueError
    naming the file and the key."""
    path = Path(path) if path is not None else THRESHOLDS_FILE
    try:
        if not path.is_file():  # a FIFO or device would block or never end
            raise ValueError("not a regular file")
        with path.open("rb") as f:
            raw = f.read(_MAX_THRESHOLDS_BYTES + 1)
        if len(raw) > _MAX_THRESHOLDS_BYTES:
            raise ValueError(f"over {_MAX_THRESHOLDS_BYTES} bytes, far more than a thresholds file holds")
        data = json.loads(raw)
    except RecursionError:
        raise ValueError(f"{path}: cannot read the thresholds: nested too deeply") from None
    except (OSError, ValueError) as exc:
        raise ValueError(f"{path}: cannot read the thresholds: {exc}") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a JSON object of thresholds, got {type(data).__name__}")
    if data.get("version") == 1:
        data = {**_ADDED_IN_V2, **data, "version": 2}
    if data.get("version") == 2:
        data = {**_ADDED_IN_V3, **data, "version": THRESHOLDS_VERSION}
    names = [f.name for f in dataclasses.fields(Thresholds)]
    missing = [n for n in names if n not in data]
    unknown = sorted(set(data) - set(names))
    if missing or unknown:
        raise ValueError(f"{path}: missing keys {missing}, unknown keys {unknown}; expected {names}")
    if data["version"] != THRESHOLDS_VERSION:
        raise ValueError(f"{path}: version {data['version']!r}; this code reads version {THRESHOLDS_VERSION}")
    for name in names[1:]:
        value = data[name]
        if not isinstance(value, (int, float)) or isinstance(value, bool) or value < 0:
            raise ValueError(f"{path}: {name} must be a non-negative number, got {value!r}")
    for name in ("window_runs", "consecutive", "min_processes", "noise_processes"):
        if not isinstance(data[name], int) or isinstance(data[name], bool) or data[name] < 1:
            raise ValueError(f"{path}: {name} must be a positive integer, got {data[name]!r}")
    for name in ("level", "host_bound_share", "accuracy_tf32", "accuracy_fp16", "accuracy_bf16"):
        if not 0 < data[name] < 1:
            raise ValueError(f"{path}: {name} must be between 0 and 1, got {data[name]!r}")
    return Thresholds(**data)


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
    logs = np.log(values)
    centre = float(np.mean(logs))
    bound = t_quantile(1 - (1 - thresholds.level) / 2, len(values) - 1) * float(np.std(logs, ddof=1))
    bound *= math.sqrt(1 + 1 / len(values))
    verdict = figure_verdict(current, math.exp(centre), change, floor)
    outside = abs(math.log(current) - centre) > bound
    if verdict == "unchanged" or not outside:
        return "unchanged", ""
    return (
        verdict,
        f"outside the spread of the {len(values)} reference runs (geometric mean {math.exp(centre):.1f})",
    )


# --- the engine ---------------------------------------------------------------------------------


@dataclass
class _Side:
    """One side's samples, as log latencies per process."""

    centers: np.ndarray
    """(P,) median log latency of each process."""
    residuals: np.ndarray
    """(P, n_max) log latency minus its process's median; NaN beyond each process's count."""
    counts: np.ndarray
    """(P,) samples per process."""
    within: np.ndarray
    """(P,) variance of each process's median under resampling of its calls."""
    pooled_raw: np.ndarray

    @property
    def p(self) -> int:
        return len(self.centers)

    @classmethod
    def of(cls, groups: Sequence[Sequence[float]], level: float) -> _Side | None:
        clean = []
        for g in groups:
            a = np.asarray(list(g), dtype=np.float64)
            a = a[np.isfinite(a) & (a > 0)]
            if a.size:
                clean.append(a)
        if not clean:
            return None
        logs = [np.log(a) for a in clean]
        centers = np.array([np.median(x) for x in logs])
        counts = np.array([x.size for x in logs])
        residuals = np.full((len(logs), counts.max()), np.nan)
        for i, x in enumerate(logs):
            residuals[i, : x.size] = x - centers[i]
        rng = np.random.default_rng(12345)
        within = np.array([_within_var(x, rng) for x in logs])
        return cls(centers, residuals, counts, within, np.concatenate(clean))

    def within_mean(self) -> float:
        return float(np.mean(self.within))

    def between_var(self) -> float:
        """Between-process variance of one process's median, the within part subtracted."""
        if self.p < 2:
            return 0.0
        return max(0.0, float(np.var(self.centers, ddof=1)) - self.within_mean())

    def shrink_factor(self) -> float:
        s2 = float(np.var(self.centers, ddof=1)) if self.p > 1 else 0.0
        return _shrink(self.between_var(), s2, self.p)

    def shrunk_centers(self, c: float) -> np.ndarray:
        mean = self.centers.mean()
        return mean + c * (self.centers - mean)


def _shrink(sigma_b2: float, s2: float, p: int) -> float:
    """Factor on each process's deviation from the common centre so that resampling P of them
    with replacement has variance sigma_b2 / P (resampling shrinks a variance by (P - 1) / P)."""
    if p < 2 or s2 <= 0.0:
        return 0.0
    return math.sqrt(sigma_b2 * p / ((p - 1) * s2))


def _within_var(log_samples: np.ndarray, rng: np.random.Generator, n_boot: int = 400) -> float:
    n = log_samples.size
    if n < 2:
        return 0.0
    draws = log_samples[rng.integers(0, n, (n_boot, n))]
    return float(np.var(np.median(draws, axis=1), ddof=1))


def _process_draws(rng: np.random.Generator, n_boot: int, p: int) -> np.ndarray:
    """(n_boot, P) process indices: which process fills each slot of each bootstrap replicate.
    One process: the identity (it is always itself)."""
    if p == 1:
        return np.zeros((n_boot, 1), dtype=np.int64)
    return rng.integers(0, p, (n_boot, p))


def _two_stage(side: _Side, centers: np.ndarray, draws: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Log pooled median of each bootstrap replicate: the processes in `draws`, then each one's
    calls resampled with replacement around its (shrunk) centre."""
    n_boot, p = draws.shape
    n_max = side.residuals.shape[1]
    equal = bool(np.all(side.counts == n_max))
    out = np.empty(n_boot)
    chunk = max(1, _CHUNK_ELEMENTS // max(1, p * n_max))
    for start in range(0, n_boot, chunk):
        q = draws[start : start + chunk]  # (b, P)
        counts = side.counts[q]  # (b, P)
        u = rng.random((q.shape[0], p, n_max))
        idx = np.minimum((u * counts[..., None]).astype(np.int64), n_max - 1)
        values = centers[q][..., None] + side.residuals[q[..., None], idx]
        if not equal:
            values[np.arange(n_max)[None, None, :] >= counts[..., None]] = np.nan
            out[start : start + chunk] = np.nanmedian(values.reshape(q.shape[0], -1), axis=1)
        else:
            out[start : start + chunk] = np.median(values.reshape(q.shape[0], -1), axis=1)
    return out


def _welch_df(between: list[tuple[float, int]], within: float) -> float:
    """Welch-Satterthwaite degrees of freedom of (sum of between parts) + within, the within part
    resting on many calls (taken as unbounded) and each between part on its P - 1."""
    total = sum(b for b, _ in between) + within
    denom = sum(b * b / (p - 1) for b, p in between if p > 1 and b > 0)
    if denom <= 0:
        return math.inf
    return total * total / denom


def _interval(
    estimate: float,
    log_reps: np.ndarray,
    level: float,
    processes: int,
    df: float,
    between: float,
    within: float,
) -> Interval:
    """The percentile interval of the log replicates, widened about the estimate by t(df) / z."""
    alpha = (1 - level) / 2
    lo, hi = np.quantile(log_reps, [alpha, 1 - alpha])
    center = math.log(estimate)
    widen = t_quantile(1 - alpha, df) / statistics.NormalDist().inv_cdf(1 - alpha)
    lo = center - widen * max(0.0, center - float(lo))
    hi = center + widen * max(0.0, float(hi) - center)
    share = between / (between + within) if between + within > 0 else 0.0
    return Interval(estimate, math.exp(lo), math.exp(hi), level, processes, df, share)


# --- Student's t without scipy ------------------------------------------------------------------


def t_quantile(p: float, df: float) -> float:
    """Quantile of Student's t with `df` (real, > 0; inf gives the normal's) degrees of freedom."""
    z = statistics.NormalDist().inv_cdf(p)
    if math.isinf(df) or df > 1e7:
        return z
    if p == 0.5:
        return 0.0
    if p < 0.5:
        return -t_quantile(1 - p, df)
    lo, hi = 0.0, max(1.0, z)
    while _t_cdf(hi, df) < p:
        hi *= 2
    for _ in range(200):
        mid = (lo + hi) / 2
        if _t_cdf(mid, df) < p:
            lo = mid
        else:
            hi = mid
        if hi - lo < 1e-10 * hi:
            break
    return (lo + hi) / 2


def _t_cdf(t: float, df: float) -> float:
    x = df / (df + t * t)
    tail = 0.5 * _betainc(df / 2, 0.5, x)
    return 1 - tail if t >= 0 else tail


def _betainc(a: float, b: float, x: float) -> float:
    """Regularized incomplete beta I_x(a, b) (continued fraction, Numerical Recipes 6.4)."""
    if x <= 0:
        return 0.0
    if x >= 1:
        return 1.0
    log_front = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log(1 - x)
    if x < (a + 1) / (a + b + 2):
        return math.exp(log_front) * _betacf(a, b, x) / a
    return 1 - math.exp(log_front) * _betacf(b, a, 1 - x) / b


def _betacf(a: float, b: float, x: float) -> float:
    tiny = 1e-300
    qab, qap, qam = a + b, a + 1, a - 1
    c, d = 1.0, 1 - qab * x / qap
    d = 1 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 400):
        m2 = 2 * m
        aa = m * (b - m) * x / ((qam + m2) * (a + m2))
        d = 1 + aa * d
        d = 1 / (d if abs(d) > tiny else tiny)
        c = 1 + aa / c
        c = c if abs(c) > tiny else tiny
        h *= d * c
        aa = -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))
        d = 1 + aa * d
        d = 1 / (d if abs(d) > tiny else tiny)
        c = 1 + aa / c
        c = c if abs(c) > tiny else tiny
        delta = d * c
        h *= delta
        if abs(delta - 1) < 1e-14:
            break
    return h
