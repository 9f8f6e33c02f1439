"""A job's latency columns from its processes' samples, and one row from several processes.

With `measure.repeats: N` a job runs its timing in N fresh processes (see `workers.runner`):
the first compiles cold, the later ones compile against the cache the first filled and time
again, and each checks its compiled output by the fp64 rule; the row's accuracy columns are the
worst process's. Every process's samples are kept: `eager_samples_ms` and
`compiled_samples_ms` hold them all, in process order, and `samples_per_repeat` says how many
each process contributed (`compiler.statistics.split_groups` cuts them apart again). Medians,
percentiles and intervals are computed over all processes, the intervals by the hierarchical
bootstrap of `compiler.statistics`.
"""

from __future__ import annotations

import statistics as stdstats
from collections.abc import Sequence
from typing import Any

from compiler import statistics as cstats
from compiler.clocks import combine_summaries
from compiler.env import format_cpus, parse_cpus
from compiler.job import PHASES

CLOCK_KEYS = (
    "clock_samples",
    "sm_clock_mean_mhz",
    "sm_clock_min_mhz",
    "sm_clock_max_mhz",
    "mem_clock_mean_mhz",
    "power_mean_w",
    "power_max_w",
    "gpu_temp_max_c",
    "throttle_reasons",
    "timing_cpus",
    "timing_numa_nodes",
)

DEVICE_KEYS = (
    "device_samples_per_repeat",
    *(
        f"{side}_{name}"
        for side in ("eager", "compiled")
        for name in ("device_ms", "device_samples_ms", "device_ci_low", "device_ci_high", "host_bound_share")
    ),
)
"""The columns `device_fields` fills."""

ACCURACY_KEYS = (
    "max_abs_err",
    "max_rel_err",
    "rmse_compiled",
    "fp64_max_rel_err",
    "eager_fp64_max_rel_err",
)
"""Accuracy columns every process measures; a row keeps the worst (largest) of them."""


def latency_fields(
    eager_groups: Sequence[Sequence[float]],
    compiled_groups: Sequence[Sequence[float]],
    baseline_groups: Sequence[Sequence[float]] | None = None,
) -> dict[str, Any]:
    """The latency columns of a row from per-process sample groups (group i of every side from
    process i); `baseline_groups` for a job timed against a baseline config (`Job.baseline`)."""
    eager = [float(x) for g in eager_groups for x in g]
    compiled = [float(x) for g in compiled_groups for x in g]
    e, c = cstats.summarize(eager), cstats.summarize(compiled)
    speedup = cstats.ratio_interval(eager_groups, compiled_groups, paired=True)
    eager_iv = cstats.median_interval(eager_groups)
    compiled_iv = cstats.median_interval(compiled_groups)
    fields = _baseline_fields(baseline_groups, compiled_groups, c.median_ms) if baseline_groups else {}
    return fields | {
        "eager_ms": e.median_ms,
        "eager_p10_ms": e.p10_ms,
        "eager_p90_ms": e.p90_ms,
        "compiled_ms": c.median_ms,
        "compiled_p10_ms": c.p10_ms,
        "compiled_p90_ms": c.p90_ms,
        "eager_samples_ms": eager,
        "compiled_samples_ms": compiled,
        "samples_per_repeat": [len(g) for g in eager_groups],
        "repeats": len(eager_groups),
        "eager_repeat_ms": [stdstats.median(g) for g in eager_groups if g],
        "compiled_repeat_ms": [stdstats.median(g) for g in compiled_groups if g],
        "speedup": e.median_ms / c.median_ms if c.median_ms > 0 else None,
        "speedup_ci_low": speedup.low,
        "speedup_ci_high": speedup.high,
        "speedup_ci_between_share": speedup.between_share,
        "ci_scope": speedup.scope,
        "eager_ci_low": eager_iv.low,
        "eager_ci_high": eager_iv.high,
        "compiled_ci_low": compiled_iv.low,
        "compiled_ci_high": compiled_iv.high,
    }


def device_fields(
    eager_groups: Sequence[Sequence[float]],
    compiled_groups: Sequence[Sequence[float]],
    eager_wall_ms: float | None,
    compiled_wall_ms: float | None,
) -> dict[str, Any]:
    """The device-time columns of a GPU row from per-process groups of per-call device busy
    times (`compiler.measure.device_busy_ms`), and the host-bound share of each side against its
    wall median (`compiler.statistics.host_bound_share`)."""
    fields: dict[str, Any] = {"device_samples_per_repeat": [len(g) for g in eager_groups]}
    for side, groups, wall in (
        ("eager", eager_groups, eager_wall_ms),
        ("compiled", compiled_groups, compiled_wall_ms),
    ):
        flat = [float(x) for g in groups for x in g]
        if not flat:
            continue
        median = cstats.summarize(flat).median_ms
        iv = cstats.median_interval(groups)
        fields |= {
            f"{side}_device_ms": median,
            f"{side}_device_samples_ms": flat,
            f"{side}_device_ci_low": iv.low,
            f"{side}_device_ci_high": iv.high,
            f"{side}_host_bound_share": cstats.host_bound_share(median, wall),
        }
    return fields


def _baseline_fields(
    baseline_groups: Sequence[Sequence[float]], compiled_groups: Sequence[Sequence[float]], compiled_ms: float
) -> dict[str, Any]:
    baseline = [float(x) for g in baseline_groups for x in g]
    b = cstats.summarize(baseline)
    ratio = cstats.ratio_interval(baseline_groups, compiled_groups, paired=True)
    return {
        "baseline_ms": b.median_ms,
        "baseline_samples_ms": baseline,
        "baseline_repeat_ms": [stdstats.median(g) for g in baseline_groups if g],
        "speedup_vs_baseline": b.median_ms / compiled_ms if compiled_ms > 0 else None,
        "speedup_vs_baseline_ci_low": ratio.low,
        "speedup_vs_baseline_ci_high": ratio.high,
    }


def _phase_sum(results: list[dict[str, Any]], phase: str) -> float | None:
    values = [r[f"phase_{phase}_s"] for r in results if r.get(f"phase_{phase}_s") is not None]
    return sum(values) if values else None


def _join_notes(*notes: str | None) -> str | None:
    text = "; ".join(n for n in notes if n)
    return text or None


def merge(
    first: dict[str, Any], later: list[dict[str, Any]], warm: dict[str, Any] | None = None
) -> dict[str, Any]:
    """One row's fields from the job's processes: `first` (cold compile, accuracy, FLOPs, memory),
    `later` (the repeats, warm compiles, in order) and `warm` (the separate warm-compile process of
    a job with one repeat and `warm_compile`, if it ran)."""
    row = dict(first)
    repeats = [first, *later]
    _add_process_totals(row, [*repeats, *([warm] if warm else [])])
    row["repeat_compile_s"] = [p.get("compile_s") for p in repeats if p.get("compile_s") is not None]
    _keep_worst_accuracy(row, repeats)
    timed = _timed(repeats)
    if len(timed) > 1:
        _merge_latency(row, timed)
        _merge_host(row, timed)
    _add_warm_compile(row, later, warm)
    _add_repeat_outcomes(row, later)
    return row


def _timed(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Those of `results` (a job's processes, or rows) that are ok and timed both sides."""
    return [
        r
        for r in results
        if r.get("status") == "ok" and r.get("eager_samples_ms") and r.get("compiled_samples_ms")
    ]


def pool(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """One row from rows of the same cell and configs whose processes ran in separate jobs (a
    tune's confirmation and its extension: `orchestrator.tune.search.run_extend`): the first row
    with the latency and device-time columns over every process of those that timed, and each
    accuracy figure the worst any of them measured. Rows that did not time are left out; with
    fewer than two that did, the first that did (else the first) unchanged."""
    timed = _timed(rows)
    if len(timed) < 2:
        return dict(timed[0] if timed else rows[0])
    row = dict(timed[0])

    def groups(key: str, per: str = "samples_per_repeat") -> list[list[float]]:
        return [g for r in timed for g in cstats.split_groups(r[key], r.get(per))]

    baseline = groups("baseline_samples_ms") if all(r.get("baseline_samples_ms") for r in timed) else None
    row.update(latency_fields(groups("eager_samples_ms"), groups("compiled_samples_ms"), baseline))
    if all(r.get("compiled_device_samples_ms") and r.get("eager_device_samples_ms") for r in timed):
        per = "device_samples_per_repeat"
        row.update(
            device_fields(
                groups("eager_device_samples_ms", per),
                groups("compiled_device_samples_ms", per),
                row["eager_ms"],
                row["compiled_ms"],
            )
        )
    _keep_worst_accuracy(row, timed)
    return row


def _add_process_totals(row: dict[str, Any], processes: list[dict[str, Any]]) -> None:
    """How many processes the job ran, their wall time and each phase's, summed; and, process by
    process, whether it was started ahead and how long it waited at its gate (`workers.ahead`),
    with the start-up time that hid behind the process before it, summed."""
    row["job_processes"] = len(processes)
    row["subprocess_s"] = sum(p.get("subprocess_s") or 0.0 for p in processes)
    for phase in PHASES:
        row[f"phase_{phase}_s"] = _phase_sum(processes, phase)
    row["started_ahead"] = [bool(p.get("started_ahead")) for p in processes]
    row["gate_wait_s"] = [float(p.get("gate_wait_s") or 0.0) for p in processes]
    row["ahead_hidden_s"] = sum(p.get("ahead_hidden_s") or 0.0 for p in processes)
    ahead = {cpu for p in processes if p.get("ahead_cpus") for cpu in parse_cpus(p["ahead_cpus"])}
    row["ahead_cpus"] = format_cpus(ahead) if ahead else None


def _keep_worst_accuracy(row: dict[str, Any], repeats: list[dict[str, Any]]) -> None:
    """Each of `ACCURACY_KEYS` as the worst (largest) any process measured."""
    for key in ACCURACY_KEYS:
        measured = [p[key] for p in repeats if p.get(key) is not None]
        if measured:
            row[key] = max(measured)


def _merge_latency(row: dict[str, Any], timed: list[dict[str, Any]]) -> None:
    """The latency columns over the samples of every process that timed (the baseline's too,
    where each of them timed it), the device-time columns, each side's median back-to-back
    latency, and TFLOP/s from the first process's FLOPs and the medians over all."""
    baseline = [p["baseline_samples_ms"] for p in timed if p.get("baseline_samples_ms")]
    row.update(
        latency_fields(
            [p["eager_samples_ms"] for p in timed],
            [p["compiled_samples_ms"] for p in timed],
            baseline if len(baseline) == len(timed) else None,
        )
    )
    _merge_device(row, timed)
    for side in ("eager", "compiled"):
        b2b = [p[f"{side}_b2b_ms"] for p in timed if p.get(f"{side}_b2b_ms") is not None]
        row[f"{side}_b2b_ms"] = stdstats.median(b2b) if b2b else None
    flops = row.get("flops")
    for side in ("eager", "compiled"):
        ms = row.get(f"{side}_ms")
        if flops and ms:
            row[f"{side}_tflops"] = flops / (ms * 1e-3) / 1e12


def _merge_device(row: dict[str, Any], timed: list[dict[str, Any]]) -> None:
    """The device-time columns over every timed process, against the merged wall medians; all
    of them None where some process has no device time (a note says how many had it)."""
    device = [p for p in timed if p.get("eager_device_samples_ms") and p.get("compiled_device_samples_ms")]
    if len(device) == len(timed):
        row.update(
            device_fields(
                [p["eager_device_samples_ms"] for p in device],
                [p["compiled_device_samples_ms"] for p in device],
                row.get("eager_ms"),
                row.get("compiled_ms"),
            )
        )
        return
    for key in DEVICE_KEYS:
        row[key] = None
    if device:
        row["notes"] = _join_notes(
            row.get("notes"),
            f"device time measured in {len(device)} of {len(timed)} processes: left out",
        )


def _merge_host(row: dict[str, Any], timed: list[dict[str, Any]]) -> None:
    """The clocks' summary over every timed process (`compiler.clocks.combine_summaries`), their
    host probes, clocks, loads, other processes' shares of the cores and garbage collections in process order, and the worst CPU steal."""
    row.update(combine_summaries([{k: p.get(k) for k in CLOCK_KEYS} for p in timed]))
    row["host_probe_us"] = [x for p in timed for x in p.get("host_probe_us") or []]
    for key in ("host_cpu_mhz", "host_load_1m", "host_other_share", "timing_gc_collections"):
        row[key] = [x for p in timed for x in p.get(key) or []]
    steal = [p["host_steal_share"] for p in timed if p.get("host_steal_share") is not None]
    row["host_steal_share"] = max(steal) if steal else None


def _add_warm_compile(row: dict[str, Any], later: list[dict[str, Any]], warm: dict[str, Any] | None) -> None:
    """`warm_compile_s` (the repeats' median, else the warm-compile process's) and the first warm
    compile's FX-graph cache hits and misses; a note where the warm-compile process failed."""
    warm_compiles = [p for p in later if p.get("compile_s") is not None]
    if warm_compiles:
        row["warm_compile_s"] = stdstats.median(p["compile_s"] for p in warm_compiles)
        row["warm_cache_hits"] = warm_compiles[0].get("fxgraph_cache_hits")
        row["warm_cache_misses"] = warm_compiles[0].get("fxgraph_cache_misses")
    elif warm is not None:
        if warm.get("status") == "ok":
            row["warm_compile_s"] = warm.get("compile_s")
            row["warm_cache_hits"] = warm.get("fxgraph_cache_hits")
            row["warm_cache_misses"] = warm.get("fxgraph_cache_misses")
        else:
            row["notes"] = _join_notes(
                row.get("notes"), f"warm compile {warm.get('status')}: {(warm.get('error') or '')[:300]}"
            )


def _add_repeat_outcomes(row: dict[str, Any], later: list[dict[str, Any]]) -> None:
    """Each repeat's notes, prefixed with its number; and the first repeat that failed in a row
    that is `ok` makes the row's status and error its own."""
    total = 1 + len(later)
    for k, p in enumerate(later, start=2):
        if p.get("notes"):
            row["notes"] = _join_notes(row.get("notes"), f"repeat {k}: {p['notes']}")
        if p.get("status") != "ok" and row.get("status") == "ok":
            row["status"] = p.get("status", "crash")
            row["error"] = f"repeat {k} of {total} (a fresh process compiling warm): {p.get('error') or ''}"
