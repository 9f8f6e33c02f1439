"""Presets: for each (hardware, model, batch size, dtype) the fastest config that is ok."""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from typing import Any

import pyarrow as pa

from orchestrator.schema import read_results, results_path
from orchestrator.storage import Target, resolve

PRESETS_FILE = "presets.json"
PRESET_FORMAT = 1


def _is_default(row: dict[str, Any]) -> bool:
    """The plain `torch.compile(model)` config: inductor, no mode (or 'default'), no options."""
    return (
        row["backend"] == "inductor"
        and row["mode"] in (None, "default")
        and json.loads(row["options"] or "{}") == {}
        and not row["fullgraph"]
        and row["dynamic"] is None
        and not row.get("freezing")
    )


def derive_presets(table: pa.Table) -> dict[str, Any]:
    """Best ok config per cell, with its speedup over eager and over the default config.

    Cells where no config is ok are listed under `no_preset` with every config's status, so a
    missing preset is explained rather than silently absent.
    """
    groups: dict[tuple, list[dict[str, Any]]] = defaultdict(list)
    for row in table.to_pylist():
        groups[(row["hardware"], row["model"], row["batch_size"], row["dtype"])].append(row)
    presets, missing = [], []
    for (hardware, model, bs, dtype), rows in sorted(groups.items(), key=lambda kv: tuple(map(str, kv[0]))):
        cell = {"hardware": hardware, "model": model, "batch_size": bs, "dtype": dtype}
        ok = [r for r in rows if r["status"] == "ok" and r["compiled_ms"]]
        if not ok:
            missing.append({**cell, "statuses": {r["config"]: r["status"] for r in rows}})
            continue
        best = min(ok, key=lambda r: r["compiled_ms"])
        default = next((r for r in ok if _is_default(r)), None)
        presets.append(
            {
                **cell,
                "model_id": best["model_id"],
                "config": best["config"],
                "compile": {
                    "backend": best["backend"],
                    "mode": best["mode"],
                    "fullgraph": best["fullgraph"],
                    "dynamic": best["dynamic"],
                    "options": json.loads(best["options"] or "{}"),
                    "freezing": bool(best.get("freezing")),
                },
                "compiled_ms": best["compiled_ms"],
                "eager_ms": best["eager_ms"],
                "speedup_vs_eager": best["eager_ms"] / best["compiled_ms"] if best["eager_ms"] else None,
                "speedup_vs_default": default["compiled_ms"] / best["compiled_ms"] if default else None,
                "default_config": default["config"] if default else None,
                "compile_s": best["compile_s"],
                "candidates": len(ok),
                "job_id": best["job_id"],
                "device_name": best["device_name"],
                "torch_version": best["torch_version"],
            }
        )
    return {"format": PRESET_FORMAT, "presets": presets, "no_preset": missing}


def write_presets(out_dir: Target) -> tuple[Path | str, dict[str, Any]]:
    """Write `<out>/presets.json` (a path or a URI) whole; return where (a Path or the URI) and what."""
    out = resolve(out_dir)
    table = read_results(out)
    if table.num_rows == 0:
        raise FileNotFoundError(f"no result rows under {results_path(out)}; run `orchestrate sweep` first")
    data = derive_presets(table)
    path = out.join(PRESETS_FILE)
    path.write_text(json.dumps(data, indent=2, default=str))
    return path.target, data
