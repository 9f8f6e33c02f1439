"""A serving plan served from AOTInductor packages, prepared before the first request: a buckets
plan's package per bucket (`load_buckets`, served by `BucketPackages`) or the dynamic plan's one
package for the batch range (`load_dynamic`). Each is loaded with the caller's weights, captured
and checked against eager; what it costs is reported step by step (`LoadedPlan.steps`).

A buckets plan of many buckets must prepare in seconds, not a compile per bucket:

- One eager reference, at the largest bucket. A smaller bucket's inputs are the first rows of the
  largest's (`compiler.serving.padding.resize_batch` cuts a batch to its first rows and pads by
  repeating the last), and a buckets plan exists only for a model whose padding check proved that
  rows do not interact: each bucket's package must reproduce the reference's first rows.
- Each bucket's own cuDNN plans, made by its package's first run. A convolution's first call at
  a new shape builds its cuDNN plan (heuristics, and for some engines a compile at run time),
  and the process keeps it, so the package of the reference's size finds the reference's plans
  and each other bucket pays for its own (ConvNeXt-Large on an H200: 0.6-1.3 s a bucket, 98% of
  its first run). torch keeps those plans per thread (a cuDNN execution plan is not safe to share
  across threads), so eager calls at the other sizes in threads beside the reference made none
  that a package's first run then found: measured, each first run took as long, and the
  reference longer (docs/results/serving-h200.md). The prepare budget is what bounds the sum:
  the export keeps the buckets whose cold prepare fits it.
- One CUDA graph memory pool for every graph. The buckets are captured largest first, each into
  the pool of the one before, as vLLM captures its batch sizes: their intermediates are held
  once, not once per bucket. A graph's outputs stay allocated while it lives, so a later capture
  never writes over them and a call's outputs stay valid until the next call of the same size,
  as with one graph per bucket in pools of their own.

The dynamic plan's package (its rows may interact: no padding, no slicing) is checked against
eager at the range's ends and, under CUDA graphs, captured at every size of the range, largest
first into one pool.

This module imports neither Ray nor the orchestrator package."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from compiler.serving.padding import batch_size, resize_batch, slice_batch

STEPS = ("reference_s", "load_s", "first_run_s", "capture_s", "check_s")
"""What `LoadedPlan.steps` times: the eager reference, loading each package (its library and the
model's weights), each package's first run at its size (`PackagedModel.capture`'s `first_run_s`:
folding the weights, loading its kernels), warming up and capturing its graphs, and checking its
outputs."""


class PlanLoadError(RuntimeError):
    """A plan's package that cannot serve: `key` names it as serving.json's `packages` does (a
    bucket's size, or `dynamic`); `state` is `refused` (its bytes did not verify) or `failed` (it
    did not load, capture or reproduce eager); `why` says what happened, or is empty where the
    loader has already said so."""

    def __init__(self, key: int | str, state: str, why: str):
        name = "the dynamic package" if key == DYNAMIC else f"bucket {key}"
        super().__init__(f"{name}: {why}" if why else f"{name}: {state}")
        self.key, self.state, self.why = key, state, why


DYNAMIC = "dynamic"
"""The dynamic plan's package's key in serving.json's `packages` (a bucket's is its size)."""


@dataclass
class LoadedPlan:
    """What `load_buckets` or `load_dynamic` prepared: the packages (per bucket, or the dynamic
    one under `DYNAMIC`), the seconds of each step (`STEPS`) and, on CUDA, the memory each bucket
    added to what the caching allocator reserves (GiB, in the order they were captured: the
    largest bucket's includes the pool the others share). `bucket_s`: the seconds each bucket took
    (loaded, captured and checked, its own eager reference included where it has one); the rest
    of the steps' seconds (the one reference) is what any set of the buckets takes."""

    packages: dict[Any, Any]
    steps: dict[str, float] = field(default_factory=dict)
    memory_gib: dict[int, float] = field(default_factory=dict)
    bucket_s: dict[int, float] = field(default_factory=dict)
    first_run_s: dict[int, float] = field(default_factory=dict)
    """Each bucket's package's first run at its size (seconds; `STEPS`' `first_run_s` is their sum)."""

    def fixed_s(self) -> float:
        """The steps' seconds that no one bucket took (`bucket_s`): the one eager reference."""
        return max(0.0, sum(self.steps.values()) - sum(self.bucket_s.values()))

    def serve(self) -> Any:
        """The callable that serves the plan's calls (each at a size the plan prepared)."""
        if DYNAMIC in self.packages:
            return self.packages[DYNAMIC]
        return BucketPackages(self.packages)


def load_buckets(
    buckets: list[int],
    load: Callable[[int], Any],
    model: Any,
    example: tuple[tuple, dict],
    precision: str,
    rows_independent: bool,
) -> LoadedPlan:
    """Each bucket's package, `load(bucket)` (a loaded `compiler.serving.packaged.PackagedModel`),
    captured on `example` resized to the bucket and checked against `model`'s eager outputs
    within `precision`'s budget, largest bucket first (see the module's docstring): against one
    reference's first rows where the padding check proved that rows do not interact
    (`rows_independent`: it padded some size and passed), else against a reference per bucket (a
    ladder of every size pads nothing, so proves nothing). Raises `PlanLoadError` for the first
    bucket that cannot serve (`load` may raise one itself)."""
    import torch

    from compiler import aoti
    from compiler.measure import compare_outputs
    from compiler.serving.served import cuda_device

    order = sorted(set(buckets), reverse=True)
    top = order[0]
    device = cuda_device(example)
    sync = _synchronizer(device)
    steps = dict.fromkeys(STEPS, 0.0)

    def eager(size: int) -> Any:
        t = time.perf_counter()
        out = _eager_at(model, example, size, sync)
        steps["reference_s"] += time.perf_counter() - t
        return out

    reference = eager(top) if rows_independent else None
    out = LoadedPlan({}, steps)
    if device is not None:  # neither the eager calls' activations nor what the process cached
        torch.cuda.empty_cache()  # before are a bucket's (the first capture would free them)
    reserved = torch.cuda.memory_reserved(device) if device is not None else 0
    pool = None
    for bucket in order:
        b_args, b_kwargs = resize_batch(*example, bucket)
        t = time.perf_counter()
        try:
            packaged = load(bucket)
            t1 = time.perf_counter()
            first = packaged.capture(b_args, b_kwargs, pool=pool)["first_run_s"]
            with torch.no_grad():
                got = packaged(*b_args, **b_kwargs)
            sync()
            t2 = time.perf_counter()
        except PlanLoadError:
            raise
        except Exception as exc:  # a package that will not load or run here
            raise PlanLoadError(bucket, "failed", f"{type(exc).__name__}: {_first_line(exc)}") from exc
        pool = packaged.pool or pool
        steps["load_s"] += t1 - t
        steps["first_run_s"] += first
        out.first_run_s[bucket] = first
        steps["capture_s"] += t2 - t1 - first
        if device is not None:
            now = torch.cuda.memory_reserved(device)
            out.memory_gib[bucket], reserved = (now - reserved) / 2**30, now
        want = slice_batch(reference, top, bucket) if rows_independent else eager(bucket)
        t3 = time.perf_counter()
        cmp = compare_outputs(aoti.tensors(want), aoti.tensors(got), precision)
        steps["check_s"] += time.perf_counter() - t3
        if not cmp.ok:
            raise PlanLoadError(bucket, "failed", f"its outputs differ from eager ({cmp.detail})")
        out.packages[bucket] = packaged
        out.bucket_s[bucket] = time.perf_counter() - t
    out.packages = dict(sorted(out.packages.items()))
    out.bucket_s = dict(sorted(out.bucket_s.items()))
    return out


def load_dynamic(
    load: Callable[[], Any],
    model: Any,
    example: tuple[tuple, dict],
    batch: tuple[int, int],
    precision: str,
) -> LoadedPlan:
    """The dynamic plan's package, `load()` (a loaded `compiler.serving.packaged.PackagedModel`
    for the batch range `batch`), checked against `model`'s eager outputs at the range's ends on
    `example` resized to each, and captured at every size of the range where it runs under CUDA
    graphs, largest first into one pool (else warmed up at the ends). Raises `PlanLoadError`."""
    import torch

    from compiler import aoti
    from compiler.measure import compare_outputs
    from compiler.serving.served import cuda_device

    low, high = batch
    sync = _synchronizer(cuda_device(example))
    steps = dict.fromkeys(STEPS, 0.0)
    ends = sorted({low, high})
    t = time.perf_counter()
    references = {size: _eager_at(model, example, size, sync) for size in ends}
    steps["reference_s"] = time.perf_counter() - t
    try:
        t = time.perf_counter()
        packaged = load()
        t1 = time.perf_counter()
        sizes = range(high, low - 1, -1) if packaged.cudagraphs else reversed(ends)
        first = 0.0  # each size's first run
        for size in sizes:
            first += packaged.capture(*resize_batch(*example, size))["first_run_s"]  # pool of the size before
        sync()
        t2 = time.perf_counter()
        outputs = {}
        for size in ends:
            s_args, s_kwargs = resize_batch(*example, size)
            with torch.no_grad():
                outputs[size] = aoti.tensors(packaged(*s_args, **s_kwargs))
            outputs[size] = [o.clone() for o in outputs[size]]  # the next size's call may reuse them
        sync()
    except PlanLoadError:
        raise
    except Exception as exc:  # a package that will not load or run here
        raise PlanLoadError(DYNAMIC, "failed", f"{type(exc).__name__}: {_first_line(exc)}") from exc
    steps["load_s"], steps["first_run_s"], steps["capture_s"] = t1 - t, first, t2 - t1 - first
    for size in ends:
        cmp = compare_outputs(aoti.tensors(references[size]), outputs[size], precision)
        if not cmp.ok:
            raise PlanLoadError(
                DYNAMIC, "failed", f"at batch {size} its outputs differ from eager ({cmp.detail})"
            )
    steps["check_s"] = time.perf_counter() - t2
    return LoadedPlan({DYNAMIC: packaged}, steps)


def _synchronizer(device: Any) -> Callable[[], None]:
    """A function that waits for the CUDA `device` (or does nothing for None), so that a step's
    seconds hold its GPU work."""
    import torch

    def sync() -> None:
        if device is not None:
            torch.cuda.synchronize(device)

    return sync


def _eager_at(model: Any, example: tuple[tuple, dict], size: int, sync: Callable[[], None]) -> Any:
    """`model`'s eager outputs on `example` resized to `size` rows, its GPU work finished."""
    import torch

    s_args, s_kwargs = resize_batch(*example, size)
    with torch.no_grad():
        out = model(*s_args, **s_kwargs)
    sync()
    return out


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else ""


class BucketPackages:
    """A buckets plan served from AOTInductor packages (`compiler.serving.packaged.PackagedModel`, one per
    bucket, prepared by `load_buckets`): a call runs the package of its batch size."""

    def __init__(self, packages: dict[int, Any]):
        self.packages = packages

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.packages[batch_size(args, kwargs)](*args, **kwargs)
