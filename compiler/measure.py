"""Measurement primitives: latency samples, their summary, output comparison, peak memory."""

from __future__ import annotations

import math
import resource
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

# Accuracy tolerance on max |compiled - eager| / max |eager|, per precision policy.
TOLERANCE = {"fp32": 1e-3, "tf32": 1e-2, "bf16": 5e-2, "fp16": 1e-2}


@dataclass(frozen=True)
class LatencySummary:
    median_ms: float
    p10_ms: float
    p90_ms: float
    samples_ms: tuple[float, ...]


def percentile(sorted_values: list[float], q: float) -> float:
    """Linear-interpolated percentile of an already sorted list, q in [0, 100]."""
    if not sorted_values:
        return math.nan
    pos = (len(sorted_values) - 1) * q / 100.0
    lo, hi = math.floor(pos), math.ceil(pos)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


def summarize(samples_ms: list[float]) -> LatencySummary:
    s = sorted(samples_ms)
    return LatencySummary(statistics.median(s), percentile(s, 10), percentile(s, 90), tuple(samples_ms))


def time_calls(fn: Callable[[], Any], iterations: int, device: str) -> list[float]:
    """Per-call latency in ms: CUDA events around each call on GPU, perf_counter on CPU."""
    samples = []
    if device == "cuda":
        for _ in range(iterations):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            samples.append(start.elapsed_time(end))
    else:
        for _ in range(iterations):
            t0 = time.perf_counter()
            fn()
            samples.append((time.perf_counter() - t0) * 1e3)
    return samples


def synchronize(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def reset_peak_memory(device: str) -> None:
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()


def peak_memory_bytes(device: str) -> int:
    """CUDA: peak bytes held by the caching allocator since the last reset. CPU: the process's
    peak resident set size so far (Linux reports KiB), which never goes down."""
    if device == "cuda":
        return int(torch.cuda.max_memory_allocated())
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


@dataclass(frozen=True)
class Comparison:
    max_abs_err: float
    max_rel_err: float
    ok: bool
    detail: str = ""


def compare_outputs(reference: list[torch.Tensor], actual: list[torch.Tensor], precision: str) -> Comparison:
    """Compare flattened output tensors. Relative error is normalized by the largest reference
    magnitude of each tensor, so near-zero elements do not dominate."""
    if len(reference) != len(actual):
        return Comparison(
            math.inf, math.inf, False, f"{len(actual)} output tensors, eager gave {len(reference)}"
        )
    max_abs = max_rel = 0.0
    for i, (ref, out) in enumerate(zip(reference, actual, strict=False)):
        if ref.shape != out.shape:
            return Comparison(
                math.inf, math.inf, False, f"output {i}: shape {tuple(out.shape)} != {tuple(ref.shape)}"
            )
        if not ref.is_floating_point():
            if not torch.equal(ref, out):
                return Comparison(math.inf, math.inf, False, f"output {i}: integer outputs differ")
            continue
        ref64, out64 = ref.detach().double().cpu(), out.detach().double().cpu()
        ref_finite, out_finite = torch.isfinite(ref64), torch.isfinite(out64)
        if not torch.equal(ref_finite, out_finite):
            return Comparison(
                math.inf, math.inf, False, f"output {i}: inf/nan where eager has none, or vice versa"
            )
        if not ref_finite.any():
            continue
        diff = (ref64 - out64)[ref_finite].abs().max().item()
        scale = ref64[ref_finite].abs().max().item()
        max_abs = max(max_abs, diff)
        max_rel = max(max_rel, diff / max(scale, 1e-12))
    tol = TOLERANCE[precision]
    ok = max_rel <= tol
    return Comparison(
        max_abs, max_rel, ok, "" if ok else f"max relative error {max_rel:.3g} > tolerance {tol:g}"
    )
