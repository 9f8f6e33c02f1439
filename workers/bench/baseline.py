"""A job's baseline side (`Job.baseline`), built and compiled before its candidate
(`workers.bench`).

A job with a baseline times three sides in each round: eager, the baseline config and the
candidate config. The baseline has its own model copy and precision; it compiles first, so the
candidate's compile statistics are its own. `sides` gives each compiled side a wrapper of its
own, so that Dynamo compiles each one for itself.
"""

from __future__ import annotations

import time

from workers.bench.build import build
from workers.bench.calls import call, prime
from workers.bench.imports import compile_imports
from workers.bench.record import JobRecord


def baseline_phase(run: JobRecord, input_sets):
    """Build and compile the job's baseline (its own model copy and precision), timing its
    first call as `baseline_compile_s`; return its rotating call for the timed rounds. Runs
    before the candidate compiles, so the candidate's compile statistics are its own."""
    import torch

    from compiler import capture, measure
    from compiler.precision import apply_precision
    from workers import zoo

    base = run.job.baseline
    if base.config.runtime != run.job.config.runtime:
        # a process keeps its first cuDNN plan per convolution: the second side would be
        # timed under the first side's plans, whatever its own setting says
        raise ValueError(
            f"the baseline {base.config.name!r} and {run.job.config.name!r} differ in runtime "
            f"settings ({base.config.runtime} vs {run.job.config.runtime}): such configs are "
            "compared in processes of their own, never in one"
        )
    model, base_inputs, _ = build(run, keep_fp32_copy=False, precision=base.dtype)
    prime(model, base_inputs[0])  # the eager call first, as the candidate's model had one
    compile_imports(run)
    run.enter("compile")
    capture.reset()
    base.config.apply_globals()
    side = sides()[0](base.config.prepare_model(model))
    compiled = torch.compile(side, **base.config.compile_kwargs())
    t0 = time.perf_counter()
    with torch.no_grad():
        if run.job.device == "cuda":
            torch.compiler.cudagraph_mark_step_begin()
        zoo.output_tensors(call(compiled, base_inputs[0]))
        measure.synchronize(run.job.device)
    run.result["baseline_compile_s"] = time.perf_counter() - t0
    with torch.no_grad():
        measure.warmup_until_stable(
            run.rotating(compiled, base_inputs, mark_step=True),
            run.job.device,
            run.job.measure.warmup,
        )
    apply_precision(run.job.dtype)  # the candidate's policy again, for its compile
    return run.rotating(compiled, base_inputs, mark_step=True)


def sides():
    """Two wrapper module classes for a job with a baseline, one per compiled side. Dynamo caches
    compiled code per code object and guards parameters by shape, not identity, so two copies
    of one model compiled with equal `torch.compile` arguments share their first compile (a
    global such as `freezing` is not part of the match): the candidate would run the baseline's
    code. Each wrapper's `forward` is a code object of its own, so each side compiles its own."""
    import torch

    class BaselineSide(torch.nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, *args, **kwargs):
            return self.inner(*args, **kwargs)

    class CandidateSide(torch.nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, *args, **kwargs):
            return self.inner(*args, **kwargs)

    return BaselineSide, CandidateSide
