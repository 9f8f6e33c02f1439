"""Measurement primitives: warm-up, interleaved latency samples, output comparison (against eager
and against an fp64 reference), peak memory, FLOPs. Summaries and confidence intervals of the
samples are `compiler.statistics`; the host's state while they are taken, `compiler.host_state`."""

from __future__ import annotations

import bisect
import math
import resource
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from compiler.precision import SENSITIVITY_STEPS

# Accuracy tolerance on max |compiled - eager| / max |eager|, per precision policy (`compiler.precision`;
# the stock fp32 runs convolutions in TF32 on sm80+, where compiled and eager may pick other
# algorithms: TF32's tolerance).
TOLERANCE = {"fp32-strict": 1e-3, "fp32": 1e-2, "tf32": 1e-2, "bf16": 5e-2, "fp16": 1e-2}
# `tol` of torch._dynamo.utils.same (PyTorch's benchmark harness rule: allclose at tol, else the
# compiled RMSE against fp64 must be within a multiplier of eager's RMSE against fp64, + tol/10).
# fp32 1e-3 is the harness's inference tolerance for Hugging Face models (eager's own TF32 error in
# the stock policy is inside the multiplier).
RMSE_TOL = {"fp32-strict": 1e-3, "fp32": 1e-3, "tf32": 1e-2, "bf16": 1e-2, "fp16": 1e-2}
PERTURBATION = SENSITIVITY_STEPS[0]


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


def back_to_back_ms(call: Callable[[int], Any], iterations: int, device: str) -> float:
    """Mean ms per call over `iterations` calls issued back to back with one synchronize at the end.

    Per-call samples (`time_calls`) wait for each call to finish before the next is issued, so they
    include the launch latency the GPU sits idle for; this figure lets the host run ahead, as a
    serving loop does, and so measures throughput. The gap between the two is host overhead.
    """
    synchronize(device)
    if device == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for i in range(iterations):
            call(i)
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / iterations
    t0 = time.perf_counter()
    for i in range(iterations):
        call(i)
    return (time.perf_counter() - t0) * 1e3 / iterations


DEVICE_MARK = "co::device_time::"
"""Prefix of the profiler ranges `device_busy_ms` puts around each call it profiles."""


def device_busy_ms(sides: Sequence[Callable[[int], Any]], calls: int) -> list[list[float]]:
    """Time the GPU spent working during each call, ms: `calls` calls of every side (in turns, a
    synchronize before and after each), under `torch.profiler` with CUDA activities. A call's
    figure is the union of the intervals of the kernels, copies and sets that started on the
    device between its start and the next call's start (the kernels' own records from CUPTI, so
    the idle gaps a host-bound call leaves between its launches are not in it, and the
    profiler's own host overhead is not either). Returns each side's figures, a list per side;
    a side whose calls showed no device work gets an empty list. CUDA only."""
    import torch
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile, record_function

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for i in range(calls):
            for s, side in enumerate(sides):
                torch.cuda.synchronize()
                with record_function(f"{DEVICE_MARK}{s}:{i}"):
                    side(i)
                torch.cuda.synchronize()
    marks, busy = [], []
    for e in prof.events():
        if e.name.startswith(DEVICE_MARK):
            if e.device_type == DeviceType.CPU:
                marks.append((e.time_range.start, int(e.name[len(DEVICE_MARK) :].split(":")[0])))
        elif e.device_type == DeviceType.CUDA and not getattr(e, "is_user_annotation", False):
            busy.append((e.time_range.start, e.time_range.end))
    return split_busy(marks, busy, len(sides))


def split_busy(
    marks: Sequence[tuple[float, int]], busy: Sequence[tuple[float, float]], sides: int
) -> list[list[float]]:
    """`device_busy_ms`'s bookkeeping, apart from the profiler: `marks` are (start us, side) of
    each profiled call, `busy` the (start us, end us) of every device activity. Each activity
    belongs to the last call that started before it; a call's figure is the length of the union
    of its activities (overlapping streams count once), ms. Calls with no activity are left out."""
    order = sorted(marks)
    starts = [t for t, _ in order]
    per_call: list[list[tuple[float, float]]] = [[] for _ in order]
    for a, b in busy:
        i = bisect.bisect_right(starts, a) - 1
        if i >= 0 and b > a:
            per_call[i].append((a, b))
    out: list[list[float]] = [[] for _ in range(sides)]
    for (_, side), spans in zip(order, per_call, strict=True):
        if spans:
            out[side].append(_union_us(spans) / 1e3)
    return out


def _union_us(spans: list[tuple[float, float]]) -> float:
    total, end = 0.0, -math.inf
    for a, b in sorted(spans):
        if a > end:
            total += b - a
            end = b
        elif b > end:
            total += b - end
            end = b
    return total


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
    magnitude of each tensor, so near-zero elements do not dominate. Computed in float64 where the
    tensors are (`_float_errors`), not on the host."""
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
            if not torch.equal(ref, out.to(ref.device)):
                return Comparison(math.inf, math.inf, False, f"output {i}: integer outputs differ")
            continue
        errors = _float_errors(ref.detach(), out.detach())
        if errors is None:
            return Comparison(
                math.inf, math.inf, False, f"output {i}: inf/nan where eager has none, or vice versa"
            )
        if not errors:  # no finite element
            continue
        diff, scale = errors
        max_abs = max(max_abs, diff)
        max_rel = max(max_rel, diff / max(scale, 1e-12))
    tol = TOLERANCE[precision]
    ok = max_rel <= tol
    return Comparison(
        max_abs, max_rel, ok, "" if ok else f"max relative error {max_rel:.3g} > tolerance {tol:g}"
    )


COMPARE_CHUNK = 1 << 22
"""Elements `_float_errors` takes at a time: 32 MiB of float64 per operand, however large the
output (a segmentation map of 32 rows is 80 M elements)."""


def _float_errors(ref: torch.Tensor, out: torch.Tensor) -> tuple[float, float] | tuple[()] | None:
    """(max |ref - out|, max |ref|) over `ref`'s finite elements, in float64; () where it has none;
    None where `out` is finite elsewhere than `ref`. On the GPU where either tensor is on one (a
    CUDA output is not copied to the host), a chunk of `COMPARE_CHUNK` elements at a time, with one
    synchronization at the end."""
    device = ref.device if ref.device.type != "cpu" else out.device
    r, o = ref.reshape(-1), out.reshape(-1)
    mismatch, any_finite, diffs, scales = [], [], [], []
    for start in range(0, r.numel(), COMPARE_CHUNK):
        rc = r[start : start + COMPARE_CHUNK].to(device, torch.float64)
        oc = o[start : start + COMPARE_CHUNK].to(device, torch.float64)
        finite = torch.isfinite(rc)
        mismatch.append((finite != torch.isfinite(oc)).any())
        any_finite.append(finite.any())
        zero = rc.new_zeros(())
        diffs.append(torch.where(finite, (rc - oc).abs(), zero).max())
        scales.append(torch.where(finite, rc.abs(), zero).max())
    if not diffs:
        return ()
    if bool(torch.stack(mismatch).any()):
        return None
    if not bool(torch.stack(any_finite).any()):
        return ()
    return torch.stack(diffs).max().item(), torch.stack(scales).max().item()


def rel_err_against(reference: list[torch.Tensor], actual: list[torch.Tensor]) -> float:
    """max |actual - reference| / max |reference| over the float tensors (the measure of
    `compare_outputs`), inf where they do not compare (count, shape, non-finite mismatch)."""
    cmp = compare_outputs(reference, actual, "bf16")
    return cmp.max_rel_err


def output_spread(outputs: list[torch.Tensor]) -> float | None:
    """How much the outputs vary: the smallest over floating-point tensors of
    (max - min) / max |x| over their finite elements (None: no such tensor). Near 0, the tensor is
    nearly constant, and a relative error normalized by its magnitude cannot show what a
    precision loses."""
    found = []
    for t in outputs:
        if not t.is_floating_point() or t.numel() < 2:
            continue
        x = t.detach().double()
        x = x[torch.isfinite(x)]
        if x.numel() < 2:
            continue
        scale = x.abs().max().item()
        found.append((x.max() - x.min()).item() / scale if scale > 0 else 0.0)
    return min(found) if found else None


def perturbed(inputs: Any, generator: torch.Generator, size: float = PERTURBATION) -> tuple[Any, bool]:
    """`inputs` (a dict, a tuple or a tensor) with every floating-point tensor multiplied
    elementwise by 1 +- `size` (random signs from `generator`), and whether any was."""
    changed = False

    def one(value: Any) -> Any:
        nonlocal changed
        if isinstance(value, torch.Tensor) and value.is_floating_point():
            changed = True
            signs = (
                torch.randint(0, 2, value.shape, generator=generator).to(value.device, value.dtype) * 2 - 1
            )
            return value * (1 + size * signs)
        return value

    if isinstance(inputs, dict):
        return {k: one(v) for k, v in inputs.items()}, changed
    if isinstance(inputs, (tuple, list)):
        return type(inputs)(one(v) for v in inputs), changed
    return one(inputs), changed


def sensitivity(
    outputs: list[torch.Tensor], outputs_perturbed: list[torch.Tensor], size: float = PERTURBATION
) -> float:
    """How much a relative change of the inputs grows in the outputs: the relative change of the
    outputs (`rel_err_against`) over `size`, the relative change `perturbed` made. About 1 for a
    well-conditioned model; far above it, the rounding of any precision is amplified as much."""
    return rel_err_against(outputs, outputs_perturbed) / size


def warmup_until_stable(
    call: Callable[[int], Any],
    device: str,
    min_calls: int,
    max_calls: int = 200,
    window: int = 5,
    rel_tol: float = 0.02,
    max_s: float = 60.0,
) -> int:
    """Call `call(i)` at least `min_calls` times, then until the median of the last `window`
    timings is within `rel_tol` of the window before it (or `max_calls` / `max_s` is reached).
    Returns the number of warm-up calls made."""
    samples: list[float] = []
    start = time.perf_counter()
    i = 0
    while i < max_calls:
        samples += time_calls(lambda j=i: call(j), 1, device)
        i += 1
        if i < min_calls:
            continue
        if time.perf_counter() - start > max_s:
            break
        if i >= 2 * window and _settled(samples[-2 * window : -window], samples[-window:], rel_tol):
            break
    return i


def _settled(before: list[float], last: list[float], rel_tol: float) -> bool:
    """Two consecutive windows at the same level, with no level change inside either: their
    medians agree within `rel_tol`, and each window's mean is within 5 x `rel_tol` of its median
    (a window straddling a drop, such as 20 20 20 1 1, has its mean far from its median)."""
    m_before, m_last = statistics.median(before), statistics.median(last)
    if abs(m_last - m_before) > rel_tol * m_before:
        return False
    return all(
        abs(statistics.fmean(w) - m) <= 5 * rel_tol * m for w, m in ((before, m_before), (last, m_last))
    )


def interleaved_samples(
    eager: Callable[[int], Any],
    compiled: Callable[[int], Any],
    device: str,
    iterations: int,
    rounds: int = 10,
    after_round: Callable[[], Any] | None = None,
) -> tuple[list[float], list[float]]:
    """`iterations` timed calls of each, in `rounds` alternating blocks within one process, so
    slow drifts (clocks, thermals, other tenants) hit both sides alike. Each call gets its
    index, so callers can rotate inputs. `after_round` runs after each round, untimed."""
    eager_ms, compiled_ms = interleaved([eager, compiled], device, iterations, rounds, after_round)
    return eager_ms, compiled_ms


def interleaved(
    sides: Sequence[Callable[[int], Any]],
    device: str,
    iterations: int,
    rounds: int = 10,
    after_round: Callable[[], Any] | None = None,
) -> list[list[float]]:
    """`interleaved_samples` for any number of sides: each round times a block of every side in
    turn; returns each side's samples, ms."""
    rounds = max(1, min(rounds, iterations))
    samples: list[list[float]] = [[] for _ in sides]
    done = 0
    for r in range(rounds):
        n = iterations * (r + 1) // rounds - done
        for side, out in zip(sides, samples, strict=True):
            out += _indexed_times(side, done, n, device)
        done += n
        if after_round is not None:
            after_round()
    return samples


def _indexed_times(call: Callable[[int], Any], offset: int, n: int, device: str) -> list[float]:
    counter = iter(range(offset, offset + n))
    return time_calls(lambda: call(next(counter)), n, device)


@dataclass(frozen=True)
class Fp64Check:
    ok: bool
    rmse_eager: float
    """max over outputs of RMSE(eager, fp64 reference)."""
    rmse_compiled: float
    """max over outputs of RMSE(compiled, fp64 reference)."""
    detail: str = ""


def check_against_fp64(
    eager: list[torch.Tensor], compiled: list[torch.Tensor], fp64: list[torch.Tensor], precision: str
) -> Fp64Check:
    """PyTorch's harness accuracy rule (`torch._dynamo.utils.same` with an fp64 reference, through
    `compiler.torch_private.harness_same`), per output tensor, so a failure names the output.
    Raises `compiler.torch_private.TorchPrivateError` where this torch does not offer the rule as
    checked: an accuracy check that cannot run is the job's error (`workers.bench` ends it
    `runtime_error` with that message), not a verdict on its outputs."""
    from compiler import torch_private

    same = torch_private.harness_same()
    if not (len(eager) == len(compiled) == len(fp64)):
        return Fp64Check(False, math.nan, math.nan, "output counts differ between eager, compiled and fp64")
    tol = RMSE_TOL[precision]
    worst_eager = worst_compiled = 0.0
    for i, (ref, res, ref64) in enumerate(zip(eager, compiled, fp64, strict=True)):
        if not ref.is_floating_point():
            if not torch.equal(ref.cpu(), res.cpu()):
                return Fp64Check(False, math.nan, math.nan, f"output {i}: integer outputs differ")
            continue
        if not (ref.shape == res.shape == ref64.shape):
            return Fp64Check(
                False,
                math.nan,
                math.nan,
                f"output {i}: compiled shape {tuple(res.shape)}, eager {tuple(ref.shape)}, fp64 {tuple(ref64.shape)}",
            )
        ref64 = ref64.detach().double().to(res.device)
        worst_eager = max(worst_eager, _rmse(ref64, ref))
        worst_compiled = max(worst_compiled, _rmse(ref64, res))
        if not same(
            ref, res, fp64_ref=ref64, tol=tol, equal_nan=True, exact_dtype=False, log_error=lambda *a: None
        ):
            return Fp64Check(
                False,
                worst_eager,
                worst_compiled,
                f"output {i} {tuple(res.shape)}: compiled RMSE vs fp64 {_rmse(ref64, res):.3g} against eager's "
                f"{_rmse(ref64, ref):.3g} fails the harness rule at tol {tol:g}",
            )
    return Fp64Check(True, worst_eager, worst_compiled)


def _rmse(ref64: torch.Tensor, x: torch.Tensor) -> float:
    x = x.detach().double()
    finite = torch.isfinite(ref64) & torch.isfinite(x)
    if not finite.any():
        return 0.0
    return float(torch.sqrt(torch.mean((ref64[finite] - x[finite]) ** 2)).item())


def count_flops(call: Callable[[], Any]) -> int | None:
    """FLOPs of one call, counted by torch.utils.flop_counter (matmuls and convolutions)."""
    try:
        from torch.utils.flop_counter import FlopCounterMode

        with FlopCounterMode(display=False) as counter:
            call()
        return int(counter.get_total_flops())
    except Exception:  # an op the counter cannot follow: report no figure rather than a wrong one
        return None
