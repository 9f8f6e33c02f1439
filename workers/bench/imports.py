"""The `imports` phase of a job process (`workers.bench`), and its device check.

A process first loads torch and the model's code (`imports`) and checks that its device can run
the job's cell (`unsupported_here`). The compile stack (Dynamo, Inductor, the shared compile
cache) loads later, in `compile_imports`, only in a process that gets as far as compiling; its
load time counts as imports, never as compile time.
"""

from __future__ import annotations

from contextlib import suppress

from workers.bench.record import JobRecord


def imports(run: JobRecord) -> None:
    """torch and the model's code (for an hf: id transformers and its modeling module, without
    the optional packages no job uses: `workers.lean_imports`; a python: model imports neither);
    the compile stack comes in `compile_imports`. A GPU process started ahead describes its
    device after its gate (`JobRecord.pass_gate`): it touches no device before."""
    run.enter("imports")
    import torch  # noqa: F401

    from compiler import env
    from workers import external, zoo  # noqa: F401

    if run.job.model.id.startswith("hf:"):
        from workers.lean_imports import without_unused_backends

        with without_unused_backends():
            if zoo.is_known(run.job.model.id):
                zoo.model_class(run.job.model.id)

    if not (run.ahead and run.job.device == "cuda"):
        run.result.update(env.describe(run.job.device))


def uses_inductor(job) -> bool:
    """Whether the job compiles with Inductor, its candidate or its baseline: Dynamo's other
    backends (`eager`, `aot_eager`) never load Inductor's compiler (0.9 s of imports a process
    on a 2-core machine)."""
    return job.config.backend == "inductor" or (
        job.baseline is not None and job.baseline.config.backend == "inductor"
    )


def import_compile_stack(job) -> None:
    """Dynamo, and Inductor's compiler where the job uses it (`uses_inductor`)."""
    import torch._dynamo  # noqa: F401

    if uses_inductor(job):
        with suppress(ImportError):  # another torch layout: it loads at the first compile instead
            import torch._inductor.compile_fx  # noqa: F401


def compile_imports(run: JobRecord) -> None:
    """Dynamo and Inductor load lazily at the first `torch.compile` (about 3 s on a 2-core
    machine, 8 s on the H100 host): counted as imports, not as compile time, and only paid
    by a process that gets as far as compiling. The shared compile cache is installed here,
    once, before the first compile (a job's baseline compiles before its candidate)."""
    run.enter("imports")
    import_compile_stack(run.job)
    if run.job.device == "cpu" and uses_inductor(run.job):
        from compiler import isa_probe  # the machine's ISA check, not the model's compile

        with suppress(Exception):  # another torch layout: the compile runs the check itself
            isa_probe.probe()
    if run.shared_cache is None:  # before the first compile (a tune's baseline compiles first)
        from compiler.shared_cache import install

        run.shared_cache = install(run.job.hardware, on_first_serve=run.cache_served)
        run.result.update(compile_cache=run.shared_cache.mode, cache_namespace=run.shared_cache.namespace)
        run.notes.extend(run.shared_cache.notes)


def unsupported_here(run: JobRecord) -> str | None:
    """Why this device cannot run the job's cell (`compiler.capabilities`, measured from the
    device: a class the planner's table lacks is judged here), or None; what it runs without
    goes into the notes."""
    if run.job.device != "cuda":
        return None
    from compiler.capabilities import cell_support, from_device

    caps = from_device()
    reason, notes = cell_support(caps, run.job.dtype, run.job.config)
    run.notes.extend(n for n in notes if n not in run.notes)
    if reason is None:
        return None
    return f"{reason} (measured on this device: {caps.sm}, {caps.sm_count} SMs)"
