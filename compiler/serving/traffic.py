"""The traffic a preset serves: `ServingProfile`, a batch-size range and a weight per size, and the
bucket arithmetic serving plans are judged by.

A sweep or tune file says it under `serving:` (sweep-wide or per model):

    serving: {batch: {min: 1, max: 32}, traffic: {1: 0.4, 4: 0.2, 8: 0.2, 32: 0.2}, memory_gib: 2,
              prepare_budget_s: 10}

`traffic` weighs each batch size a service sends (sizes it leaves out weigh nothing; without it
every size of the range weighs the same). `memory_gib`, where given, caps the GPU memory a bucket
plan's graphs may hold (each bucket's CUDA-graph pool, as measured where the export builds it);
`prepare_budget_s` caps the seconds a serving process spends preparing a buckets plan of packages
(loading, capturing and checking them, as measured in a fresh process where the export builds
them). The objective every plan is compared by is the traffic-weighted mean latency
(`weighted_mean`): what an average request waits.

A bucket plan serves a size on the smallest bucket at least as large (`next_bucket`), padding the
batch up and slicing the outputs back; `padded_latency` is what a size then costs, and
`choose_buckets` picks the set that minimises the traffic-weighted padded latency from latencies
measured at candidate buckets, under a cap on how many graphs the plan may hold, on the memory
they hold or on the seconds they take to prepare; `bucket_set` is the export's record of that
choice.

This module imports nothing outside the standard library.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

MAX_BATCH = 4096
"""The largest batch size a profile may name: a range is prepared graph by graph at load."""


class ProfileError(ValueError):
    """A serving profile that cannot be used; the message names the key and the fix."""


@dataclass(frozen=True)
class ServingProfile:
    """A batch-size range [`min`, `max`] and the share of requests at each size (`traffic`: sizes
    in the range, weights summing to 1, sorted by size)."""

    min: int
    max: int
    traffic: tuple[tuple[int, float], ...]
    memory_gib: float | None = None
    """The most GPU memory a bucket plan's graphs may hold (None: no cap)."""
    prepare_budget_s: float | None = None
    """The most seconds a serving process may spend preparing a buckets plan of packages (None: no
    cap)."""

    @classmethod
    def uniform(cls, low: int, high: int) -> ServingProfile:
        """Every size of [low, high] weighing the same."""
        return cls.from_dict({"batch": {"min": low, "max": high}})

    @classmethod
    def from_dict(cls, data: Any) -> ServingProfile:
        """The profile `{batch: {min, max}, traffic: {size: weight}}` (a sweep file's `serving:`, a
        preset's `serving`); ProfileError saying what is wrong and how to write it."""
        problems = profile_problems(data)
        if problems:
            raise ProfileError("; ".join(problems))
        batch = data["batch"]
        low, high = int(batch["min"]), int(batch["max"])
        raw = data.get("traffic")
        if raw is None:
            weights = {s: 1.0 for s in range(low, high + 1)}
        else:
            weights = {int(s): float(w) for s, w in raw.items() if float(w) > 0}
        total = sum(weights.values())
        memory, budget = data.get("memory_gib"), data.get(PREPARE_BUDGET)
        return cls(
            low,
            high,
            tuple(sorted((s, w / total) for s, w in weights.items())),
            None if memory is None else float(memory),
            None if budget is None else float(budget),
        )

    def to_dict(self) -> dict[str, Any]:
        """The profile as `from_dict` reads it (sizes as strings: JSON keys), for rows and presets."""
        return {
            "batch": {"min": self.min, "max": self.max},
            "traffic": {str(s): round(w, 12) for s, w in self.traffic},
            **({"memory_gib": self.memory_gib} if self.memory_gib is not None else {}),
            **({PREPARE_BUDGET: self.prepare_budget_s} if self.prepare_budget_s is not None else {}),
        }

    def sizes(self) -> list[int]:
        """Every batch size of the range."""
        return list(range(self.min, self.max + 1))

    def weights(self) -> dict[int, float]:
        """The weight of each size the traffic sends (the others weigh nothing)."""
        return dict(self.traffic)

    def describe(self) -> str:
        """One line for `plan` and the logs: the range and how the traffic is spread over it."""
        weights = self.weights()
        if len(weights) == self.max - self.min + 1 and len({round(w, 9) for w in weights.values()}) == 1:
            spread = "uniform"
        else:
            spread = ", ".join(f"{s}: {w:.0%}" for s, w in self.traffic)
        cap = f", bucket memory at most {self.memory_gib:g} GiB" if self.memory_gib is not None else ""
        if self.prepare_budget_s is not None:
            cap += f", prepared in at most {self.prepare_budget_s:g} s"
        return f"batch {self.min}..{self.max}, traffic {spread}{cap}"


PREPARE_BUDGET = "prepare_budget_s"
"""The profile's key for the seconds a buckets plan of packages may take to prepare."""


def profile_problems(data: Any) -> list[str]:
    """What is wrong with a serving profile as read from a file, each as one sentence naming the
    key; [] when it is usable."""
    if not isinstance(data, Mapping):
        return ["`serving` must be a mapping such as {batch: {min: 1, max: 32}}"]
    unknown = sorted(set(map(str, data)) - {"batch", "traffic", "memory_gib", PREPARE_BUDGET})
    problems = (
        [
            f"`serving` has unknown key(s) {', '.join(unknown)} "
            f"(it takes batch, traffic, memory_gib and {PREPARE_BUDGET})"
        ]
        if unknown
        else []
    )
    for key, unit in (("memory_gib", "GiB"), (PREPARE_BUDGET, "seconds")):
        cap = data.get(key)
        if cap is not None and (isinstance(cap, bool) or not isinstance(cap, (int, float)) or not cap > 0):
            problems.append(f"`serving.{key}` must be a number of {unit} > 0, not {cap!r}")
    batch = data.get("batch")
    if not isinstance(batch, Mapping) or set(map(str, batch)) != {"min", "max"}:
        return [*problems, "`serving.batch` must be {min: N, max: M}, the batch sizes the service sends"]
    low, high = batch["min"], batch["max"]
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in (low, high)):
        return [*problems, f"`serving.batch` min and max must be whole numbers, not {low!r} and {high!r}"]
    if not 1 <= low <= high <= MAX_BATCH:
        return [*problems, f"`serving.batch` needs 1 <= min <= max <= {MAX_BATCH}; got min {low}, max {high}"]
    traffic = data.get("traffic")
    if traffic is None:
        return problems
    if not isinstance(traffic, Mapping) or not traffic:
        return [*problems, "`serving.traffic` must map batch sizes to weights, e.g. {1: 0.5, 8: 0.5}"]
    for size, weight in traffic.items():
        try:
            n = int(size)
        except (TypeError, ValueError):
            problems.append(f"`serving.traffic` key {size!r} is not a batch size")
            continue
        if str(n) != str(size).strip() or not low <= n <= high:
            problems.append(f"`serving.traffic` size {size!r} is outside the batch range {low}..{high}")
        if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not weight >= 0:
            problems.append(f"`serving.traffic` weight of size {size} must be a number >= 0, not {weight!r}")
    if not problems and not any(float(w) > 0 for w in traffic.values()):
        problems.append("`serving.traffic` weighs every size 0: give at least one a positive weight")
    return problems


def next_bucket(buckets: list[int] | tuple[int, ...], size: int) -> int | None:
    """The smallest bucket at least `size` (the one a batch of `size` is padded up to), or None
    where every bucket is smaller."""
    return min((b for b in buckets if b >= size), default=None)


def default_buckets(low: int, high: int) -> list[int]:
    """Buckets on a ladder of powers of two and the halfway points between them (1, 2, 3, 4, 6, 8,
    12, 16, 24, 32, ...), within [low, high], with `high` itself: a size pads up by less than 1.5x."""
    ladder: set[int] = set()
    p = 1
    while p <= high:
        ladder.update({p, p + p // 2} if p > 1 else {1})
        p *= 2
    return sorted({b for b in ladder if low <= b <= high} | {high})


def fine_buckets(low: int, high: int) -> list[int]:
    """A finer ladder than `default_buckets`, the candidates an export times as packages and
    chooses its buckets from: every size up to 8, then four steps an octave (10, 12, 14, 16, 20,
    24, 28, 32, 40, ...), within [`low`, `high`], with `high` itself. A size pads up by at most
    1.25x (17 to 20: 1.18x); where the latency is flat (small batches on a GPU) the choice then
    drops the buckets the next one up serves as fast."""
    ladder = set(range(1, 9))
    p = 8
    while p <= high:
        ladder.update(p + p * k // 4 for k in range(1, 5))
        p *= 2
    return sorted({b for b in ladder if low <= b <= high} | {high})


def weighted_mean(latency: Mapping[int, float], profile: ServingProfile) -> float:
    """The traffic-weighted mean of a latency per batch size (every size the traffic sends must
    have one): what an average request of the profile waits."""
    return sum(w * latency[s] for s, w in profile.traffic)


def padded_latency(
    buckets: list[int], at_bucket: Mapping[int, float], profile: ServingProfile
) -> dict[int, float]:
    """What each size of the profile's traffic costs on a bucket plan: the latency of its bucket
    (`at_bucket`, measured per bucket). KeyError where a size has no bucket."""
    out = {}
    for size, _ in profile.traffic:
        bucket = next_bucket(buckets, size)
        if bucket is None:
            raise KeyError(f"batch size {size} is above every bucket ({buckets})")
        out[size] = at_bucket[bucket]
    return out


def choose_buckets(
    at_size: Mapping[int, float],
    profile: ServingProfile,
    max_buckets: int,
    memory: Mapping[int, float] | None = None,
    prepare: Mapping[int, float] | None = None,
    prepare_fixed_s: float = 0.0,
) -> list[int]:
    """The bucket set, at most `max_buckets` of the sizes measured in `at_size` (latency per size;
    it must hold a size >= the profile's max), that minimises the traffic-weighted padded latency.
    Exact: dynamic programming over the measured sizes in order (each bucket serves the sizes
    above the bucket before it). With the profile's `memory_gib` and `memory` (GiB each bucket
    holds), and with its `prepare_budget_s` and `prepare` (seconds each bucket takes to prepare,
    beside `prepare_fixed_s` that any set takes), the set must also fit each cap
    (`_choose_under_caps`)."""
    candidates = sorted(s for s in at_size if s >= profile.min)
    if not candidates or candidates[-1] < profile.max:
        raise ValueError(f"no measured size reaches the profile's max {profile.max}: {candidates}")
    candidates = [c for c in candidates if c < profile.max] + [min(c for c in candidates if c >= profile.max)]
    up_to = {0: 0.0}  # the traffic's weight of the sizes up to each candidate
    for c in candidates:
        up_to[c] = sum(w for s, w in profile.traffic if s <= c)

    def cost(lower: int, bucket: int) -> float:  # the sizes in (lower, bucket], served by `bucket`
        return (up_to[bucket] - up_to[lower]) * at_size[bucket]

    caps = []
    if profile.memory_gib is not None and memory is not None:
        caps.append((dict(memory), profile.memory_gib))
    if profile.prepare_budget_s is not None and prepare is not None:
        seconds = dict(prepare)  # the fixed part goes with the largest bucket, which every set holds
        seconds[candidates[-1]] = seconds[candidates[-1]] + prepare_fixed_s
        caps.append((seconds, profile.prepare_budget_s))
    if caps:
        return _choose_under_caps(candidates, cost, caps)

    n, k_max = len(candidates), max(1, max_buckets)
    inf = float("inf")
    best = [[inf] * (k_max + 1) for _ in range(n)]  # best[j][k]: sizes up to candidates[j], k buckets
    back: list[list[int]] = [[-1] * (k_max + 1) for _ in range(n)]
    for j, c in enumerate(candidates):
        best[j][1] = cost(0, c)
        for k in range(2, k_max + 1):
            for i in range(j):
                value = best[i][k - 1] + cost(candidates[i], c)
                if value < best[j][k] - 1e-15:
                    best[j][k], back[j][k] = value, i
    k = min(range(1, k_max + 1), key=lambda k: (best[n - 1][k], k))
    chosen, j = [], n - 1
    while j >= 0 and k >= 1:
        chosen.append(candidates[j])
        j, k = back[j][k], k - 1
    return sorted(chosen)


CAP_STEPS = 1000
"""A cap's resolution in `_choose_under_caps`: what each bucket uses is rounded up to a thousandth
of the cap, so a chosen set never exceeds it."""


def _choose_under_caps(
    candidates: list[int], cost: Any, caps: list[tuple[Mapping[int, float], float]]
) -> list[int]:
    """The bucket set of least traffic-weighted padded latency (`cost(lower, bucket)`) whose
    buckets' use of each resource sums to at most its cap (`caps`: per bucket its use, and the
    cap; ties to fewer buckets): dynamic programming over the candidates in order and the
    resources used, in `CAP_STEPS` steps of each cap, keeping per candidate only the states no
    other beats on latency and every resource at once. Where even the largest bucket alone does
    not fit, that bucket alone (every plan needs it)."""
    import math

    units = {c: tuple(math.ceil(use[c] / cap * CAP_STEPS - 1e-9) for use, cap in caps) for c in candidates}

    def fits(used: tuple[int, ...]) -> bool:
        return all(u <= CAP_STEPS for u in used)

    # best[j][used]: (cost, buckets) serving the sizes up to candidates[j], with candidates[j] a
    # bucket and `used` steps of each cap taken; back[j][used] the bucket before it (-1: none)
    best: list[dict[tuple[int, ...], tuple[float, int]]] = [{} for _ in candidates]
    back: list[dict[tuple[int, ...], int]] = [{} for _ in candidates]
    inf = (float("inf"), 0)
    for j, c in enumerate(candidates):
        if fits(units[c]):
            best[j][units[c]], back[j][units[c]] = (cost(0, c), 1), -1
        for i in range(j):
            step = cost(candidates[i], c)
            for m, (value, count) in best[i].items():
                used = tuple(a + b for a, b in zip(m, units[c], strict=True))
                if not fits(used):
                    continue
                option = (value + step, count + 1)
                if option < best[j].get(used, inf):
                    best[j][used], back[j][used] = option, i
        if len(caps) == 2:  # (with one cap, at most `CAP_STEPS` states each: all kept)
            best[j] = _undominated(best[j])
    last = len(candidates) - 1
    if not best[last]:
        return [candidates[last]]
    m = min(best[last], key=lambda used: best[last][used])
    chosen, j = [], last
    while j >= 0:
        chosen.append(candidates[j])
        i = back[j][m]
        m, j = tuple(a - b for a, b in zip(m, units[candidates[j]], strict=True)), i
    return sorted(chosen)


def _undominated(
    states: dict[tuple[int, ...], tuple[float, int]],
) -> dict[tuple[int, ...], tuple[float, int]]:
    """The states (steps of two caps used: (cost, buckets)) that no other state matches or beats
    on cost and on both caps: in order of cost, a state is kept where no state kept before it used
    at most as much of both (a Fenwick tree of the least second use by first use, `CAP_STEPS`
    steps each)."""
    size = CAP_STEPS + 1
    tree = [size] * (size + 1)  # prefix minima of the second cap's use, over the first's
    kept: dict[tuple[int, ...], tuple[float, int]] = {}
    for used, value in sorted(states.items(), key=lambda kv: (kv[1], kv[0])):
        first, second = used
        least, i = size, first + 1
        while i > 0:
            least, i = min(least, tree[i]), i - (i & -i)
        if least <= second:
            continue
        kept[used] = value
        i = first + 1
        while i <= size:
            tree[i], i = min(tree[i], second), i + (i & -i)
    return kept


def as_profile(value: Any) -> ServingProfile | None:
    """A `ServingProfile` from what a caller passes (`compile_tuned(serving=...)`): a profile, its
    dict, or None."""
    if value is None or isinstance(value, ServingProfile):
        return value
    return ServingProfile.from_dict(value)


def bucket_set(
    at_bucket: dict[int, float],
    profile: Any,
    memory: dict[int, float] | None = None,
    cold: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The buckets plan's set, chosen from the ladder's buckets by their measured latencies
    (`at_bucket`, ms; `choose_buckets`: the least traffic-weighted padded latency, ties to fewer
    buckets; a bucket is dropped where the next one up serves its sizes as fast; with the
    profile's `memory_gib` and `memory`, GiB per bucket, the best set that fits; with its
    `prepare_budget_s` and `cold`, the ladder prepared cold as
    `workers.bench.serving_prepare.cold_prepare` reports it, its `bucket_s` and `fixed_s`, the best
    set whose cold seconds fit), and that set's weighted latency, which the plans are compared by
    (`weighted_ms`; the full ladder's, as measured, is `ladder_ms`; each bucket's memory
    `bucket_gib`, its cold seconds `bucket_prepare_s`)."""
    seconds = {int(b): s for b, s in cold["bucket_s"].items()} if cold and "error" not in cold else None
    fixed = cold["fixed_s"] if seconds is not None else 0.0
    chosen = choose_buckets(at_bucket, profile, len(at_bucket), memory, seconds, fixed)
    record = {
        "buckets": chosen,
        "ladder_ms": {str(b): at_bucket[b] for b in sorted(at_bucket)},
        "weighted_ms": weighted_mean(padded_latency(chosen, at_bucket, profile), profile),
    }
    if memory is not None:
        record["bucket_gib"] = {str(b): memory[b] for b in sorted(memory)}
        record["memory_gib"] = sum(memory[b] for b in chosen)
    if seconds is not None:
        record["bucket_prepare_s"] = {str(b): seconds[b] for b in sorted(seconds)}
        record["prepare_fixed_s"] = fixed
    return record


def judged_prepare_s(slowest_s: float, bound_s: float | None) -> float:
    """The seconds a bucket set's cold prepare is judged by against a prepare budget: its slowest
    fresh process's, or where higher the most a new process would take as their spread predicts
    (`bound_s`, `compiler.statistics.prediction_high`; None from one process). What the export's
    choice fits (`workers.bench.serving_prepare`) and its line calls OVER BUDGET
    (`orchestrator.tune.sweep_models`)."""
    return max(slowest_s, bound_s if bound_s is not None else 0.0)
