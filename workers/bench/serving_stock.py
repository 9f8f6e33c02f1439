"""The stock user under a serving profile's traffic, for the export's serving phase
(`workers.bench.serving`): plain `torch.compile` in the stock mode and dtype, timed in a process of
its own (`python -m workers.bench --serving-stock JSON`) at every size the traffic sends, each
size's first call its stall; and a prepared plan timed at those sizes as well (`time_sizes`)."""

from __future__ import annotations

import os
import statistics
import time
from pathlib import Path
from typing import Any

from compiler.env import cold_caches
from workers.bench.record import JobRecord

TIMED_CALLS = 5
"""Timed calls per size (after one untimed call), their median the size's latency."""

TIMED_SIZES = 64
"""At most this many sizes are timed per plan; a wider traffic is timed on the bucket ladder,
each size costed at the next timed size up."""


PLAIN_DROPS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "TORCHINDUCTOR_COMPILE_THREADS")
"""What a `plain` helper's environment leaves out of the job's: its thread caps
(`workers.runner.job_environment`); its cores (`AFFINITY_ENV`) as well."""


def helper_process(run: JobRecord, scratch: Path, plain: bool = False) -> tuple[dict[str, str], Path]:
    """(the environment, the job file in `scratch`) of a process this job starts to work on its
    behalf (`--bucket-package`, `--serving-stock`, `--serving-prepare`): its parent is this
    process, and it neither waits at this job's gate nor takes the cores of a process started
    ahead. A `plain` one (a serving process's stand-in, `--serving-prepare`) has neither the
    job's thread caps nor its cores in its environment, and leaves the job's pinning it inherits
    (`workers.affinity.UNPIN_ENV`)."""
    import json

    from workers.affinity import AFFINITY_ENV, AHEAD_AFFINITY_ENV, UNPIN_ENV
    from workers.bench import PARENT_PID_ENV
    from workers.bench.gate import GATE_FD_ENV

    env = {**os.environ, PARENT_PID_ENV: str(os.getpid())}
    for name in (
        GATE_FD_ENV,
        AHEAD_AFFINITY_ENV,
        UNPIN_ENV,
        *((AFFINITY_ENV, *PLAIN_DROPS) if plain else ()),
    ):
        env.pop(name, None)
    if plain:
        env[UNPIN_ENV] = "1"
    job_file = scratch / "job.json"
    job_file.write_text(json.dumps(run.job.to_dict()))
    return env, job_file


def stock_under_traffic(run: JobRecord, profile: Any, stock: dict[str, Any]) -> dict[str, Any]:
    """The stock user (`stock`: its torch.compile mode and dtype) under `profile`'s traffic, timed
    in a fresh process (`python -m workers.bench --serving-stock`, `serve_stock`, compiling with
    a cache of its own): its figures, or `error` saying why there are none."""
    spec = {**stock, "profile": profile.to_dict()}
    return {**stock, **helper_result(run, "--serving-stock", spec, "serving_stock", cold_cache=True)}


def helper_result(
    run: JobRecord, flag: str, spec: dict[str, Any], key: str, cold_cache: bool = False, plain: bool = False
) -> dict[str, Any]:
    """Run `python -m workers.bench FLAG JSON JOB.json RESULT.json` as this job's helper process
    (`helper_process`, `plain` or not; with `cold_cache`, a fresh node's caches of its own, empty:
    `compiler.env.cold_caches`) and return its result's `key`, or {"error": the first line of why there
    is none}."""
    import json
    import subprocess
    import sys
    import tempfile

    with tempfile.TemporaryDirectory(prefix=f"{flag.strip('-')}-") as scratch:
        env, job_file = helper_process(run, Path(scratch), plain)
        if cold_cache:
            env.update(cold_caches(scratch))
        result_file = Path(scratch) / "result.json"
        done = subprocess.run(
            [sys.executable, "-m", "workers.bench", flag, json.dumps(spec), str(job_file), str(result_file)],
            env=env,
            capture_output=True,
            text=True,
            stdin=subprocess.DEVNULL,
        )
        result = json.loads(result_file.read_text()) if result_file.exists() else {}
    if result.get("status") != "ok":
        said = result.get("error") or done.stderr[-2000:].strip() or f"exit {done.returncode}"
        return {"error": said.splitlines()[0][:300]}
    return result[key]


def serve_stock(run: JobRecord, spec: dict[str, Any]) -> None:
    """In a process of its own: the model built in `spec["dtype"]` (the stock user's: the model's
    own), compiled with plain `torch.compile` in `spec["mode"]`, and called at every size of
    `spec["profile"]`'s traffic in a seeded order, as a service would first see them: each size's
    first call (its stall: a compile where Dynamo recompiles) and then its latency, timed as the
    plans are (`time_sizes`), under torch's runtime defaults whatever the job's config sets.
    `run.result["serving_stock"]`: the traffic-weighted latency (stalls excluded), the stalls, the
    Dynamo graphs compiled, the runtime settings and the latency per size."""
    import random

    import torch

    from compiler import runtime
    from compiler.aoti import split_inputs
    from compiler.measure import time_calls
    from compiler.serving.padding import resize_batch
    from compiler.serving.served import graph_count
    from compiler.serving.traffic import ServingProfile, weighted_mean

    profile = ServingProfile.from_dict(spec["profile"])
    model, input_sets, _ = run.build(keep_fp32_copy=False, precision=spec.get("dtype") or None)
    # torch's runtime defaults, not the job's config's (a preset's `cudnn_benchmark` or
    # `cudnn_enabled: false`): set before the model's first call, as build sets the job's
    runtime.apply({})
    example = split_inputs(input_sets[0])
    mode = spec.get("mode") or None
    compiled = torch.compile(model, mode=None if mode == "default" else mode)
    cuda = run.job.device == "cuda"
    sizes = [s for s, _ in profile.traffic]
    order = random.Random(0).sample(sizes, len(sizes))
    graphs0 = graph_count()
    ms: dict[int, float] = {}
    stalls: dict[int, float] = {}
    with torch.no_grad():
        for size in order:
            args, kwargs = resize_batch(*example, size)
            if cuda:
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            compiled(*args, **kwargs)
            if cuda:
                torch.cuda.synchronize()
            stalls[size] = time.perf_counter() - t0
            compiled(*args, **kwargs)
            times = time_calls(
                lambda a=args, k=kwargs: compiled(*a, **k), TIMED_CALLS, "cuda" if cuda else "cpu"
            )
            ms[size] = statistics.median(times)
    graphs = graph_count()
    run.result["serving_stock"] = {
        "weighted_ms": weighted_mean(ms, profile),
        "stall_s": sum(stalls.values()),
        "max_first_call_s": max(stalls.values()),
        "graphs": None if graphs is None or graphs0 is None else graphs - graphs0,
        "runtime": runtime.current(),
        "order": order,
        "ms": {str(s): ms[s] for s in sorted(ms)},
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
