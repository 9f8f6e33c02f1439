"""The `build` phase of a job process (`workers.bench`): the model and its input sets.

The model gets random weights (seed 0) unless the job names a checkpoint; its `INPUT_SETS`
task-correct input sets (one for a python: factory, which makes its own) are rotated call by call
in every warm-up and timed round. Both are cast to the job's device and precision; an fp32 copy
of the model stays on the host for the fp64 reference of the accuracy phase. A process started
ahead (`workers.ahead`) also imports the compile stack first (Dynamo and Inductor: seconds that
would otherwise come after its gate), builds on the host, then waits at its gate before it casts
or moves anything (`JobRecord.pass_gate`).
"""

from __future__ import annotations

import copy
import json

from workers.bench.calls import cast_inputs
from workers.bench.imports import import_compile_stack
from workers.bench.record import JobRecord

INPUT_SETS = 3


def build(run: JobRecord, keep_fp32_copy: bool = True, precision: str | None = None):
    """The model (random weights, seed 0) and its input sets, cast for `precision` (default:
    the job's), and an fp32 copy on the host for the fp64 reference if asked."""
    import torch

    from compiler import precision as policies
    from compiler import runtime
    from compiler.precision import apply_precision

    job = run.job
    if run.ahead:  # its compile's imports, while the process before it still runs
        run.enter("imports")
        import_compile_stack(job)
    run.enter("build")
    device = torch.device("cuda" if job.device == "cuda" else "cpu")
    dtype = apply_precision(precision or job.dtype)
    # before the model exists: eager and compiled run under the same settings, from the first call
    job.config.apply_runtime()
    run.result["runtime"] = json.dumps(runtime.current(), sort_keys=True)
    if precision is None or precision == job.dtype:  # what the job's own side ran under
        run.result.update(policies.current(), weights=job.model.weights)
    torch.manual_seed(0)
    model, input_sets, task = model_and_inputs(job)
    run.result["task"] = task
    model = model.eval()
    fp32_copy = copy.deepcopy(model).float() if keep_fp32_copy else None
    run.pass_gate()  # a process started ahead waits here: built on the host, the device untouched
    model = model.to(device=device, dtype=dtype)
    return model, [cast_inputs(i, device, dtype) for i in input_sets], fp32_copy


def model_and_inputs(job):
    """(model, input sets, task) as the job's model id's source makes them, on the host in
    float32: a python: factory (one input set), an external model, or a zoo entry (random weights,
    or the checkpoint the job names, from a local directory only). Input set k is drawn with
    seed k."""
    import torch

    from workers import external, zoo

    if job.model.id.startswith("python:"):
        factory = zoo.load_python_factory(job.model.id)
        model, inputs = factory(job.batch_size, job.model.input_size, dict(job.model.overrides))
        return model, [inputs], job.model.task or "other"
    if external.is_external_id(job.model.id):
        built = external.build(job.model.id, dict(job.model.overrides))
        size = job.model.input_size or built.image_size
        input_sets = [
            external.make_inputs(job.batch_size, size, torch.Generator().manual_seed(seed))
            for seed in range(INPUT_SETS)
        ]
        return built.module, input_sets, job.model.task or built.task
    entry = zoo.get_entry(job.model.id)
    if job.model.weights == "random":
        model = entry.build(dict(job.model.overrides))
    else:  # the checkpoint's own weights (in float32), from a local directory only
        model = zoo.load_pretrained(job.model.id, zoo.weights_dir(job.model.id, job.model.weights))
    size = job.model.input_size or entry.image_size
    input_sets = [
        entry.make_inputs(model, job.batch_size, size, torch.Generator().manual_seed(seed))
        for seed in range(INPUT_SETS)
    ]
    return model, input_sets, job.model.task or entry.task
