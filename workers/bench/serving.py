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
ResNet-50 runs faster on buckets, ViT on one dynamic graph). A plan the model cannot take (DETR's
graph specializes its batch size, so marking it dynamic fails) records its `error` instead, and
the other serves; the phase fails only where neither prepares. Every graph compiled
here is in the bundle written next, so a serving process prepares its plan from cache hits. The
result's `serving` is what serving.json records for the preset: the profile, the plan, its
buckets, the padding check, and per plan what preparing cost here and its weighted latency.
"""

from __future__ import annotations

import dataclasses
import functools
import gc
import os
import shutil
import time
from pathlib import Path
from typing import Any

from workers.bench.record import JobRecord, error_line
from workers.bench.serving_prepare import bucket_loader, cold_prepare, from_packages, under_budget
from workers.bench.serving_stock import helper_process, stock_under_traffic, time_sizes


def prepare_serving(
    run: JobRecord,
    model: Any,
    inputs: Any,
    profile_data: dict[str, Any],
    package: Path | None = None,
    stock: dict[str, Any] | None = None,
) -> None:
    """Phase `serving`: decide and prepare the plan for `profile_data` (a `ServingProfile`'s dict)
    on `model` (eager, as built) with the cell's `inputs`; its record in `run.result["serving"]`.
    With `package` (the export ships packages) and a config that packages, each plan is timed as
    it will be served: the buckets plan on a package per bucket of the finer ladder
    (`fine_buckets`, `packaged_buckets`; the chosen buckets' stay, `keep_packages`), and a chosen
    dynamic plan on one package for the range (`dynamic_package`). Without, or where a package
    fails (`package_error`), the plan is compiled here, its graphs in the bundle. With `stock` (a
    mode and a dtype), the stock user is timed under the same traffic in a process of its own
    (`stock_under_traffic`): `stock`, and `vs_stock` the plan's gain over it, stalls excluded."""
    from compiler import aoti
    from compiler.aoti import split_inputs
    from compiler.serving.padding import check_ladder
    from compiler.serving.traffic import ServingProfile, default_buckets, fine_buckets

    run.enter("serving")
    cfg = run.job.config
    profile = ServingProfile.from_dict(profile_data)
    example = split_inputs(inputs)
    packaged = package is not None and not aoti.packageable(cfg)
    ladder = fine_buckets if packaged else default_buckets
    buckets, check = check_ladder(model, *example, profile.min, profile.max, run.job.dtype, ladder)
    prepared = cfg.prepare_model(model) if cfg.channels_last else model
    cuda = run.job.device == "cuda"
    record: dict[str, Any] = {"profile": profile.to_dict(), "padding": check.to_dict()}
    plans: dict[str, dict[str, Any]] = {}
    built: dict[int, dict[str, Any]] = {}
    for plan in ("buckets", "dynamic") if check.ok else ("dynamic",):
        try:
            plans[plan] = _timed_plan(
                run, plan, prepared, example, profile, buckets, check, package, packaged, record, built
            )
        except Exception as exc:  # a plan this model cannot take (DETR's graph specializes its batch)
            plans[plan] = {"error": error_line(exc, 300)}
        _release(cuda)  # the next plan's memory is measured without this one's
    failed = {p: v["error"] for p, v in plans.items() if "error" in v}
    if len(failed) == len(plans):
        raise RuntimeError(
            "no serving plan prepared: " + "; ".join(f"{p}: {why}" for p, why in failed.items())
        )
    chosen = min((p for p in plans if p not in failed), key=lambda p: plans[p]["weighted_ms"])
    record.update(plan=chosen, buckets=plans[chosen].get("buckets", []), plans=plans)
    if package is not None and packaged:  # the chosen plan's packages, and only those, ship
        if built:
            keep_packages(run, record, built, package)
        if chosen == "dynamic" and "package_error" not in record:  # (a bucket's failure would recur)
            dynamic_package(run, prepared, example, profile, package, record, cuda)
    if stock is not None:
        _against_stock(run, profile, stock, record)
    run.result["serving"] = record


def _timed_plan(
    run: JobRecord,
    plan: str,
    prepared: Any,
    example: tuple,
    profile: Any,
    buckets: list[int],
    check: Any,
    package: Path | None,
    packaged: bool,
    record: dict[str, Any],
    built: dict[int, dict[str, Any]],
) -> dict[str, Any]:
    """`plan` prepared as a serving process prepares it and timed under the traffic: its record in
    `plans`. The buckets plan of a `packaged` preset (the export ships packages and its config
    packages) runs on a package per bucket of the ladder (`packaged_buckets`, which fills
    `built`), else on graphs compiled here."""
    import torch

    from compiler.aoti import package_options
    from compiler.serving.padding import rows_proven_independent
    from compiler.serving.served import ServedModel

    cfg = run.job.config
    cuda = run.job.device == "cuda"
    independent = rows_proven_independent(check.to_dict())
    served = None
    if plan == "buckets" and packaged:
        served, got, build, why = packaged_buckets(
            run, prepared, example, profile, buckets, package, independent
        )
        built.update(got)
        record["package_build"] = build
        if served is None:
            record["package_error"] = why
    if served is None:
        served = ServedModel(
            lambda dynamic: torch.compile(prepared, **{**cfg.compile_kwargs(), "dynamic": dynamic}),
            profile,
            plan,
            buckets,
            example,
            cudagraphs=cuda and package_options(cfg)[1],
            rows_independent=check.ok,
        )
        prep = served.prepare()
    else:
        prep = served.preparation
    memory = {b: built[b]["memory_gib"] for b in built} if built and cuda and plan == "buckets" else None
    cold = under_budget(run, profile, built, buckets, package, independent) if plan == "buckets" else None
    record_ = plan_record(
        served, prep, example, profile, cuda, buckets if plan == "buckets" else [], memory, cold
    )
    if built and plan == "buckets":  # timed on packages; where budgeted, the chosen set prepared cold
        measure = functools.partial(cold_prepare, run, package, built, rows_independent=independent)
        record_.update(from_packages(record_, cold, measure, profile, memory))
    return record_


def _against_stock(run: JobRecord, profile: Any, stock: dict[str, Any], record: dict[str, Any]) -> None:
    """The stock user under the same traffic (`stock`) and the chosen plan's gain over it (`vs_stock`)."""
    record["stock"] = stock_under_traffic(run, profile, stock)
    if record["stock"].get("weighted_ms"):
        record["vs_stock"] = record["stock"]["weighted_ms"] / record["plans"][record["plan"]]["weighted_ms"]


def plan_record(
    served: Any,
    prep: Any,
    example: tuple,
    profile: Any,
    cuda: bool,
    buckets: list[int],
    memory: dict[int, float] | None = None,
    cold: dict[str, Any] | None = None,
) -> dict:
    """A prepared plan's record: its latency at every size of the traffic (`time_sizes`) and their
    traffic-weighted mean, what preparing it cost (`prep`, a `Preparation`), and for a buckets
    plan (`buckets`) the set chosen from them (`compiler.serving.traffic.bucket_set`; under the
    profile's memory cap where `memory` says what each bucket holds, GiB, and under its prepare
    budget where `cold` says what each bucket took to prepare cold, `cold_prepare`)."""
    from compiler.serving.traffic import bucket_set, weighted_mean

    at_size, at_bucket = time_sizes(served, example, profile, cuda, buckets)
    record = {
        "weighted_ms": weighted_mean(at_size, profile),
        "prepare_s": prep.prepare_s,
        "graphs": prep.graphs,
        "memory_bytes": prep.memory_bytes,
        "peak_bytes": prep.peak_bytes,
        "reserved_bytes": prep.reserved_bytes,
        "ms": {str(s): at_size[s] for s in sorted(at_size)},
    }
    if prep.steps:
        record["prepare_steps"] = prep.steps
    if buckets:
        record.update(bucket_set(at_bucket, profile, memory, cold))
    return record


def keep_packages(
    run: JobRecord, record: dict[str, Any], built: dict[int, dict[str, Any]], package: Path
) -> None:
    """Of the bucket packages `built` beside `package`, keep those of the chosen plan's buckets
    (recorded as `packages`: file, input signature, CUDA graphs, compile seconds; none where the
    plan is dynamic) and remove the rest; the bucket of the job's batch size, where built, is
    copied to `package` as the preset's own (`package_from_bucket`)."""
    keep = set(record["buckets"]) if record["plan"] == "buckets" else set()
    if keep:
        record["packages"] = {
            str(b): {k: built[b][k] for k in ("file", "inputs", "cudagraphs", "compile_s")}
            for b in sorted(keep)
        }
    preset = built.get(run.job.batch_size)
    if preset is not None:
        shutil.copyfile(package.with_name(preset["file"]), package)
        run.result.update(preset["columns"])
        run.result["package_from_bucket"] = run.job.batch_size
    for b, info in built.items():
        if b not in keep:
            package.with_name(info["file"]).unlink(missing_ok=True)


def discard_packages(run: JobRecord, package: Path | None) -> None:
    """Remove the packages `prepare_serving` left beside `package` (the preset's, where its batch's
    bucket was copied to it, and the plan's buckets'), and their record."""
    if package is None:
        return
    serving = run.result.get("serving") or {}
    for info in (serving.pop("packages", None) or {}).values():
        package.with_name(info["file"]).unlink(missing_ok=True)
    if run.result.pop("package_from_bucket", None) is not None:
        package.unlink(missing_ok=True)
        for key in [k for k in run.result if k.startswith("package_")]:
            del run.result[key]


def packaged_buckets(
    run: JobRecord,
    model: Any,
    example: tuple[tuple, dict],
    profile: Any,
    buckets: list[int],
    package: Path,
    rows_independent: bool,
) -> tuple[Any, dict[int, dict[str, Any]], dict[str, Any], str]:
    """The buckets plan as a serving process loads it: every bucket's package built
    (`package_buckets`), loaded with `model`'s weights, captured and checked against `model` at its
    size, then prepared as `compile_tuned` prepares it. (the prepared `ServedModel`, what was
    built by bucket, the build's wall time, processes and GPUs, "") or (None, {}, that, why not);
    the preparation's time and memory include loading the packages."""
    from compiler.serving.plan_packages import BucketPackages, PlanLoadError, load_buckets
    from compiler.serving.served import DeviceClock, ServedModel

    built, build, why = package_buckets(run, buckets, package)
    if why:
        return None, {}, build, why

    clock = DeviceClock.of(example)
    try:
        prepared = load_buckets(
            buckets,
            bucket_loader(package.parent, built, model),
            model,
            example,
            run.job.dtype,
            rows_independent,
        )
    except PlanLoadError as exc:
        for info in built.values():
            package.with_name(info["file"]).unlink(missing_ok=True)
        return None, {}, build, str(exc)
    for b, gib in prepared.memory_gib.items():  # what each bucket holds: its graph's share and folded weights
        built[b]["memory_gib"] = gib
    loaded = prepared.packages
    served = ServedModel(lambda dynamic: BucketPackages(loaded), profile, "buckets", buckets, example)
    served.prepare()
    served.preparation = dataclasses.replace(  # loading included
        served.preparation, **clock.since(), steps=prepared.steps
    )
    return served, built, build, ""


def _release(cuda: bool) -> None:
    """Free what a plan left behind before the next is measured."""
    gc.collect()
    if cuda:
        import torch

        torch.cuda.empty_cache()


def dynamic_package(
    run: JobRecord, model: Any, example: tuple, profile: Any, package: Path, record: dict, cuda: bool
) -> None:
    """The dynamic plan as a serving process loads it: one package for the profile's batch range
    (built in a process of its own, `package_buckets`), loaded with `model`'s weights, checked and
    captured as `compile_tuned` prepares it (`compiler.serving.plan_packages.load_dynamic`), and
    timed at the traffic's sizes: `package_ms` and `package_prepare_s` beside the plan's
    torch.compile figures in `plans.dynamic`. The package is recorded under `packages.dynamic`,
    or, where it fails, removed and `package_error` says why (the plan is then served from the
    bundle)."""
    from compiler.serving.packaged import PackagedModel, no_fallback
    from compiler.serving.plan_packages import DYNAMIC, PlanLoadError, load_dynamic
    from compiler.serving.served import DeviceClock, ServedModel

    batch = (profile.min, profile.max)
    built, build, why = package_buckets(run, [batch], package)
    record["plans"]["dynamic"]["package_build"] = build  # the buckets' own build stays `package_build`
    if why:
        record["package_error"] = why
        return
    info = built[batch]
    path = package.with_name(info["file"])

    clock = DeviceClock.of(example)
    try:
        loaded = load_dynamic(
            lambda: PackagedModel.load(
                path, model, info["inputs"], info["cudagraphs"], no_fallback("the dynamic package"), batch
            ),
            model,
            example,
            batch,
            run.job.dtype,
        )
    except PlanLoadError as exc:
        path.unlink(missing_ok=True)
        record["package_error"] = str(exc)
        return
    served = ServedModel(
        lambda dynamic: loaded.serve(),
        profile,
        "dynamic",
        [],
        example,
        cudagraphs=info["cudagraphs"],
        rows_independent=bool(record["padding"].get("ok")),
    )
    served.prepare()
    prep = dataclasses.replace(served.preparation, **clock.since())
    timed = plan_record(served, prep, example, profile, cuda, [])
    record["plans"]["dynamic"].update(
        package_ms=timed["weighted_ms"], package_prepare_s=prep.prepare_s, prepare_steps=loaded.steps
    )
    record["packages"] = {
        DYNAMIC: {k: info[k] for k in ("file", "inputs", "cudagraphs", "compile_s", "batch")}
    }


def package_buckets(
    run: JobRecord, buckets: list[Any], package: Path
) -> tuple[dict[Any, dict[str, Any]], dict[str, Any], str]:
    """An AOTInductor package of the job's config per bucket, each built in a process of its own
    (`python -m workers.bench --bucket-package N FILE`: the model built as this job built it, its
    inputs resized to the bucket) and written beside `package` as `<stem>-b<N>.pt2`. A bucket
    given as (low, high) is the dynamic plan's package for that batch range (`LOW:HIGH`,
    `<stem>-b<LOW>-<HIGH>.pt2`).

    A package's build is mostly one thread's C++ compile, so the builds run side by side: up to
    half this process's cores at once (`build_processes`), each on the GPU this process sees
    with the fewest builds running (`least_busy`), each with its share of the cores for
    Inductor's compile workers. Returns (per
    bucket its file name, input signature, CUDA graphs, compile seconds and build columns; the
    build's wall time, processes and GPUs; "") or ({}, that, why not) after the first failure,
    the other builds stopped and every file removed."""
    import subprocess
    import sys
    import tempfile

    processes = build_processes(len(buckets))
    gpus = visible_gpus() if run.job.device == "cuda" else []
    threads = max(1, len(os.sched_getaffinity(0)) // processes)
    build = {"processes": processes, "gpus": len(gpus), "buckets": len(buckets)}
    scratch = Path(tempfile.mkdtemp(prefix="bucket-packages-"))
    env, job_file = helper_process(run, scratch)
    env["TORCHINDUCTOR_COMPILE_THREADS"] = str(threads)
    pending, running, done = list(buckets), {}, {}
    error, on_gpu = "", {}
    t0 = time.perf_counter()
    try:
        while (pending and not error) or running:
            while pending and not error and len(running) < processes:
                b = pending.pop(0)
                path = package.with_name(f"{package.stem}-b{_label(b)}.pt2")
                log = open(scratch / f"b{_label(b)}.log", "w")  # noqa: SIM115 (closed when the process ends)
                child_env = dict(env)
                if gpus:
                    on_gpu[b] = child_env["CUDA_VISIBLE_DEVICES"] = least_busy(
                        gpus, [on_gpu[r] for r in running]
                    )
                spec = f"{b[0]}:{b[1]}" if isinstance(b, tuple) else str(b)
                cmd = [sys.executable, "-m", "workers.bench", "--bucket-package", spec, str(path)]
                proc = subprocess.Popen(
                    [*cmd, str(job_file), str(scratch / f"b{_label(b)}.json")],
                    env=child_env,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                )
                running[b] = (proc, path, log)
            time.sleep(0.1)
            for b, (proc, path, log) in list(running.items()):
                if proc.poll() is None:
                    if error:
                        proc.kill()
                    continue
                del running[b]
                log.close()
                info, why = _bucket_outcome(b, proc.returncode, path, scratch)
                if info is not None:
                    done[b] = info
                elif not error:
                    error = why
    finally:
        for proc, _, log in running.values():
            proc.kill()
            proc.wait()
            log.close()
        shutil.rmtree(scratch, ignore_errors=True)
    build["wall_s"] = time.perf_counter() - t0
    if error:
        for b in buckets:
            package.with_name(f"{package.stem}-b{_label(b)}.pt2").unlink(missing_ok=True)
        return {}, build, error
    return done, build, ""


def _bucket_outcome(bucket: Any, returncode: int, path: Path, scratch: Path) -> tuple[dict | None, str]:
    """A `--bucket-package` process's package (its file name, input signature, CUDA graphs,
    compile seconds, batch range for a range's package, and build columns), or (None, why not:
    the error's first line, or the last line of the log of a process that died)."""
    import json

    result_file = scratch / f"b{_label(bucket)}.json"
    result = json.loads(result_file.read_text()) if result_file.exists() else {}
    if returncode == 0 and result.get("status") == "ok" and path.exists():
        return {
            "file": path.name,
            "inputs": result["package_inputs"],
            "cudagraphs": result["package_cudagraphs"],
            "compile_s": result["package_compile_s"],
            **({"batch": result["package_batch"]} if result.get("package_batch") else {}),
            "columns": {k: v for k, v in result.items() if k.startswith("package_")},
        }, ""
    said = result.get("error") or (scratch / f"b{_label(bucket)}.log").read_text()[-2000:].strip()
    line = (said.splitlines()[0] if result.get("error") else said.splitlines()[-1]) if said else ""
    name = f"batch range {bucket[0]}..{bucket[1]}" if isinstance(bucket, tuple) else f"bucket {bucket}"
    return None, f"{name}: {result.get('status') or f'exit {returncode}'}: {line[:300]}"


def _label(bucket: Any) -> str:
    """A bucket's name in file names: its size, or `LOW-HIGH` for a batch range's package."""
    return f"{bucket[0]}-{bucket[1]}" if isinstance(bucket, tuple) else str(bucket)


def build_processes(builds: int) -> int:
    """How many package builds run at once: half this process's cores (a build's C++ compile is
    one thread, its Triton kernels a few more), at least one, at most `builds`."""
    return max(1, min(builds, len(os.sched_getaffinity(0)) // 2))


def least_busy(gpus: list[str], busy: list[str]) -> str:
    """Of `gpus`, the one running the fewest of the builds now running (`busy`, each build's GPU);
    the first listed of those tied."""
    return min(gpus, key=lambda g: (busy.count(g), gpus.index(g)))


def visible_gpus() -> list[str]:
    """The GPUs this process sees, as `CUDA_VISIBLE_DEVICES` names them (its list, where set;
    else every device's index)."""
    listed = os.environ.get("CUDA_VISIBLE_DEVICES")
    if listed is not None:
        return [g.strip() for g in listed.split(",") if g.strip()]
    import torch

    return [str(i) for i in range(torch.cuda.device_count())]
