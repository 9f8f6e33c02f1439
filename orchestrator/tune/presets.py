"""Presets: for each (hardware, model, batch size, dtype) the fastest config that is ok."""

from __future__ import annotations

import json
import math
from collections import defaultdict
from pathlib import Path
from typing import Any

import pyarrow as pa

from orchestrator.store.schema import read_results, results_path
from orchestrator.store.storage import Target, resolve

PRESETS_FILE = "presets.json"
PRESET_FORMAT = 2
"""2: adds `defaults` (per hardware class and dtype, for models never swept) and `stacks`."""


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


def row_stack(row: dict[str, Any]) -> dict[str, Any]:
    """The software stack a row was measured on (what a compile cache is valid for, and the driver)."""
    python = row.get("python_version")
    return {
        "torch": row.get("torch_version"),
        "triton": row.get("triton_version"),
        "cuda": row.get("cuda_version"),
        "python": ".".join(python.split(".")[:2]) if python else None,
        "driver": row.get("driver_version"),
    }


def class_defaults(rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per dtype: the config that is ok on the most cells, ties broken by the best geometric mean
    of its speedup over eager on those cells."""
    by_dtype: dict[str, dict[str, list[dict[str, Any]]]] = defaultdict(lambda: defaultdict(list))
    for r in rows:
        if r["status"] == "ok" and r["compiled_ms"] and r["eager_ms"]:
            by_dtype[r["dtype"]][r["config"]].append(r)
    defaults = {}
    for dtype, configs in sorted(by_dtype.items()):

        def score(item: tuple[str, list[dict[str, Any]]]) -> tuple[int, float]:
            _, cfg_rows = item
            geo = math.exp(sum(math.log(r["eager_ms"] / r["compiled_ms"]) for r in cfg_rows) / len(cfg_rows))
            return len({(r["model"], r["batch_size"]) for r in cfg_rows}), geo

        name, cfg_rows = max(sorted(configs.items()), key=score)
        cells, geomean = score((name, cfg_rows))
        first = cfg_rows[0]
        defaults[dtype] = {
            "dtype": dtype,
            "config": name,
            "compile": _compile_dict(first),
            "cells": cells,
            "geomean_speedup_vs_eager": geomean,
        }
    return defaults


def _compile_dict(row: dict[str, Any]) -> dict[str, Any]:
    return {
        "backend": row["backend"],
        "mode": row["mode"],
        "fullgraph": bool(row["fullgraph"]),
        "dynamic": row["dynamic"],
        "options": json.loads(row["options"] or "{}"),
        "freezing": bool(row.get("freezing")),
    }


def derive_presets(table: pa.Table) -> dict[str, Any]:
    """Best ok config per cell, with its speedup over eager and over the default config.

    Cells where no config is ok are listed under `no_preset` with every config's status, so a
    missing preset is explained rather than silently absent.
    """
    all_rows = table.to_pylist()
    groups: dict[tuple, list[dict[str, Any]]] = defaultdict(list)
    by_class: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for row in all_rows:
        groups[(row["hardware"], row["model"], row["batch_size"], row["dtype"])].append(row)
        by_class[row["hardware"]].append(row)
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
                "compile": _compile_dict(best),
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
    stacks = {
        hw: sorted({json.dumps(row_stack(r), sort_keys=True) for r in hw_rows if r["status"] == "ok"})
        for hw, hw_rows in by_class.items()
    }
    return {
        "format": PRESET_FORMAT,
        "presets": presets,
        "no_preset": missing,
        "defaults": {hw: class_defaults(hw_rows) for hw, hw_rows in sorted(by_class.items())},
        "stacks": {hw: [json.loads(s) for s in found] for hw, found in sorted(stacks.items())},
    }


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
