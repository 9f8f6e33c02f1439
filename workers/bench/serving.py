"""The phase `serving` of `python -m workers.bench --bundle FILE --serving PROFILE`: an export's
preset made ready for the traffic it serves (`compiler.serving.traffic`).

After the preset's cold compile at its batch size, the padding check runs on the eager model
(`compiler.serving.padding`, the preset precision's tolerance). The plans it allows (buckets, on
the default ladder up to the range's max, only where padding leaves the real rows' outputs as
they were; one dynamic-batch graph always) are each prepared as `compile_tuned` prepares them
(`compiler.serving.served`) and timed at the sizes the traffic sends; the buckets plan keeps the
subset of the ladder that serves the traffic fastest by the buckets' own latencies (a bucket goes
where the next one up is as fast), and the plan with the lower traffic-weighted mean latency is
the preset's (neither wins everywhere: in bf16 under CUDA graphs
ResNet-50 runs faster on buckets, ViT on one dynamic graph). Every graph compiled
here is in the bundle written next, so a serving process prepares its plan from cache hits. The
result's `serving` is what serving.json records for the preset: the profile, the plan, its
buckets, the padding check, and per plan what preparing cost here and its weighted latency.
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

from workers.bench.record import JobRecord

TIMED_SIZES = 64
"""At most this many sizes are timed per plan; a wider traffic is timed on the bucket ladder,
each size costed at the next timed size up."""
TIMED_CALLS = 5
"""Timed calls per size (after one untimed call), their median the size's latency."""


def prepare_serving(run: JobRecord, model: Any, inputs: Any, profile_data: dict[str, Any]) -> None:
    """Phase `serving`: decide and prepare the plan for `profile_data` (a `ServingProfile`'s dict)
    on `model` (eager, as built) with the cell's `inputs`; its record in `run.result["serving"]`."""
    import torch

    from compiler.aoti import package_options, split_inputs
    from compiler.serving.padding import check_ladder
    from compiler.serving.served import ServedModel
    from compiler.serving.traffic import ServingProfile, weighted_mean

    run.enter("serving")
    cfg = run.job.config
    profile = ServingProfile.from_dict(profile_data)
    example = split_inputs(inputs)
    buckets, check = check_ladder(model, *example, profile.min, profile.max, run.job.dtype)
    kwargs = cfg.compile_kwargs()
    prepared = cfg.prepare_model(model) if cfg.channels_last else model
    cuda = run.job.device == "cuda"
    plans: dict[str, dict[str, Any]] = {}
    for plan in ("buckets", "dynamic") if check.ok else ("dynamic",):
        served = ServedModel(
            lambda dynamic: torch.compile(prepared, **{**kwargs, "dynamic": dynamic}),
            profile,
            plan,
            buckets,
            example,
            cudagraphs=cuda and package_options(cfg)[1],
            rows_independent=check.ok,
        )
        prep = served.prepare()
        at_size, at_bucket = time_sizes(served, example, profile, cuda, buckets if plan == "buckets" else [])
        plans[plan] = {
            "weighted_ms": weighted_mean(at_size, profile),
            "prepare_s": prep.prepare_s,
            "graphs": prep.graphs,
            "memory_bytes": prep.memory_bytes,
            "peak_bytes": prep.peak_bytes,
            "reserved_bytes": prep.reserved_bytes,
            "ms": {str(s): at_size[s] for s in sorted(at_size)},
        }
        if plan == "buckets":
            plans[plan].update(bucket_set(at_bucket, profile))
    chosen = min(plans, key=lambda p: plans[p]["weighted_ms"])
    run.result["serving"] = {
        "profile": profile.to_dict(),
        "plan": chosen,
        "buckets": plans[chosen].get("buckets", []),
        "padding": check.to_dict(),
        "plans": plans,
    }


def bucket_set(at_bucket: dict[int, float], profile: Any) -> dict[str, Any]:
    """The buckets plan's set, chosen from the ladder's buckets by their measured latencies
    (`compiler.serving.traffic.choose_buckets`: the least traffic-weighted padded latency, ties to
    fewer buckets; a bucket is dropped where the next one up serves its sizes as fast), and that set's
    weighted latency, which the plans are compared by (`weighted_ms`; the full ladder's, as
    measured, is `ladder_weighted_ms`)."""
    from compiler.serving.traffic import choose_buckets, padded_latency, weighted_mean

    chosen = choose_buckets(at_bucket, profile, len(at_bucket))
    return {
        "buckets": chosen,
        "ladder_ms": {str(b): at_bucket[b] for b in sorted(at_bucket)},
        "weighted_ms": weighted_mean(padded_latency(chosen, at_bucket, profile), profile),
    }


def time_sizes(
    served: Any, example: tuple, profile: Any, cuda: bool, buckets: list[int]
) -> tuple[dict[int, float], dict[int, float]]:
    """The prepared plan's latency (ms, median of `TIMED_CALLS` per-call times of
    `compiler.measure.time_calls`: CUDA events around each call on a GPU, as a job's rows time) at
    every size the traffic sends (or, beyond `TIMED_SIZES` of them, at the bucket ladder's sizes,
    each size costed at the next one up), and at each of `buckets` (each run at its own size,
    unpadded)."""
    from compiler.measure import time_calls
    from compiler.serving.padding import resize_batch
    from compiler.serving.traffic import default_buckets, next_bucket

    sizes = [s for s, _ in profile.traffic]
    ladder = default_buckets(profile.min, profile.max)
    timed = sorted(set(sizes if len(sizes) <= TIMED_SIZES else ladder) | set(buckets))
    measured: dict[int, float] = {}
    for size in timed:
        args, kwargs = resize_batch(*example, size)
        served(*args, **kwargs)  # one untimed call: the first replay after another size's
        times = time_calls(lambda a=args, k=kwargs: served(*a, **k), TIMED_CALLS, "cuda" if cuda else "cpu")
        measured[size] = statistics.median(times)
    at_size = {s: measured[s] if s in measured else measured[next_bucket(ladder, s)] for s in sizes}
    return at_size, {b: measured[b] for b in buckets}


def build_bucket_packages(run: JobRecord, model: Any, inputs: Any, package: Path) -> None:
    """Phase `serving_packages`, for a preset whose serving plan is buckets: one AOTInductor package per
    bucket (`compiler.aoti.build_package`, the cell's inputs resized to the bucket), written beside
    `package` as `<stem>-b<N>.pt2`, so that a serving process loads every bucket without tracing or
    compiling. Recorded in `run.result["serving"]["packages"]` by bucket (its file name, input
    signature, CUDA graphs, compile seconds); a bucket whose package fails leaves `package_error`
    there and no packages at all (the plan is then prepared from the bundle)."""
    import copy

    from compiler import aoti
    from compiler.aoti import split_inputs
    from compiler.serving.padding import resize_batch

    serving = run.result.get("serving") or {}
    if serving.get("plan") != "buckets":
        return
    run.enter("serving_packages")
    cfg = run.job.config
    why = aoti.packageable(cfg)
    if why:
        serving["package_error"] = f"not packaged: {why}"
        return
    args, kwargs = split_inputs(inputs)
    built: dict[str, dict[str, Any]] = {}
    for bucket in serving["buckets"]:
        b_args, b_kwargs = resize_batch(args, kwargs, bucket)
        path = package.with_name(f"{package.stem}-b{bucket}.pt2")
        try:
            info = aoti.build_package(
                cfg.prepare_model(copy.deepcopy(model)),
                b_kwargs if isinstance(inputs, dict) else b_args,
                cfg,
                path,
            )
        except Exception as exc:
            serving["package_error"] = (
                f"bucket {bucket}: {type(exc).__name__}: {str(exc).splitlines()[0][:300] if str(exc) else ''}"
            )
            for done in built.values():
                (package.parent / done["file"]).unlink(missing_ok=True)
            return
        built[str(bucket)] = {
            "file": path.name,
            "inputs": info["package_inputs"],
            "cudagraphs": info["package_cudagraphs"],
            "compile_s": info["package_compile_s"],
        }
    serving["packages"] = built
