"""Capture statistics and compile-time breakdown of a compile, from Dynamo and Inductor.

Sources: `torch._dynamo.utils.counters` (graphs, graph breaks with reasons),
`torch._dynamo.utils.get_compilation_metrics()` (one record per compiled frame: phase times,
guards, recompile reasons, why CUDA graphs were skipped) and
`torch._inductor.metrics.generated_kernel_count`. Fields a torch version lacks read as absent.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

_US = 1e-6


@dataclass(frozen=True)
class CaptureStats:
    graph_count: int
    graph_breaks: int
    break_reasons: tuple[str, ...]
    recompiles: int
    recompile_reasons: tuple[str, ...]
    guard_count: int | None
    kernel_count: int | None
    cudagraph_skip_reasons: tuple[str, ...]
    dynamo_s: float | None
    """Dynamo's cumulative compile time over all frames (as torch records it: usually with the backend's, not always)."""
    inductor_s: float | None
    """Inductor's cumulative compile time (lowering, scheduling, code generation)."""
    autotune_s: float | None
    """Autotuning: compile-time (max-autotune's kernel choices) plus first-run Triton config tuning."""
    triton_compile_s: float | None
    """Triton kernel compilation."""

    def to_dict(self) -> dict:
        d = asdict(self)
        for key in ("break_reasons", "recompile_reasons", "cudagraph_skip_reasons"):
            d[key] = list(d[key])
        return d


def reset(dynamo: bool = True) -> None:
    """Clear the counters and compile metrics read here; `dynamo=False` keeps Dynamo's compiled
    code (another compiled model of the same process must not have to compile again)."""
    import torch._dynamo
    from torch._dynamo.utils import counters

    if dynamo:
        torch._dynamo.reset()
    counters.clear()
    try:
        from torch._dynamo.utils import clear_compilation_metrics

        clear_compilation_metrics()
    except ImportError:
        pass
    try:
        from torch._inductor import metrics

        metrics.reset()
    except ImportError:
        pass


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


def fxgraph_cache_counts() -> dict[str, int]:
    """Inductor FX-graph cache lookups since the last `reset()`: hits, and misses plus bypasses
    (a graph the cache refused to store or look up). A warm compile with misses compiled again."""
    from torch._dynamo.utils import counters

    inductor = counters.get("inductor", {})
    return {
        "fxgraph_cache_hits": int(inductor.get("fxgraph_cache_hit", 0)),
        "fxgraph_cache_misses": int(
            inductor.get("fxgraph_cache_miss", 0) + inductor.get("fxgraph_cache_bypass", 0)
        ),
    }


def capture_stats() -> CaptureStats:
    from torch._dynamo.utils import counters, get_compilation_metrics

    breaks = counters.get("graph_break", {})
    records = list(get_compilation_metrics())
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
    try:
        from torch._inductor import metrics

        kernels = int(metrics.generated_kernel_count)
    except (ImportError, AttributeError):
        kernels = None
    return CaptureStats(
        graph_count=int(counters.get("stats", {}).get("unique_graphs", 0)),
        graph_breaks=int(sum(breaks.values())),
        break_reasons=tuple(sorted({_first_line(reason) for reason in breaks})),
        recompiles=len(recompile_reasons),
        recompile_reasons=recompile_reasons,
        guard_count=sum(guard_counts) if guard_counts else None,
        kernel_count=kernels,
        cudagraph_skip_reasons=skips,
        dynamo_s=_sum_us(records, "dynamo_cumulative_compile_time_us"),
        inductor_s=_sum_us(records, "inductor_cumulative_compile_time_us"),
        autotune_s=_sum_us(records, "compile_time_autotune_time_us", "runtime_triton_autotune_time_us"),
        triton_compile_s=_sum_us(records, "triton_compile_time_us"),
    )
