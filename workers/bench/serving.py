"""The phase `serving` of `python -m workers.bench --bundle FILE --serving PROFILE`: an export's
preset made ready for the traffic it serves (`compiler.serving.traffic`).

After the preset's cold compile at its batch size, the padding check runs on the eager model
(`compiler.serving.padding`, the preset precision's tolerance) and decides the plan: buckets
(the default ladder up to the range's max) where padding leaves the real rows' outputs as they
were, else one dynamic-batch graph. The plan is then prepared as `compile_tuned` prepares it
(`compiler.serving.served`): every bucket compiled in this process, so the bundle written next
holds every graph the serving process will ask for. The result's `serving` is what serving.json
records for the preset: the profile, the plan, its buckets, the padding check, and what preparing
cost here (`prepare_s`, the Dynamo graphs compiled).
"""

from __future__ import annotations

from typing import Any

from workers.bench.record import JobRecord


def prepare_serving(run: JobRecord, model: Any, inputs: Any, profile_data: dict[str, Any]) -> None:
    """Phase `serving`: decide and prepare the plan for `profile_data` (a `ServingProfile`'s dict)
    on `model` (eager, as built) with the cell's `inputs`; its record in `run.result["serving"]`."""
    import torch

    from compiler.aoti import package_options, split_inputs
    from compiler.serving.padding import check_padding, padding_pairs, padding_tolerance
    from compiler.serving.served import ServedModel
    from compiler.serving.traffic import ServingProfile, default_buckets

    run.enter("serving")
    cfg = run.job.config
    profile = ServingProfile.from_dict(profile_data)
    example = split_inputs(inputs)
    buckets = default_buckets(profile.min, profile.max)
    check = check_padding(
        model, *example, padding_pairs(buckets, profile.min), padding_tolerance(run.job.dtype)
    )
    plan = "buckets" if check.ok else "dynamic"
    kwargs = cfg.compile_kwargs()
    prepared = cfg.prepare_model(model) if cfg.channels_last else model
    served = ServedModel(
        lambda dynamic: torch.compile(prepared, **{**kwargs, "dynamic": dynamic}),
        profile,
        plan,
        buckets,
        example,
        cudagraphs=run.job.device == "cuda" and package_options(cfg)[1],
        rows_independent=check.ok,
    )
    prep = served.prepare()
    run.result["serving"] = {
        "profile": profile.to_dict(),
        "plan": plan,
        "buckets": served.buckets,
        "padding": check.to_dict(),
        "export_prepare_s": prep.prepare_s,
        "export_prepare_graphs": prep.graphs,
        "export_memory_bytes": prep.memory_bytes,
    }
