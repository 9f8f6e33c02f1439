"""The `flops` phase of a job process (`workers.bench`): FLOPs of one eager call, and the
throughput they give each side's median latency. Only the first process of a job counts them
(a repeat's row keeps the first's), and only with `measure.flops`."""

from __future__ import annotations

from workers.bench.calls import call
from workers.bench.record import JobRecord


def count_flops(run: JobRecord, model, inputs) -> None:
    """`flops` of one call of `model` on `inputs` (`compiler.measure.count_flops`), and
    `eager_tflops` and `compiled_tflops` from the medians timed; a note where the counter fails."""
    import torch

    from compiler import measure

    if not run.job.measure.flops:
        return
    run.enter("flops")
    with torch.no_grad():
        flops = measure.count_flops(lambda: call(model, inputs))
    if flops:
        run.result["flops"] = flops
        for side in ("eager", "compiled"):
            ms = run.result.get(f"{side}_ms")
            run.result[f"{side}_tflops"] = flops / (ms * 1e-3) / 1e12 if ms else None
    else:
        run.notes.append("FLOPs not counted: the flop counter failed on this model")
