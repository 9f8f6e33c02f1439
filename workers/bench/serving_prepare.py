"""A buckets plan's packages prepared cold, for the export's serving phase
(`workers.bench.serving`) where the profile caps the seconds a serving process may spend preparing
(`prepare_budget_s`): in a fresh process of its own (`python -m workers.bench --serving-prepare
JSON`), the model built as the job builds it, the packages loaded, captured and checked by the
code `compile_tuned` runs (`compiler.serving.plan_packages.load_buckets`).

Cold, because the job's own process is warm: its padding check already ran the model eagerly at
the ladder's sizes, and a shape's first call (cuDNN plans, lazily loaded kernels, the library
handles) is much of what a serving process pays per bucket. What each bucket took there is what
the bucket choice weighs against the budget (`compiler.serving.traffic.choose_buckets`); the
chosen set is then prepared cold in `COLD_PROCESSES` fresh processes and kept where the slowest
fits, so the export records what it measured, not a sum.

The process stands in for a serving process a user starts: it leaves the job's cores and thread
caps behind (`helper_process(plain=True)`, `workers.affinity.UNPIN_ENV`), has a fresh node's
caches of its own, empty (`compiler.env.cold_caches`: Inductor's and the CUDA driver's JIT cache;
the traffic benchmark's served processes have them too), and records the cores, NUMA nodes and
threads it ran with (`compiler.env.process_facts`)."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from compiler import statistics as cstats
from compiler.serving.traffic import bucket_set, judged_prepare_s
from workers.bench.record import JobRecord
from workers.bench.serving_stock import helper_result


def cold_prepare(
    run: JobRecord,
    package: Path,
    built: dict[int, dict[str, Any]],
    buckets: list[int],
    rows_independent: bool,
) -> dict[str, Any]:
    """`buckets`' packages (of `built`, beside `package`) prepared as a serving process prepares
    them, in a fresh process (`serve_prepare`): `prepare_s` (their load, capture and check, the
    eager reference included), `steps`, `bucket_s` (per bucket, as JSON keys) and `fixed_s` (what
    no one bucket took); or `error` saying why there are none."""
    spec = {
        "dir": str(package.parent),
        "packages": {str(b): {k: built[b][k] for k in ("file", "inputs", "cudagraphs")} for b in buckets},
        "rows_independent": rows_independent,
    }
    return helper_result(run, "--serving-prepare", spec, "serving_prepare", cold_cache=True, plain=True)


def under_budget(
    run: JobRecord,
    profile: Any,
    built: dict[int, dict[str, Any]],
    buckets: list[int],
    package: Any,
    rows_independent: bool,
) -> dict[str, Any] | None:
    """Where the profile caps the buckets plan's prepare (`prepare_budget_s`) and its packages were
    `built`, every bucket's package prepared cold in a fresh process (`cold_prepare`): what the
    bucket choice weighs; else None."""
    if profile.prepare_budget_s is None or not built:
        return None
    return cold_prepare(run, package, built, buckets, rows_independent)


FIT_TRIES = 3
"""How many sets at most a buckets plan's choice prepares cold under a prepare budget
(`from_packages`): the first choice, and up to two smaller ones where a measurement exceeded it."""

COLD_PROCESSES = 3
"""Fresh processes a chosen set is prepared cold in under a prepare budget (`slowest_cold`): it is
kept where the slowest fits and so does the most a new process would take, predicted from their
spread (`fits`). A fresh process's seconds vary from one to the next: SegFormer-B0's 9 buckets on
an H200 prepared in 11.2, 8.8 and 9.0 s in three, where the export's one measurement had found
9.3 s; a set of 14 whose three at export took 9.0-9.8 s took 9.7-10.6 s in the traffic
benchmark's three."""


def fits(got: dict[str, Any], budget_s: float) -> bool:
    """Whether a set's cold prepare (`slowest_cold`'s) fits `budget_s`: its slowest process did,
    and so does `bound_s`, the most a new process would take at the thresholds' confidence
    (`compiler.statistics.prediction_high`), where its processes gave one."""
    return judged_prepare_s(got["prepare_s"], got.get("bound_s")) <= budget_s


def slowest_cold(
    measure: Callable[[list[int]], dict[str, Any]],
    buckets: list[int],
    budget_s: float | None,
    first: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """`buckets`' cold prepare (`measure`, `cold_prepare`'s) in up to `COLD_PROCESSES` fresh
    processes (`first`: one already run), stopping at the first that fails or takes longer than
    `budget_s` (one process where there is no budget): the slowest's figures with `runs`, each
    process's seconds, `bound_s`, the most a new process would take as their spread predicts
    (`compiler.statistics.prediction_high`), and `other_shares`, the share of each one's cores
    other processes took while it prepared (`compiler.host_state.HostShare`); or the failed one's,
    with its `error`.

    `bound_s` is None from one process, and where a process over the budget ended the runs early:
    that set does not fit by its slowest already, and the spread of two processes predicts little
    (Student's t at one degree of freedom is 6.3 at 95%): SegFormer-B0's 12 buckets on an H200
    prepared in 9.25 then 11.57 s, whose bound, 35.1 s, would have scaled the next choice down to
    3 buckets (`from_packages`) where the slowest's overrun leaves 10."""
    runs = [first if first is not None else measure(buckets)]
    while budget_s is not None and len(runs) < COLD_PROCESSES:
        if "error" in runs[-1] or runs[-1]["prepare_s"] > budget_s:
            break
        runs.append(measure(buckets))
    if "error" in runs[-1]:
        return runs[-1]
    seconds = [r["prepare_s"] for r in runs]
    ended_early = budget_s is not None and len(runs) < COLD_PROCESSES
    return {
        **max(runs, key=lambda r: r["prepare_s"]),
        "runs": seconds,
        "bound_s": None if ended_early else cstats.prediction_high(seconds, cstats.load_thresholds()),
        "other_shares": [r.get("host_other_share") for r in runs],
    }


def from_packages(
    record: dict[str, Any],
    ladder: dict | None,
    measure: Callable[[list[int]], dict[str, Any]],
    profile: Any,
    memory: dict[int, float] | None = None,
) -> dict[str, Any]:
    """What a buckets plan timed on packages adds to its `record` (`plan_record`'s): `from`, and
    where a prepare budget was weighed (`ladder`: the ladder's cold prepare, `under_budget`) the
    chosen buckets' cold prepare as measured (`cold_prepare_s`, `cold_prepare_steps`): the
    ladder's own run where every bucket was chosen, else a fresh one of the chosen set
    (`measure(buckets)`, `cold_prepare`'s); `cold_prepare_error` where the cold runs failed (then
    the budget was not applied).

    A set chosen from the ladder's seconds may still not fit the profile's `prepare_budget_s` when
    measured (`fits`: a fresh process's seconds vary from run to run, and the prediction from
    their spread counts, `cold_prepare_bound_s`). Then the ladder's seconds are scaled by how far
    that measurement (the slowest, or the prediction where higher; `slowest_cold` gives none where
    a process over the budget ended the runs) exceeded their sum (`prepare_scale`),
    the set is chosen again under them from the record's latencies and `memory`
    (`compiler.serving.traffic.bucket_set`, whose record of the new choice this returns), and that
    set is prepared cold in turn, up to `FIT_TRIES` sets in all (`cold_prepare_tries`; each set
    tried, where there were several, in `cold_prepare_sets`)."""
    if ladder is None:
        return {"from": "packages"}
    if "error" in ladder:
        return {"from": "packages", "cold_prepare_error": ladder["error"]}
    seconds = {int(b): s for b, s in ladder["bucket_s"].items()}
    chosen, budget_s = record["buckets"], profile.prepare_budget_s
    at_bucket = {int(b): ms for b, ms in record["ladder_ms"].items()}
    same = set(seconds) == set(chosen)
    got = slowest_cold(measure, chosen, budget_s, ladder if same else None)
    again: dict[str, Any] = {}
    tries, scale, sets = 1, 1.0, []
    while "error" not in got and budget_s is not None:
        summed = sum(seconds[b] for b in chosen) + ladder["fixed_s"]
        sets.append(_tried(chosen, summed * scale, got))
        if fits(got, budget_s) or tries >= FIT_TRIES:
            break
        scale = max(scale, judged_prepare_s(got["prepare_s"], got.get("bound_s")) / summed)
        choice = bucket_set(at_bucket, profile, memory, scaled_cold(ladder, scale))
        if choice["buckets"] == chosen:  # nothing smaller fits better: the largest bucket alone
            break
        again, chosen = choice, choice["buckets"]
        got, tries = slowest_cold(measure, chosen, budget_s), tries + 1
    if "error" in got:
        return {"from": "packages", "cold_prepare_error": got["error"]}
    return {
        **({"cold_prepare_sets": sets} if len(sets) > 1 else {}),
        **{k: v for k, v in again.items() if k not in ("bucket_prepare_s", "prepare_fixed_s")},
        "from": "packages",
        "cold_prepare_s": got["prepare_s"],
        "cold_prepare_steps": got["steps"],
        "cold_prepare_runs": got["runs"],
        "cold_prepare_bound_s": got.get("bound_s"),
        "cold_prepare_other_shares": got["other_shares"],
        "cold_prepare_process": got.get("process") or {},
        "cold_prepare_tries": tries,
        **({"prepare_scale": scale} if scale != 1.0 else {}),
    }


def _tried(buckets: list[int], estimate_s: float, got: dict[str, Any]) -> dict[str, Any]:
    """One set the choice prepared cold (`from_packages`' `cold_prepare_sets`, where it tried more
    than one): its buckets, the seconds it was chosen under and what its fresh processes took,
    with their steps and the share of their cores other processes took, so an overrun can be
    traced to a step, or to a busy node."""
    return {
        "buckets": buckets,
        "estimate_s": estimate_s,
        "runs": got["runs"],
        "bound_s": got.get("bound_s"),
        "other_shares": got["other_shares"],
        "steps": got["steps"],
    }


def scaled_cold(ladder: dict[str, Any], scale: float) -> dict[str, Any]:
    """The ladder's cold prepare (`cold_prepare`'s `bucket_s` and `fixed_s`) with every second
    times `scale`, for choosing a set again (`from_packages`)."""
    return {
        "bucket_s": {b: s * scale for b, s in ladder["bucket_s"].items()},
        "fixed_s": ladder["fixed_s"] * scale,
    }


def serve_prepare(run: JobRecord, spec: dict[str, Any]) -> None:
    """In a process of its own: the model built as the job builds it (channels-last where its
    config says so), then `spec["packages"]` (per bucket its file in `spec["dir"]`, input
    signature and CUDA graphs) loaded, captured and checked against eager
    (`load_buckets`, with `spec["rows_independent"]` as the padding check found), timed from the
    first load to the last check. `run.result["serving_prepare"]`: `cold_prepare`'s figures."""
    from compiler.aoti import split_inputs
    from compiler.env import process_facts
    from compiler.host_state import HostShare
    from compiler.serving.plan_packages import load_buckets
    from compiler.serving.served import DeviceClock

    model, input_sets, _ = run.build(keep_fp32_copy=False)
    cfg = run.job.config
    prepared = cfg.prepare_model(model) if cfg.channels_last else model
    example = split_inputs(input_sets[0])
    packages = {int(b): info for b, info in spec["packages"].items()}
    load = bucket_loader(Path(spec["dir"]), packages, prepared)
    host = HostShare(children=True)  # its waited children's work is its own
    clock = DeviceClock.of(example)
    loaded = load_buckets(
        sorted(packages), load, prepared, example, run.job.dtype, bool(spec["rows_independent"])
    )
    run.result["serving_prepare"] = {
        **clock.since(),  # prepare_s: from the first load to the last check; on CUDA, the memory
        "host_other_share": host.since(),
        "steps": loaded.steps,
        "bucket_s": {str(b): s for b, s in loaded.bucket_s.items()},
        "fixed_s": loaded.fixed_s(),
        # where it ran, and the caches it had (its own, empty at the start: `cold_prepare`)
        "process": {
            **process_facts(),
            "inductor_cache": os.environ.get("TORCHINDUCTOR_CACHE_DIR", ""),
            "cuda_jit_cache": os.environ.get("CUDA_CACHE_PATH", ""),
        },
    }


def bucket_loader(folder: Path, packages: dict[int, dict[str, Any]], model: Any) -> Any:
    """`load_buckets`' `load`: bucket N's package (`packages[N]`: its file in `folder`, input
    signature and CUDA graphs, as `package_buckets` built it) loaded with `model`'s weights, for
    the job's own timing and for the cold prepare alike."""
    from compiler.serving.packaged import PackagedModel, no_fallback

    def load(b: int) -> Any:
        info = packages[b]
        return PackagedModel.load(
            folder / info["file"],
            model,
            info["inputs"],
            info["cudagraphs"],
            no_fallback(f"bucket {b}'s package"),
        )

    return load
