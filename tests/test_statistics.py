"""compiler.statistics on synthetic samples whose true spread is known.

Latencies are drawn log-normally: each process gets an offset (the between-process effect, sd
`between`) and each call noise around it (sd `within`), so the truth is known exactly and the
intervals can be checked for what they claim."""

from __future__ import annotations

import math
import statistics

import numpy as np
import pytest

from compiler.statistics import (
    median_interval,
    percentile,
    ratio_interval,
    split_groups,
    spread,
    summarize,
    t_quantile,
)


def processes(
    rng: np.random.Generator, level: float, n_proc: int, n_calls: int, between: float, within: float
) -> list[list[float]]:
    return [
        list(np.exp(math.log(level) + rng.normal(0, between) + rng.normal(0, within, n_calls)))
        for _ in range(n_proc)
    ]


def pooled(groups: list[list[float]]) -> list[list[float]]:
    """The same samples seen as one process: what an iid bootstrap assumes."""
    return [[x for g in groups for x in g]]


def width(iv) -> float:
    return iv.high / iv.low - 1


# --- one process: the within-process percentile bootstrap ----------------------------------------


def _normal(mean: float, sd: float, n: int, seed: int) -> list[float]:
    return list(mean + sd * np.random.default_rng(seed).standard_normal(n))


def test_one_process_interval_contains_the_true_ratio_and_says_its_scope():
    eager, compiled = _normal(10.0, 0.2, 40, 1), _normal(5.0, 0.1, 40, 2)
    iv = ratio_interval([eager], [compiled], paired=True)
    assert iv.estimate == pytest.approx(statistics.median(eager) / statistics.median(compiled))
    assert iv.low <= 2.0 <= iv.high and iv.low <= iv.estimate <= iv.high
    assert iv.high - iv.low < 0.2 and iv.low > 1.0
    assert iv.processes == 1 and iv.scope == "one process" and iv.between_share == 0.0
    assert math.isinf(iv.df)


def test_interval_narrows_with_more_calls():
    few = ratio_interval([_normal(10.0, 1.0, 8, 3)], [_normal(5.0, 0.5, 8, 4)], paired=True)
    many = ratio_interval([_normal(10.0, 1.0, 400, 3)], [_normal(5.0, 0.5, 400, 4)], paired=True)
    assert many.high - many.low < (few.high - few.low) / 2, (few, many)
    assert many.contains(2.0)


def test_lower_level_is_narrower():
    a, b = [_normal(10.0, 1.0, 30, 5)], [_normal(5.0, 0.5, 30, 6)]
    iv95, iv50 = ratio_interval(a, b, paired=True, level=0.95), ratio_interval(a, b, paired=True, level=0.5)
    assert iv95.low <= iv50.low < iv50.high <= iv95.high


def test_interval_is_deterministic_for_a_seed():
    a, b = [_normal(10.0, 2.0, 15, 7)], [_normal(8.0, 2.0, 15, 8)]
    assert ratio_interval(a, b, paired=True, seed=3) == ratio_interval(a, b, paired=True, seed=3)
    assert ratio_interval(a, b, paired=True) == ratio_interval(a, b, paired=True, seed=0)
    assert len({ratio_interval(a, b, paired=True, seed=s).high for s in range(10)}) > 1


def test_single_samples_give_their_ratio():
    iv = ratio_interval([[6.0]], [[2.0]], paired=True)
    assert iv.low == pytest.approx(3.0) and iv.high == pytest.approx(3.0) and iv.estimate == 3.0


@pytest.mark.parametrize(("num", "den"), [([], []), ([[]], [[1.0, 2.0]]), ([[1.0, 2.0]], [[]])])
def test_no_samples_give_nan(num, den):
    iv = ratio_interval(num, den, paired=False)
    assert math.isnan(iv.low) and math.isnan(iv.high) and iv.processes == 0


def test_non_positive_and_non_finite_samples_are_ignored():
    clean = ratio_interval([[2.0, 2.1, 1.9]], [[1.0, 1.05, 0.95]], paired=True)
    dirty = ratio_interval([[2.0, 2.1, 1.9, math.nan, -1.0]], [[1.0, 1.05, 0.95, 0.0, math.inf]], paired=True)
    assert dirty.estimate == pytest.approx(clean.estimate)


# --- several processes: the hierarchical bootstrap ------------------------------------------------


def test_iid_processes_do_not_widen_the_interval():
    """No process effect: the hierarchical interval is (about) the iid one, for each side and the
    ratio."""
    rng = np.random.default_rng(0)
    ratios, sides = [], []
    for _ in range(10):
        eager = processes(rng, 5.0, 3, 50, 0.0, 0.05)
        compiled = processes(rng, 2.5, 3, 50, 0.0, 0.05)
        h = ratio_interval(eager, compiled, paired=True)
        i = ratio_interval(pooled(eager), pooled(compiled), paired=True)
        ratios.append(width(h) / width(i))
        sides.append(width(median_interval(eager)) / width(median_interval(pooled(eager))))
        assert h.scope == "processes" and h.processes == 3
    assert statistics.median(ratios) < 1.25, ratios
    assert statistics.median(sides) < 1.25, sides


def test_a_process_effect_widens_the_interval():
    rng = np.random.default_rng(1)
    eager = processes(rng, 5.0, 5, 50, 0.08, 0.03)
    compiled = processes(rng, 2.5, 5, 50, 0.08, 0.03)
    h = ratio_interval(eager, compiled, paired=True)
    i = ratio_interval(pooled(eager), pooled(compiled), paired=True)
    assert width(h) > 3 * width(i), (h, i)
    assert h.between_share > 0.8
    assert h.df < 10  # the between-process part rests on few processes
    assert h.contains(2.0)


def test_coverage_with_a_process_effect():
    """Across many simulated sweeps with a process effect, the 95% interval contains the true
    ratio most of the time; the one-process interval of the same samples mostly does not."""
    rng = np.random.default_rng(2)
    hits = iid_hits = 0
    trials = 40
    for t in range(trials):
        eager = processes(rng, 5.0, 5, 30, 0.05, 0.03)
        compiled = processes(rng, 2.5, 5, 30, 0.05, 0.03)
        hits += ratio_interval(eager, compiled, paired=True, n_boot=500, seed=t).contains(2.0)
        iid_hits += ratio_interval(pooled(eager), pooled(compiled), paired=True, n_boot=500, seed=t).contains(
            2.0
        )
    assert hits / trials >= 0.85, hits
    assert iid_hits / trials <= 0.6, iid_hits


def test_pairing_cancels_what_a_process_does_to_both_sides():
    """A slow host slows eager and compiled of its process alike: the paired ratio ignores it."""
    rng = np.random.default_rng(3)
    eager, compiled = [], []
    for _ in range(4):
        host = rng.normal(0, 0.15)
        eager.append(list(np.exp(math.log(5.0) + host + rng.normal(0, 0.03, 40))))
        compiled.append(list(np.exp(math.log(2.5) + host + rng.normal(0, 0.03, 40))))
    paired = ratio_interval(eager, compiled, paired=True)
    unpaired = ratio_interval(eager, compiled, paired=False)
    assert paired.contains(2.0)
    assert width(paired) < width(unpaired) / 3, (paired, unpaired)
    assert median_interval(eager).between_share > 0.8  # each side alone does vary between processes


def test_unpaired_ratio_widens_with_a_process_effect_on_either_side():
    rng = np.random.default_rng(4)
    base = processes(rng, 4.0, 4, 40, 0.0, 0.03)
    steady = processes(rng, 4.4, 4, 40, 0.0, 0.03)
    shaky = processes(rng, 4.4, 4, 40, 0.06, 0.03)
    calm, wild = ratio_interval(steady, base, paired=False), ratio_interval(shaky, base, paired=False)
    assert calm.contains(1.1) and wild.contains(1.1)
    assert width(wild) > 2 * width(calm)


def test_median_interval_of_processes_of_different_sizes():
    rng = np.random.default_rng(5)
    groups = [list(np.exp(math.log(3.0) + rng.normal(0, 0.02, n))) for n in (20, 35, 50)]
    iv, iid = median_interval(groups), median_interval(pooled(groups))
    assert iv.processes == 3
    assert iv.estimate == pytest.approx(statistics.median([x for g in groups for x in g]))
    assert iv.low == pytest.approx(iid.low, rel=2e-3) and iv.high == pytest.approx(iid.high, rel=2e-3)
    shifted = [[x * 1.1 for x in groups[0]], *groups[1:]]  # one process 10% slower
    assert width(median_interval(shifted)) > 3 * width(iv)


def test_paired_sides_need_the_same_processes():
    with pytest.raises(ValueError, match="same processes"):
        ratio_interval([[1.0], [1.1]], [[0.5]], paired=True)


def test_few_processes_widen_by_student_t():
    """Process medians 4% apart: with two processes that spread rests on one degree of freedom
    (t = 12.7 against z = 1.96); with twenty such processes the interval is far tighter."""
    rng = np.random.default_rng(6)

    def at(levels):
        return [list(np.exp(math.log(x) + rng.normal(0, 0.002, 40))) for x in levels]

    two = ratio_interval(at([5.0, 5.2]), at([2.5, 2.5]), paired=True)
    assert two.df < 1.5 and two.between_share > 0.95
    assert two.contains(2.0) and two.contains(2.08)
    twenty = ratio_interval(at([5.0, 5.2] * 10), at([2.5] * 20), paired=True)
    assert twenty.df > 15
    assert width(two) > 5 * width(twenty)


# --- helpers --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("p", "df", "expected"),
    [
        (0.975, 1, 12.7062),
        (0.975, 2, 4.3027),
        (0.975, 5, 2.5706),
        (0.975, 30, 2.0423),
        (0.975, math.inf, 1.95996),
        (0.95, 10, 1.8125),
        (0.5, 3, 0.0),
        (0.025, 4, -2.7764),
        (0.975, 2.5, 3.5747),
    ],
)
def test_t_quantile_against_tables(p, df, expected):
    assert t_quantile(p, df) == pytest.approx(expected, abs=2e-3)


def test_split_groups():
    assert split_groups([1, 2, 3, 4, 5], [2, 3]) == [[1, 2], [3, 4, 5]]
    assert split_groups([1, 2, 3], None) == [[1, 2, 3]]
    assert split_groups([], None) == []
    with pytest.raises(ValueError, match="sums to 4"):
        split_groups([1, 2, 3], [2, 2])


def test_spread_and_summary():
    assert spread([1.0, 1.05, 1.02]) == pytest.approx(0.05)
    assert spread([2.0]) == 0.0
    s = summarize([3.0, 1.0, 2.0])
    assert (s.median_ms, s.p10_ms, s.p90_ms) == (2.0, pytest.approx(1.2), pytest.approx(2.8))
    assert percentile([1.0, 2.0], 50) == 1.5


def test_prediction_high_is_the_one_sided_bound_a_new_run_stays_under():
    """What an export judges a prepare budget by: from three fresh processes' seconds, the most a
    new one takes at the thresholds' level. Checked against its definition and by simulation: of
    many new draws from the distribution the three came from, about `level` stay under it."""
    from compiler.statistics import load_thresholds, prediction_high

    t = load_thresholds()
    assert prediction_high([9.0], t) is None and prediction_high([], t) is None  # one shows no spread
    assert prediction_high([7.0, 7.0, 7.0], t) == pytest.approx(7.0)
    runs = [9.35, 9.8, 9.04]  # each under 10 s; their spread predicts a new one over it
    logs = np.log(runs)
    want = math.exp(logs.mean() + t_quantile(t.level, 2) * logs.std(ddof=1) * math.sqrt(4 / 3))
    assert prediction_high(runs, t) == pytest.approx(want) and want > 10 > max(runs)
    assert prediction_high([8.67, 8.96, 8.47], t) < 10  # tighter, lower: it fits
    rng = np.random.default_rng(0)
    covered = []
    for _ in range(2000):
        draws = np.exp(rng.normal(2.2, 0.05, 4))
        covered.append(draws[3] <= prediction_high(draws[:3], t))
    assert abs(np.mean(covered) - t.level) < 0.02, np.mean(covered)
