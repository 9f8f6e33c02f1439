"""Capture statistics of a compile: graphs, graph breaks, from Dynamo's counters."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class CaptureStats:
    graph_count: int
    graph_breaks: int
    break_reasons: tuple[str, ...]


def reset() -> None:
    import torch._dynamo

    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()


def capture_stats() -> CaptureStats:
    from torch._dynamo.utils import counters

    breaks = counters.get("graph_break", {})
    reasons = tuple(sorted({reason.splitlines()[0] for reason in breaks}))
    return CaptureStats(
        graph_count=int(counters.get("stats", {}).get("unique_graphs", 0)),
        graph_breaks=int(sum(breaks.values())),
        break_reasons=reasons,
    )
