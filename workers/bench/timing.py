"""The `timing` phase of a job process (`workers.bench`): the timed rounds.

`iterations` calls of each side (eager, the baseline if the job has one, compiled) are timed
interleaved in rounds (`compiler.measure.interleaved`; CUDA events on a GPU), rotating over the
input sets; the per-call samples become the latency columns (`workers.repeats.latency_fields`).
Then back-to-back calls of each side, and on a GPU the device busy time of each side from the
profiler. Around the rounds the process watches its host (CPU steal, clock, load, garbage
collections, a probe after each round) and, on a GPU, samples the clocks through NVML.
"""

from __future__ import annotations

import os
import statistics
from contextlib import contextmanager, nullcontext
from typing import Any

from workers.bench.record import JobRecord, error_text

PIN_TIMING_THREAD_ENV = "CO_PIN_TIMING_THREAD"

DEVICE_CALLS = 20
"""Calls of each side a GPU job profiles for its device time (after its timed rounds)."""

SLOWDOWN_ENV = "ORCHESTRATE_TEST_SLOWDOWN"
"""A test hook of the regression report: `CLASS=FACTOR[,CLASS=FACTOR...]` (e.g. `H100=1.10`)
multiplies the compiled samples of jobs on those hardware classes by FACTOR, wall and device time
alike, before the row is computed, and the row's notes say so. For checking that a known slowdown is flagged on real
hardware noise; never set it in a real sweep."""


def slowdown_hook(hardware: str) -> float:
    """The factor `ORCHESTRATE_TEST_SLOWDOWN` sets for `hardware` (1.0 when unset)."""
    for item in filter(None, os.environ.get(SLOWDOWN_ENV, "").split(",")):
        name, _, factor = item.partition("=")
        if name.strip() == hardware:
            try:
                return float(factor)
            except ValueError:
                raise ValueError(
                    f"{SLOWDOWN_ENV}={os.environ[SLOWDOWN_ENV]!r}: {factor!r} is not a number"
                ) from None
    return 1.0


def timed_rounds(run: JobRecord, model, compiled, input_sets, baseline=None) -> None:
    """Phase `timing`: eager and compiled calls interleaved in rounds (and the baseline's, if the
    job has one: then every round times eager, the baseline and the candidate in turn); then
    back-to-back calls of each side and, on a GPU, their device time. Records the latency
    columns, `*_b2b_ms`, the host's columns and, on a GPU, the clocks' summary."""
    import torch

    from compiler import host_state, measure
    from compiler.clocks import ClockSampler
    from workers.repeats import device_fields, latency_fields

    job, dev = run.job, run.job.device
    run.enter("timing")
    probes: list[float] = []
    host = _host_before()
    sampler = ClockSampler() if dev == "cuda" else nullcontext()
    sides = _timed_sides(run, model, compiled, input_sets, baseline)
    with torch.no_grad(), sampler, timing_thread_pinned():
        samples = measure.interleaved(
            sides,
            dev,
            job.measure.iterations,
            job.measure.rounds,
            after_round=lambda: probes.append(host_state.host_probe_us()),
        )
        eager_ms, compiled_ms = samples[0], samples[-1]
        factor = slowdown_hook(job.hardware)
        if factor != 1.0:
            compiled_ms = [x * factor for x in compiled_ms]
            run.notes.append(f"test hook {SLOWDOWN_ENV}: compiled samples multiplied by {factor:g}")
        n = max(1, job.measure.iterations // 2)
        eager_b2b = measure.back_to_back_ms(run.rotating(model, input_sets), n, dev)
        compiled_b2b = measure.back_to_back_ms(run.rotating(compiled, input_sets, mark_step=True), n, dev)
        device = device_times(run, model, compiled, input_sets, factor) if dev == "cuda" else None
    run.result.update(
        latency_fields([eager_ms], [compiled_ms], [samples[1]] if baseline is not None else None)
    )
    if device is not None:  # against the wall medians just computed
        wall = (run.result["eager_ms"], run.result["compiled_ms"])
        run.result.update(device_fields([device[0]], [device[1]], *wall))
    run.result.update(eager_b2b_ms=eager_b2b, compiled_b2b_ms=compiled_b2b, host_probe_us=probes)
    run.result.update(_host_fields(host))
    if isinstance(sampler, ClockSampler):
        if sampler.unavailable:
            run.notes.append(f"clocks not sampled during timing: {sampler.unavailable}")
        else:
            run.result.update(sampler.summary())


def _timed_sides(run: JobRecord, model, compiled, input_sets, baseline) -> list:
    """The rotating calls the rounds time, in turn: eager, the baseline's (if any), compiled.
    Where the baseline's precision policy differs from the job's, every side runs under its own
    policy and puts the job's back after it, so each pays the same switch."""
    job = run.job
    sides = [run.rotating(model, input_sets), run.rotating(compiled, input_sets, mark_step=True)]
    if baseline is not None:
        sides.insert(1, baseline)
        if job.baseline.dtype != job.dtype:  # every side pays the same switch, so none is favoured
            policies = [job.dtype, job.baseline.dtype, job.dtype]
            sides = [switching_precision(c, p, job.dtype) for c, p in zip(sides, policies, strict=True)]
    return sides


def _host_before() -> dict[str, Any]:
    """The host's state before the rounds: CPU steal ticks, the cores the job runs on, the load,
    their clock and the garbage collections so far."""
    from compiler import host_state

    steal = host_state.cpu_steal_ticks()
    cores = sorted(os.sched_getaffinity(0))
    return {
        "busy": host_state.HostShare(cores),
        "steal": steal,
        "cores": cores,
        "load": os.getloadavg()[0],
        "mhz": [host_state.cpu_mhz(cores)],
        "gc": host_state.gc_collections(),
    }


def _host_fields(before: dict[str, Any]) -> dict[str, Any]:
    """The host columns of the rounds since `before`: the share of CPU time stolen (where the
    kernel counts it), the share of the job's cores other processes took, the mean core clock
    before and after, the load, and the garbage collections during timing."""
    from compiler import host_state

    fields: dict[str, Any] = {}
    steal = host_state.steal_share(before["steal"], host_state.cpu_steal_ticks())
    if steal is not None:
        fields["host_steal_share"] = steal
    fields["host_other_share"] = [before["busy"].since()]
    mhz = [m for m in (*before["mhz"], host_state.cpu_mhz(before["cores"])) if m is not None]
    fields.update(
        host_cpu_mhz=[statistics.fmean(mhz) if mhz else None],
        host_load_1m=[before["load"]],
        timing_gc_collections=[host_state.gc_collections() - before["gc"]],
    )
    return fields


def device_times(run: JobRecord, model, compiled, input_sets, factor: float = 1.0):
    """Device (GPU) busy time per call of eager and of compiled, from the profiler's kernel
    records of `DEVICE_CALLS` calls each (`compiler.measure.device_busy_ms`); the slowdown
    test hook scales the compiled side as it scales the wall samples. None, with a note, where
    the profiler gives nothing (no CUPTI, or no kernel records)."""
    from compiler import measure

    calls = min(DEVICE_CALLS, max(1, run.job.measure.iterations))
    try:
        eager, comp = measure.device_busy_ms(
            [run.rotating(model, input_sets), run.rotating(compiled, input_sets, mark_step=True)],
            calls,
        )
    except Exception as exc:  # a profiler that cannot start must not fail the job
        run.notes.append(f"device time not measured: {error_text(exc)[:200]}")
        return None
    if not eager or not comp:
        run.notes.append("device time not measured: the profiler recorded no kernels")
        return None
    if factor != 1.0:
        comp = [x * factor for x in comp]
    return eager, comp


@contextmanager
def timing_thread_pinned():
    """With CO_PIN_TIMING_THREAD=1 (an experiment of benchmarks/noise.py), the thread that times
    the calls runs on one core of the job's set, so it cannot migrate while it times."""
    if os.environ.get(PIN_TIMING_THREAD_ENV) != "1":
        yield
        return
    allowed = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {min(allowed)})  # pid 0: the calling thread only
    try:
        yield
    finally:
        os.sched_setaffinity(0, allowed)


def switching_precision(call, own: str, other: str):
    """`call` run under precision policy `own` and the process put back to `other` after it (TF32
    is a process-wide matmul setting; a baseline and a candidate with different policies share
    one process)."""
    from compiler.precision import apply_precision

    def run(i):
        apply_precision(own)
        try:
            return call(i)
        finally:
            apply_precision(other)

    return run
