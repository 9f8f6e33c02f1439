"""Capture statistics and compile-time breakdown of a compile, from Dynamo and Inductor.

Sources, all through `compiler.torch_private` (`COMPILE_METRICS`): Dynamo's counters (graphs,
graph breaks with reasons, FX-graph cache lookups), Dynamo's compilation metrics (one record per
compiled frame: phase times, guards, recompile reasons, why CUDA graphs were skipped) and
Inductor's count of generated kernels. Fields a torch version lacks read as absent; a source this
torch does not offer as checked leaves its fields null and its reason in `CaptureStats.unavailable`
(the job's notes say it: `workers.bench.compile`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import TypeVar

from compiler import torch_private

T = TypeVar("T")

_US = 1e-6


@dataclass(frozen=True)
class CaptureStats:
    """A null field: its source is not there as checked on this torch (see `unavailable`)."""

    graph_count: int | None
    graph_breaks: int | None
    break_reasons: tuple[str, ...] | None
    recompiles: int | None
    recompile_reasons: tuple[str, ...] | None
    guard_count: int | None
    kernel_count: int | None
    cudagraph_skip_reasons: tuple[str, ...] | None
    dynamo_s: float | None
    """Dynamo's cumulative compile time over all frames (as torch records it: usually with the backend's, not always)."""
    inductor_s: float | None
    """Inductor's cumulative compile time (lowering, scheduling, code generation)."""
    autotune_s: float | None
    """Autotuning: compile-time (max-autotune's kernel choices) plus first-run Triton config tuning."""
    triton_compile_s: float | None
    """Triton kernel compilation."""
    unavailable: tuple[str, ...] = field(default=(), compare=False)
    """Why some fields are null (`compiler.torch_private.TorchPrivateError` messages, each once);
    not a column: `to_dict` leaves it out, the job's notes carry it."""

    def to_dict(self) -> dict:
        d = asdict(self)
        del d["unavailable"]
        for key in ("break_reasons", "recompile_reasons", "cudagraph_skip_reasons"):
            d[key] = None if d[key] is None else list(d[key])
        return d


def reset(dynamo: bool = True) -> None:
    """Clear the counters and compile metrics read here; `dynamo=False` keeps Dynamo's compiled
    code (another compiled model of the same process must not have to compile again). Where they
    are not there as checked, only Dynamo is reset: the reads say why their fields are null."""
    import torch._dynamo

    if dynamo:
        torch._dynamo.reset()
    with contextlib.suppress(torch_private.TorchPrivateError):
        torch_private.clear_compile_metrics()


def _read(call: Callable[[], T], unavailable: list[str]) -> T | None:
    """`call()`, or None with its refusal added to `unavailable` (once)."""
    try:
        return call()
    except torch_private.TorchPrivateError as exc:
        if str(exc) not in unavailable:
            unavailable.append(str(exc))
        return None


def _sum_us(records, *names: str) -> float | None:
    total, seen = 0.0, False
    for rec in records:
        for name in names:
            value = getattr(rec, name, None)
            if value is not None:
                total += value
                seen = True
    return total * _US if seen else None


def _first_line(text: str) -> str:
    return text.strip().splitlines()[0] if text and text.strip() else text


def fxgraph_cache_counts() -> dict[str, int | None]:
    """Inductor FX-graph cache lookups since the last `reset()`: hits, and misses plus bypasses
    (a graph the cache refused to store or look up). A warm compile with misses compiled again.
    Both None where Dynamo's counters are not there as checked (`capture_stats` says why)."""
    counters = _read(torch_private.dynamo_counters, [])
    if counters is None:
        return {"fxgraph_cache_hits": None, "fxgraph_cache_misses": None}
    inductor = counters.get("inductor", {})
    return {
        "fxgraph_cache_hits": int(inductor.get("fxgraph_cache_hit", 0)),
        "fxgraph_cache_misses": int(
            inductor.get("fxgraph_cache_miss", 0) + inductor.get("fxgraph_cache_bypass", 0)
        ),
    }


def capture_stats() -> CaptureStats:
    """The statistics of the compiles since the last `reset()`; a source this torch does not offer
    as checked gives null fields and its reason in `unavailable`."""
    unavailable: list[str] = []
    counters = _read(torch_private.dynamo_counters, unavailable)
    records = _read(torch_private.compilation_metrics, unavailable)
    kernels = _read(torch_private.inductor_kernel_count, unavailable)
    graphs: dict = {}
    if counters is not None:
        breaks = counters.get("graph_break", {})
        graphs = {
            "graph_count": int(counters.get("stats", {}).get("unique_graphs", 0)),
            "graph_breaks": int(sum(breaks.values())),
            "break_reasons": tuple(sorted({_first_line(reason) for reason in breaks})),
        }
    frames: dict = {}
    if records is not None:
        recompile_reasons = tuple(
            _first_line(r.recompile_reason) for r in records if getattr(r, "recompile_reason", None)
        )
        skips = tuple(
            sorted(
                {
                    _first_line(r.cudagraph_skip_reason)
                    for r in records
                    if getattr(r, "cudagraph_skip_reason", None)
                }
            )
        )
        guard_counts = [r.guard_count for r in records if getattr(r, "guard_count", None) is not None]
        frames = {
            "recompiles": len(recompile_reasons),
            "recompile_reasons": recompile_reasons,
            "guard_count": sum(guard_counts) if guard_counts else None,
            "cudagraph_skip_reasons": skips,
            "dynamo_s": _sum_us(records, "dynamo_cumulative_compile_time_us"),
            "inductor_s": _sum_us(records, "inductor_cumulative_compile_time_us"),
            "autotune_s": _sum_us(
                records, "compile_time_autotune_time_us", "runtime_triton_autotune_time_us"
            ),
            "triton_compile_s": _sum_us(records, "triton_compile_time_us"),
        }
    return CaptureStats(
        graph_count=graphs.get("graph_count"),
        graph_breaks=graphs.get("graph_breaks"),
        break_reasons=graphs.get("break_reasons"),
        recompiles=frames.get("recompiles"),
        recompile_reasons=frames.get("recompile_reasons"),
        guard_count=frames.get("guard_count"),
        kernel_count=kernels,
        cudagraph_skip_reasons=frames.get("cudagraph_skip_reasons"),
        dynamo_s=frames.get("dynamo_s"),
        inductor_s=frames.get("inductor_s"),
        autotune_s=frames.get("autotune_s"),
        triton_compile_s=frames.get("triton_compile_s"),
        unavailable=tuple(unavailable),
    )
