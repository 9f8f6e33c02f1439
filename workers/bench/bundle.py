"""The phases of `python -m workers.bench --bundle FILE [--package FILE]`, after its cold
compile: `bundle` writes the compile caches the compile filled
(`torch.compiler.save_cache_artifacts()`: Inductor's FX graphs, AOTAutograd, autotuning) for
`orchestrate export`, and `package` builds the config as an AOTInductor package
(`compiler.aoti`; a package that fails leaves `package_error`, the bundle stands).
"""

from __future__ import annotations

import copy
from pathlib import Path

from compiler import durable
from workers.bench.record import JobRecord, error_line


def write_bundle(run: JobRecord, bundle: Path) -> bool:
    """Phase `bundle`: the compile caches to `bundle`, with `bundle_bytes` and
    `bundle_artifacts` (status `ok`); False, the job failed `compile_error` with the reason, where
    the compile left nothing in the caches."""
    import torch

    run.enter("bundle")
    artifacts = torch.compiler.save_cache_artifacts()
    if artifacts is None:
        run.fail("compile_error", _why_no_artifacts(run))
        return False
    data, info = artifacts
    durable.write_bytes(bundle, data)
    run.result.update(
        status="ok",
        bundle_bytes=len(data),
        bundle_artifacts={k: len(v) for k, v in info.artifacts.items()},
    )
    return True


def _why_no_artifacts(run: JobRecord) -> str:
    from compiler.capture import fxgraph_cache_counts

    why = "the compile left nothing in the caches to bundle"
    if fxgraph_cache_counts()["fxgraph_cache_misses"]:
        why += " (Inductor bypassed its FX-graph cache"
        if run.job.config.freezing and run.job.device == "cpu":
            why += ": freezing on CPU packs the weights as oneDNN tensors, which it cannot pickle"
        why += "); the preset is exported without a bundle and compiles cold where it is applied"
    return why


def build_package(run: JobRecord, model, inputs, package: Path) -> None:
    """Phase `package`: the job's config built as an AOTInductor package at `package` (its
    columns from `compiler.aoti.build_package`), or `package_error` saying why not."""
    from compiler import aoti

    run.enter("package")
    cfg = run.job.config
    why = aoti.packageable(cfg)
    if why:
        run.result["package_error"] = f"not packaged: {why}"
        return
    try:  # the compiled model may hold the module: export a copy laid out as the config says
        info = aoti.build_package(cfg.prepare_model(copy.deepcopy(model)), inputs, cfg, package)
    except Exception as exc:
        run.result["package_error"] = error_line(exc, 500)
        return
    run.result.update(info)
