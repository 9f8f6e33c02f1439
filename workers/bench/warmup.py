"""The warm-up phases of a job process (`workers.bench`): `eager` and `compiled_warmup`.

Each side is called, rotating over the input sets, until its latency is stable
(`compiler.measure.warmup_until_stable`), and its peak memory over the warm-up is measured. The
eager phase also keeps the eager output of input set 0: the reference the accuracy phase holds
the compiled output to.
"""

from __future__ import annotations

from workers.bench.calls import call
from workers.bench.record import JobRecord


def eager_phase(run: JobRecord, model, input_sets) -> list:
    """Phase `eager`: the reference output (the model's output tensors on input set 0, cloned),
    then eager warm-up until stable; `eager_warmup_calls` and `eager_peak_mem_bytes`."""
    import torch

    from compiler import measure
    from workers import zoo

    job, dev = run.job, run.job.device
    run.enter("eager")
    measure.reset_peak_memory(dev)
    with torch.no_grad():
        reference = [t.clone() for t in zoo.output_tensors(call(model, input_sets[0]))]
        calls = measure.warmup_until_stable(run.rotating(model, input_sets), dev, job.measure.warmup)
    run.result.update(eager_warmup_calls=calls, eager_peak_mem_bytes=measure.peak_memory_bytes(dev))
    return reference


def compiled_warmup(run: JobRecord, compiled, input_sets) -> None:
    """Phase `compiled_warmup`: the compiled side's warm-up until stable; `compiled_warmup_calls`,
    `peak_mem_bytes` and `memory_compression` (eager's peak over compiled's)."""
    import torch

    from compiler import measure

    dev = run.job.device
    run.enter("compiled_warmup")
    measure.reset_peak_memory(dev)
    with torch.no_grad():
        calls = measure.warmup_until_stable(
            run.rotating(compiled, input_sets, mark_step=True), dev, run.job.measure.warmup
        )
    peak = measure.peak_memory_bytes(dev)
    eager_peak = run.result.get("eager_peak_mem_bytes")
    run.result.update(
        compiled_warmup_calls=calls,
        peak_mem_bytes=peak,
        memory_compression=eager_peak / peak if eager_peak and peak else None,
    )
