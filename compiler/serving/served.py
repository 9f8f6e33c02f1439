"""A model served over a batch-size range from graphs prepared at load: `ServedModel`.

Two plans, each prepared whole before the first request, CUDA-graph capture included, so that a
size of the range never compiles in the request path:

- `buckets`: one graph specialized per bucket (`torch.compile(..., dynamic=False)`, one Dynamo
  graph per bucket size). A batch is padded up to the smallest bucket at least its size and its
  outputs sliced back (`compiler.serving.padding`); only for a model whose padding check passed.
- `dynamic`: one graph with the batch dimension marked dynamic over the range
  (`torch._dynamo.mark_dynamic`), plus the graph Dynamo specializes for a batch of 1 where the
  range starts there (Dynamo never treats a size of 1 as dynamic). Under CUDA graphs each size is
  a graph of its own to capture: every size of the range is run once at load.

A batch above the range's `max` is split into chunks of `max` rows, served one after another, and
the outputs concatenated: no compile, the latency of a few calls. That is exact only where the
model's rows do not interact, which the padding check proved (`rows_independent`); a model that
failed it (the dynamic plan's reason to exist) runs such a batch eagerly instead, with a warning
the first time, since chunks would change its results. A batch below `min` is served as the
smallest size the plan prepared (padded, where padding is allowed). Every call after `prepare`
is counted by Dynamo's graph counter: `compiles_after_prepare` must stay 0.

Serving is inference: every call, `prepare`'s included, runs under `torch.no_grad()` (grad mode is
part of what a compiled graph is guarded on: a call with it on would compile again).

Outputs of a plan that replays CUDA graphs are, as with `mode="reduce-overhead"`, overwritten by
the next call: clone what must outlive it (chunked calls clone each chunk themselves).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from compiler.serving.padding import (
    batch_size,
    concat_batches,
    leaves,
    map_tensors,
    resize_batch,
    slice_batch,
)
from compiler.serving.traffic import ServingProfile, next_bucket

PLANS = ("buckets", "dynamic")


@dataclass
class Preparation:
    """What `ServedModel.prepare` did: the sizes it ran (`sizes`), how long (`prepare_s`), the
    Dynamo graphs it compiled, and the device memory the plan holds once prepared (CUDA only:
    the rise in allocated bytes, the peak of them while preparing, and the rise in the bytes the
    caching allocator reserved, where every CUDA-graph pool of the plan lives). A plan served from
    bucket packages adds the seconds of each step of loading them (`steps`,
    `compiler.serving.plan_packages.STEPS`)."""

    sizes: list[int] = field(default_factory=list)
    prepare_s: float = 0.0
    graphs: int | None = None
    memory_bytes: int | None = None
    peak_bytes: int | None = None
    reserved_bytes: int | None = None
    steps: dict[str, float] | None = None


class DeviceClock:
    """Time and CUDA memory from its creation on `device` (a CUDA device, or None: time only):
    what preparing a plan cost, as `Preparation` reports it. `since()` gives `prepare_s` and, on
    a CUDA device, the rise in allocated bytes (`memory_bytes`), their peak (`peak_bytes`, the
    peak statistics reset at creation) and the rise in reserved bytes (`reserved_bytes`)."""

    def __init__(self, device: Any):
        import torch

        self.device = device
        if device is not None:
            torch.cuda.synchronize(device)
            # what the process cached before is not the plan's, and the plan's first CUDA graph
            # capture would release it (torch.cuda.graph empties the cache): the rise in
            # reserved bytes went below 0 in an export's job process (SegFormer, -3.5 GB)
            torch.cuda.empty_cache()
            self.allocated = torch.cuda.memory_allocated(device)
            self.reserved = torch.cuda.memory_reserved(device)
            torch.cuda.reset_peak_memory_stats(device)
        self.t0 = time.perf_counter()

    @classmethod
    def of(cls, example: Any) -> DeviceClock:
        """A clock on the CUDA device `example`'s tensors are on, if any."""
        return cls(cuda_device(example))

    def since(self) -> dict[str, Any]:
        import torch

        out: dict[str, Any] = {"prepare_s": time.perf_counter() - self.t0}
        if self.device is not None:
            torch.cuda.synchronize(self.device)
            out["memory_bytes"] = torch.cuda.memory_allocated(self.device) - self.allocated
            out["peak_bytes"] = torch.cuda.max_memory_allocated(self.device) - self.allocated
            out["reserved_bytes"] = torch.cuda.memory_reserved(self.device) - self.reserved
        return out


def cuda_device(example: Any) -> Any:
    """The CUDA device of the first tensor of `example` on one, or None."""
    import torch

    for leaf in leaves(example):
        if isinstance(leaf, torch.Tensor) and leaf.device.type == "cuda":
            return leaf.device
    return None


def graph_count() -> int | None:
    """Dynamo's count of graphs compiled in this process, or None where its counters are not there
    as checked (`compiler.torch_private`)."""
    from compiler import torch_private

    try:
        return int(torch_private.dynamo_counters()["stats"]["unique_graphs"])
    except (torch_private.TorchPrivateError, KeyError, TypeError):
        return None


class ServedModel:
    """`model` served over `profile`'s range with `plan` ("buckets" over `buckets`, or "dynamic"):
    `compile(dynamic)` returns the compiled model (`torch.compile` with the preset's config and
    that `dynamic`); `example` is one call's (args, kwargs), resized to each size `prepare` runs.
    `cudagraphs`: the compiled model replays CUDA graphs (it needs warm-up calls per size).
    `rows_independent`: the padding check passed (default: for the buckets plan, which requires
    it), so a batch above `max` may be chunked; otherwise such a batch runs `eager`, the model
    uncompiled."""

    def __init__(
        self,
        compile: Callable[[bool | None], Callable[..., Any]],
        profile: ServingProfile,
        plan: str,
        buckets: list[int],
        example: tuple[tuple, dict],
        cudagraphs: bool = False,
        rows_independent: bool | None = None,
        eager: Callable[..., Any] | None = None,
    ):
        if plan not in PLANS:
            raise ValueError(f"unknown serving plan {plan!r}; the plans are {', '.join(PLANS)}")
        if plan == "buckets" and (not buckets or max(buckets) < profile.max):
            raise ValueError(f"the buckets {buckets} do not reach the range's max {profile.max}")
        self.profile = profile
        self.plan = plan
        self.buckets = sorted(buckets) if plan == "buckets" else []
        self.example = example
        self.cudagraphs = cudagraphs
        self.rows_independent = plan == "buckets" if rows_independent is None else rows_independent
        self.eager = eager
        self._warned_eager = False
        self.compiled = compile(False if plan == "buckets" else None)
        self.preparation = Preparation()
        self._graphs_after: int | None = None

    # --- preparing -------------------------------------------------------------------------------

    def sizes_to_prepare(self) -> list[int]:
        """The batch sizes `prepare` runs: every bucket; for the dynamic plan the range's ends (and
        2, the first size the dynamic graph takes), or every size under CUDA graphs."""
        if self.plan == "buckets":
            return list(self.buckets)
        low, high = self.profile.min, self.profile.max
        if self.cudagraphs:
            return list(range(low, high + 1))
        return sorted({low, min(max(2, low), high), high})

    def prepare(self) -> Preparation:
        """Compile and warm up every graph of the plan now (three calls a size under CUDA graphs:
        warm-up, capture, replay); returns what it did, also kept as `preparation`."""
        import torch

        args, kwargs = self.example
        batch = batch_size(args, kwargs)
        if self.plan == "dynamic":
            low = max(2, self.profile.min)
            args, kwargs = resize_batch(args, kwargs, max(low, min(batch, self.profile.max)), batch)
            batch = batch_size(args, kwargs)
            if low < self.profile.max:
                map_tensors((args, kwargs), lambda t: _mark_batch(t, batch, low, self.profile.max))
        sizes = self.sizes_to_prepare()
        if self.plan == "dynamic":  # the marked example first: the first graph is the dynamic one
            sizes = [batch, *(s for s in sizes if s != batch)]
        # one graph a size to prepare, beside what the process compiled of the model before (a
        # limit is per function, over every torch.compile of it): Dynamo must not stop at its limit
        torch._dynamo.config.recompile_limit += len(sizes) + 1
        clock = DeviceClock.of(self.example)
        graphs0 = graph_count()
        calls = 3 if self.cudagraphs else 1
        for size in sizes:
            s_args, s_kwargs = (args, kwargs) if size == batch else resize_batch(args, kwargs, size, batch)
            with torch.no_grad():
                for _ in range(calls):
                    self.compiled(*s_args, **s_kwargs)
        prep = Preparation(sizes=sizes, **clock.since())
        graphs1 = graph_count()
        if graphs0 is not None and graphs1 is not None:
            prep.graphs = graphs1 - graphs0
        self.preparation = prep
        self._graphs_after = graphs1
        return prep

    @property
    def compiles_after_prepare(self) -> int | None:
        """Dynamo graphs compiled in this process since `prepare` ended (any model's: a process
        that compiles others counts theirs too); None before `prepare` or without the counters."""
        now = graph_count()
        if self._graphs_after is None or now is None:
            return None
        return now - self._graphs_after

    # --- serving ---------------------------------------------------------------------------------

    def served_size(self, size: int) -> int:
        """The batch size a call of `size` rows (at most `max`) runs at: its bucket, or for the
        dynamic plan the size itself (below `min`: `min`)."""
        if self.plan == "buckets":
            return next_bucket(self.buckets, max(size, self.profile.min)) or self.buckets[-1]
        return max(size, self.profile.min)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        import torch

        size = batch_size(args, kwargs)
        with torch.no_grad():
            if size > self.profile.max:
                if not self.rows_independent:
                    return self._eager(args, kwargs, size)
                return self._chunked(args, kwargs, size)
            served = self.served_size(size)
            if served == size:
                return self.compiled(*args, **kwargs)
            p_args, p_kwargs = resize_batch(args, kwargs, served, size)
            return slice_batch(self.compiled(*p_args, **p_kwargs), served, size)

    def _eager(self, args: tuple, kwargs: dict, size: int) -> Any:
        import warnings

        if self.eager is None:
            raise ValueError(
                f"a batch of {size} is above the served range's max {self.profile.max}, and this model's rows "
                "interact (its padding check failed), so it cannot be served in chunks"
            )
        if not self._warned_eager:
            self._warned_eager = True
            warnings.warn(
                f"compile_tuned: a batch of {size} is above the served range's max {self.profile.max} and this "
                "model's rows interact (chunks would change its results): running it eagerly",
                RuntimeWarning,
                stacklevel=3,
            )
        return self.eager(*args, **kwargs)

    def _chunked(self, args: tuple, kwargs: dict, size: int) -> Any:
        """A batch above `max`: chunks of `max` rows (the last one smaller), each served and its
        outputs cloned (a CUDA-graph replay overwrites them), concatenated."""
        import torch

        high, parts, sizes = self.profile.max, [], []
        for start in range(0, size, high):
            n = min(high, size - start)

            def cut(t: Any, start: int = start, n: int = n) -> Any:
                return (
                    t[start : start + n]
                    if isinstance(t, torch.Tensor) and t.dim() and t.shape[0] == size
                    else t
                )

            c_args, c_kwargs = map_tensors(args, cut), map_tensors(kwargs, cut)
            parts.append(map_tensors(self(*c_args, **c_kwargs), lambda t: t.clone()))
            sizes.append(n)
        return concat_batches(parts, sizes)

    def describe(self) -> dict[str, Any]:
        """The plan as `Applied.serving` reports it."""
        prep = self.preparation
        return {
            "plan": self.plan,
            "profile": self.profile.to_dict(),
            "buckets": self.buckets,
            "prepared_sizes": prep.sizes,
            "prepare_s": prep.prepare_s,
            "prepare_graphs": prep.graphs,
            "memory_bytes": prep.memory_bytes,
            "peak_bytes": prep.peak_bytes,
            "reserved_bytes": prep.reserved_bytes,
            "above_max": "chunked",
        }


def _mark_batch(t: Any, batch: int, low: int, high: int) -> Any:
    import torch

    if isinstance(t, torch.Tensor) and t.dim() and t.shape[0] == batch:
        torch._dynamo.mark_dynamic(t, 0, min=low, max=high)
    return t


def exported_plan_applies(entry: dict[str, Any], profile: ServingProfile | None) -> bool:
    """Whether the preset `entry` was exported with a serving plan whose range covers `profile`
    (or no profile was asked for): `serve_range` then serves that plan."""
    exported = entry.get("serving") or {}
    if not exported.get("profile"):
        return False
    theirs = ServingProfile.from_dict(exported["profile"])
    return profile is None or theirs.min <= profile.min <= profile.max <= theirs.max


def serve_range(
    compile: Callable[[bool | None], Callable[..., Any]],
    model: Any,
    example: tuple[tuple, dict],
    profile: ServingProfile | None,
    entry: dict[str, Any],
    config: Any,
    applied: Any,
) -> ServedModel:
    """`compile_tuned`'s ranged serving: the plan the preset `entry` was exported with (`serving`
    in serving.json) where it covers `profile` (or no profile was asked for), else one decided
    here from the padding check on `example` (buckets where it passes, else dynamic); prepared
    now, and recorded in `applied.serving`."""
    from compiler.aoti import package_options
    from compiler.serving.padding import check_ladder

    exported = entry.get("serving") or {}
    if exported_plan_applies(entry, profile):
        profile = ServingProfile.from_dict(exported["profile"])
        plan, buckets = exported["plan"], list(exported.get("buckets") or [])
        check, plan_from = exported.get("padding") or {}, "export"
    else:
        assert profile is not None
        precision = entry.get("precision") or entry.get("dtype")
        buckets, checked = check_ladder(model, *example, profile.min, profile.max, precision)
        check = checked.to_dict()
        plan, plan_from = ("buckets" if check["ok"] else "dynamic"), "load"
    on_cuda = any(getattr(t, "device", None) is not None and t.device.type == "cuda" for t in leaves(example))
    served = ServedModel(
        compile,
        profile,
        plan,
        buckets,
        example,
        cudagraphs=on_cuda and package_options(config)[1],
        rows_independent=bool(check.get("ok")),
        eager=model,
    )
    served.prepare()
    applied.serving = {**served.describe(), "padding": check, "plan_from": plan_from}
    return served
