"""Confidence intervals that cover the process-to-process spread: the median of a row's
latency samples (`median_interval`) and the ratio of two such medians (`ratio_interval`,
`paired_speedup`), with the project's one "faster than" rule (`beats`). Part of the one
statistics module (`compiler.statistics`).

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

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from compiler.statistics.samples import split_groups
from compiler.statistics.student_t import t_quantile

LEVEL = 0.95
N_BOOT = 2000
_CHUNK_ELEMENTS = 4_000_000  # bootstrap draws materialized at once (x 8 bytes)


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
