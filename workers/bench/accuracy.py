"""The `accuracy` phase of a job process (`workers.bench`).

The compiled output of input set 0 is compared with eager's (`max_abs_err`, `max_rel_err`) and
judged against an fp64 reference by the rule of PyTorch's benchmark harness
(`compiler.measure.check_against_fp64`): the fp64 reference is the host's fp32 copy of the
model, run in float64 on the job's device. Where no fp64 reference can be had (memory, an op
without fp64), the compiled output is judged against eager only, and the notes say so. The first
process of a job also records what the fp64 outputs show of the model's own conditioning.
"""

from __future__ import annotations

from workers.bench.calls import call, cast_inputs
from workers.bench.record import JobRecord, error_text, is_oom


def check_accuracy(run: JobRecord, reference, compiled_out, fp32_copy, inputs) -> None:
    """Phase `accuracy`: the job's status, `ok` or `accuracy_fail`, from the compiled output
    `compiled_out` against the eager `reference` and the fp64 reference of `inputs`."""
    from compiler import measure

    job = run.job
    run.enter("accuracy")
    cmp = measure.compare_outputs(reference, compiled_out, job.dtype)
    run.result.update(max_abs_err=cmp.max_abs_err, max_rel_err=cmp.max_rel_err)
    try:
        fp64 = _fp64_reference(run, fp32_copy, inputs)
    except Exception as exc:  # no fp64 reference (memory, an op without fp64): fall back to eager
        why = "out of memory" if is_oom(exc) else error_text(exc)[:200]
        run.notes.append(f"no fp64 reference ({why}): accuracy judged against eager only")
        _judge(run, cmp.ok, cmp.detail)
        return
    check = measure.check_against_fp64(reference, compiled_out, fp64, job.dtype)
    run.result.update(
        rmse_eager=check.rmse_eager,
        rmse_compiled=check.rmse_compiled,
        fp64_max_rel_err=measure.rel_err_against(fp64, compiled_out),
        eager_fp64_max_rel_err=measure.rel_err_against(fp64, reference),
    )
    _judge(run, check.ok, check.detail)


def _judge(run: JobRecord, ok: bool, detail: str) -> None:
    """Status `ok`, or `accuracy_fail` with the check's `detail` as the error."""
    if ok:
        run.result["status"] = "ok"
    else:
        run.fail("accuracy_fail", detail)


def _fp64_reference(run: JobRecord, fp32_copy, inputs) -> list:
    """The fp64 output tensors of the model's fp32 copy on `inputs`, both in float64 on the job's
    device; in the first process, also the model's conditioning (`conditioning`)."""
    import torch

    from workers import zoo

    device = "cuda" if run.job.device == "cuda" else "cpu"
    fp64_model = fp32_copy.to(device=device, dtype=torch.float64)
    inputs64 = cast_inputs(inputs, device, torch.float64)
    with torch.no_grad():
        fp64 = [t.double() for t in zoo.output_tensors(call(fp64_model, inputs64))]
        if "repeat" not in run.result:  # the model's own conditioning: the first process's
            conditioning(run, fp64_model, inputs64, fp64)
    del fp64_model
    return fp64


def conditioning(run: JobRecord, fp64_model, inputs64, fp64) -> None:
    """What the fp64 outputs can show of a precision's error (`compiler.accuracy` judges it):
    their spread, and their sensitivity to a relative change of the float inputs, from one
    more fp64 call (none where the model takes no float input)."""
    import torch

    from compiler import measure
    from workers import zoo

    run.result["output_spread"] = measure.output_spread(fp64)
    found = []
    for step in measure.SENSITIVITY_STEPS:
        moved, changed = measure.perturbed(inputs64, torch.Generator().manual_seed(1), step)
        if not changed:
            return
        again = [t.double() for t in zoo.output_tensors(call(fp64_model, moved))]
        found.append(measure.sensitivity(fp64, again, step))
    run.result["output_sensitivity"] = found
