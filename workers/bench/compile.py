"""The `compile` phase of a job process (`workers.bench`).

The first compiled call's wall time is `compile_s` (with Dynamo's and Inductor's breakdown from
`compiler.capture`); the compiled output of input set 0 is kept for the accuracy phase. The row
says whether the compile was served by the shared compile cache (then `compile_s` is not a cold
compile), which kernels autotuning chose, and which Triton kernels the compile made. Each
autotuned op's kernel choices are also appended to `choices_stream` as they are timed, so a
compile killed mid-autotune leaves them for the runner.
"""

from __future__ import annotations

import copy
import os
import time
from pathlib import Path

from workers.bench.baseline import sides
from workers.bench.calls import call
from workers.bench.imports import compile_imports
from workers.bench.record import JobRecord

STALL_ENV = "ORCHESTRATE_TEST_STALL_AFTER_OPS"
"""A test hook of kernel-choice streaming: `N` makes the job process sleep for good, inside its
compile, once N ops have been autotuned and their rows written to the choices stream, so that
the job's real timeout lands mid-autotune after exactly N ops (a timing-independent way to test
what a timed-out job keeps). The result's notes say so. Never set it in a real sweep."""


def choices_stream(result_path: Path) -> Path:
    """The JSON-lines file beside a process's RESULT.json where its compile appends each
    autotuned op's kernel-choice rows as they are timed (`compiler.kernels.KernelChoiceRecorder`);
    the runner reads it when the process ends without them in its result."""
    return result_path.with_name(f"{result_path.stem}.kernel_choices.jsonl")


def compile_phase(run: JobRecord, model, inputs):
    """Phase `compile`: compile the job's config and time its first call on `inputs` as
    `compile_s`; return the compiled model and that call's output tensors (cloned)."""
    import torch

    from compiler import capture, measure
    from compiler.kernels import KernelChoiceRecorder, autotuner_ids
    from workers import zoo

    dev = run.job.device
    compile_imports(run)
    run.enter("compile")  # also saves the eager numbers, should the compile never return
    capture.reset(dynamo=run.job.baseline is None)  # the baseline, compiled already, stays
    run.shared_cache.start_counting()
    cfg = run.job.config
    cfg.apply_globals()
    earlier = autotuner_ids() if run.job.baseline is not None else set()  # the baseline's kernels
    if cfg.channels_last:  # a copy: eager keeps timing the model as built
        model = cfg.prepare_model(copy.deepcopy(model))
    if run.job.baseline is not None:
        model = sides()[1](model)
    compiled = torch.compile(model, **cfg.compile_kwargs())
    # Each op's candidates also go to a file as they are timed: a compile killed by the
    # timeout mid-autotune (minutes of it, for a big model on a GPU) still leaves them.
    recorder = KernelChoiceRecorder(stream=choices_stream(run.result_path), after_op=_stall_hook(run))
    t0 = time.perf_counter()
    with torch.no_grad(), recorder as choices:
        if dev == "cuda":
            torch.compiler.cudagraph_mark_step_begin()
        out = [t.clone() for t in zoo.output_tensors(call(compiled, inputs))]
        measure.synchronize(dev)
    run.result["compile_s"] = time.perf_counter() - t0
    _record_capture(run, capture.capture_stats())
    record_cache_use(run)
    _record_kernels(run, choices, earlier)
    return compiled, out


def _record_capture(run: JobRecord, stats) -> None:
    """The compile's capture statistics (`compiler.capture.CaptureStats`); where this torch does
    not offer their sources as checked, those fields are null and the notes say why, once."""
    run.result.update(stats.to_dict())
    run.notes.extend(
        note
        for note in (f"no capture statistics recorded: {why}" for why in stats.unavailable)
        if note not in run.notes
    )


def _record_kernels(run: JobRecord, choices, earlier: set) -> None:
    """The compile's kernel choices (`kernel_choices`, `autotuned_ops`: only a compile that
    autotuned has them; a warm one hits the FX-graph cache) and the Triton kernels it made, less
    the baseline's (`earlier`) (`triton_kernels`: the cold process's only, as kernel choices).
    What this torch does not offer as checked (`compiler.torch_private`) is left out, and the
    notes say why."""
    from compiler.kernels import triton_kernel_rows
    from compiler.torch_private import TorchPrivateError

    if choices.rows:
        run.result["kernel_choices"] = choices.rows
    if choices.ops:
        run.result["autotuned_ops"] = choices.ops
    if choices.stream_error:
        run.notes.append(f"kernel choices not streamed to disk ({choices.stream_error})")
    if choices.unavailable:
        run.notes.append(f"no kernel choices recorded: {choices.unavailable}")
    if choices.emitted_unavailable:
        run.notes.append(f"kernel choices recorded without `emitted`: {choices.emitted_unavailable}")
    try:
        kernels = triton_kernel_rows(exclude=earlier)  # settled by the first run, just made
    except TorchPrivateError as exc:  # Triton kernel rows are not worth the job
        run.notes.append(f"no Triton kernel rows recorded: {exc}")
        return
    if kernels and "repeat" not in run.result:
        run.result["triton_kernels"] = kernels


def _stall_hook(run: JobRecord):
    """The recorder's `after_op` for `STALL_ENV` (None when it is unset)."""
    value = os.environ.get(STALL_ENV)
    if not value:
        return None
    if not value.isdigit() or int(value) < 1:
        raise ValueError(f"{STALL_ENV}={value!r}: expected a number of ops >= 1")
    limit = int(value)

    def stall(ops: int) -> None:
        if ops < limit:
            return
        run.notes.append(f"test hook {STALL_ENV}: stalled the compile after {ops} autotuned ops")
        run.save()
        while True:  # until the runner's timeout kills the process
            time.sleep(60)

    return stall


def record_cache_use(run: JobRecord) -> None:
    """Whether and how the compile just timed used the shared cache: `compile_s` of a compile
    served from it is not a cold compile, and the row must say so."""
    from compiler.capture import fxgraph_cache_counts

    fx = fxgraph_cache_counts()
    cache = run.shared_cache.columns()
    cache.update(fx_cache_hits=fx["fxgraph_cache_hits"], fx_cache_misses=fx["fxgraph_cache_misses"])
    # A fresh process starts with empty local caches, so with the shared cache on, every hit
    # was served by it; with it off, nothing could be.
    hits = ("fx_cache_hits", "autotune_cache_hits", "gemm_cache_hits")
    cache["compile_from_cache"] = cache["compile_cache"] == "shared" and any(cache.get(k) for k in hits)
    run.result.update(cache)
    run.notes.extend(n for n in run.shared_cache.notes if n not in run.notes)
