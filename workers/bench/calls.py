"""How a job process calls a model (`workers.bench`): with positional or keyword inputs, on
inputs cast to the job's device and dtype, and in rotation over the job's input sets.

Every warm-up and timed round calls a side through `rotating`: call i runs input set i % n, so
that caches flatter neither side; a compiled side on a GPU marks a CUDA-graph step before each
call (a CUDA graph's outputs live until the next step).
"""

from __future__ import annotations


def call(fn, inputs):
    """`fn` on one input set: keyword inputs (a dict) or positional ones (a tuple)."""
    return fn(**inputs) if isinstance(inputs, dict) else fn(*inputs)


def cast_inputs(inputs, device, dtype):
    """The input set on `device`, its floating-point tensors cast to `dtype` (integer inputs,
    token ids for one, keep their dtype)."""
    import torch

    def place(t):
        if isinstance(t, torch.Tensor):
            return t.to(device=device, dtype=dtype if t.is_floating_point() else t.dtype)
        return t

    return {k: place(v) for k, v in inputs.items()} if isinstance(inputs, dict) else tuple(map(place, inputs))


def rotating(fn, input_sets, device: str, mark_step: bool = False):
    """The call `i -> fn(input set i % n)` that warm-ups and timed rounds make; with `mark_step`
    on a `cuda` job, each call first marks a CUDA-graph step (for a compiled side)."""
    import torch

    n = len(input_sets)
    if mark_step and device == "cuda":

        def step(i):
            torch.compiler.cudagraph_mark_step_begin()  # CUDA-graph outputs live until the next step
            return call(fn, input_sets[i % n])

        return step
    return lambda i: call(fn, input_sets[i % n])


def prime(model, inputs) -> None:
    """One eager call, without gradients, before a model is compiled, as a measured job makes it
    (its eager phase runs first). Some models change on their first call (SegFormer traces two
    graphs before it and one after): without this call, a compile that should match the
    measured job's (a warm compile, a bundle, a baseline) traces other graphs."""
    import torch

    with torch.no_grad():
        call(model, inputs)
