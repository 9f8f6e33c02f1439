"""Presets: for each (hardware class, model, batch size, precision) the fastest config that
passed its accuracy check within the optional compile-time and memory limits, a per-class
default for models never swept, and where they are written (`presets.parquet`, the `presets`
table of `store.schema`, and `presets.json`, keyed by hardware class and software
stack). `orchestrate presets` derives them from a sweep; `orchestrate tune` from its search."""

from __future__ import annotations

import json
import math
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from analysis.stock import stock_user, versus
from compiler import accuracy as acc
from compiler import durable, runtime
from compiler import statistics as cstats
from compiler.accuracy import AccuracyBudget
from orchestrator.tune import eager
from orchestrator.tune.effects import setting_effects, what_won
from store.layout import PRESETS_FILE, PRESETS_TABLE_FILE
from store.schema import PRESETS_SCHEMA, read_results, results_path
from store.storage import Location, Target, resolve

PRESET_FORMAT = 5
"""2: adds `defaults` (per hardware class and dtype, for models never swept) and `stacks`.
3: adds `classes` (hardware class -> software stack -> its presets and defaults), the budgets,
and per entry its precision, source and decision.
4: an entry may be an eager preset (`config: eager`, `compile: null`, its runtime settings in
`runtime`, the compiled config it beat in `eager_over_*` and `eager_gain*`: `orchestrator.tune.eager`);
entries of the tuner say where `speedup_vs_stock` comes from (`speedup_vs_stock_from`). Readers
of format 3 read on: its entries all compile.
5: `fp32` is the stock policy (torch's float32 defaults; `fp32-strict` what 4 called fp32); entries
of the tuner carry their accuracy `budget` and its judgement (`accuracy_*`, `weights`,
`max_rel_err`) and their speedup over a stock PyTorch user (`stock_*`, `vs_stock_*`), a cell having
one entry per budget."""


@dataclass(frozen=True)
class Limits:
    """Per-candidate limits: a config over either is never a preset, however fast."""

    max_compile_s: float | None = None
    """Cold compile time (the first compiled call), s."""
    max_memory_mb: float | None = None
    """Peak memory of the compiled phase (CUDA allocator, or process RSS on CPU), MiB."""

    def excess(self, row: dict[str, Any]) -> str | None:
        """Why `row` is over budget, or None when it is within (a figure not measured is over)."""
        if self.max_compile_s is not None:
            compile_s = row.get("compile_s")
            if compile_s is None or compile_s > self.max_compile_s:
                return f"compile {_fmt(compile_s, 's')} over the {self.max_compile_s:g} s budget"
        if self.max_memory_mb is not None:
            peak = row.get("peak_mem_bytes")
            if peak is None or peak / 2**20 > self.max_memory_mb:
                mib = None if peak is None else peak / 2**20
                return f"peak memory {_fmt(mib, 'MiB')} over the {self.max_memory_mb:g} MiB budget"
        return None

    def to_dict(self) -> dict[str, float | None]:
        return {"max_compile_s": self.max_compile_s, "max_memory_mb": self.max_memory_mb}


def _fmt(value: float | None, unit: str) -> str:
    return "not measured" if value is None else f"{value:.1f} {unit}"


def eligible(row: dict[str, Any], limits: Limits) -> bool:
    """Ok (its accuracy check against the fp64 reference passed), timed, named, and within the limits
    (a row with a null figure or name is never a preset: no TypeError further on)."""
    named = all(row.get(c) is not None for c in ("hardware", "model", "batch_size", "dtype", "config"))
    compiled = row.get("compiled_ms")
    return (
        row["status"] == "ok"
        and named
        and compiled is not None
        and compiled > 0
        and limits.excess(row) is None
    )


def _is_default(row: dict[str, Any]) -> bool:
    """The plain `torch.compile(model)` config: inductor, no mode (or 'default'), no options."""
    return (
        row["backend"] == "inductor"
        and row["mode"] in (None, "default")
        and json.loads(row["options"] or "{}") == {}
        and not row["fullgraph"]
        and row["dynamic"] is None
        and not row.get("freezing")
        and not runtime.from_json(row.get("runtime"))
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


def class_defaults(rows: list[dict[str, Any]], limits: Limits | None = None) -> dict[str, dict[str, Any]]:
    """Per dtype: the config that is eligible (ok, within the limits) on the most cells, ties
    broken by the best geometric mean of its speedup over eager on those cells; rows whose timing
    is doubted (`compiler.statistics.timing_doubts`) decide nothing."""
    limits = limits or Limits()
    thresholds = cstats.load_thresholds()
    by_dtype: dict[str, dict[str, list[dict[str, Any]]]] = defaultdict(lambda: defaultdict(list))
    for r in rows:
        if eligible(r, limits) and (r["eager_ms"] or 0) > 0 and not cstats.timing_doubts(r, thresholds):
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
        "channels_last": bool(row.get("channels_last")),
        "runtime": runtime.from_json(row.get("runtime")),
    }


def serving_peak(*peaks: int | None) -> int | None:
    """The peak of a process that runs these phases (None when none was measured). The compiled
    phase's own peak leaves out what ran before it in the job: with `cudnn_benchmark`, cuDNN's
    algorithm search runs in the eager phase, on the first call, and takes the memory that is free
    (maskformer bs16 on an H100: 36.0 GiB against 3.1 GiB for the compiled phase;
    docs/results/h100-tune-runtime.md section 15)."""
    measured = [p for p in peaks if p is not None]
    return max(measured) if measured else None


def preset_entry(best: dict[str, Any], cell_dtype: str, **fields: Any) -> dict[str, Any]:
    """A preset (a row of the `presets` table, `compile` as a dict) from the result row of the
    config chosen for a cell whose precision is `cell_dtype`; `fields` add or override."""
    entry = {
        "hardware": best["hardware"],
        "model": best["model"],
        "model_id": best["model_id"],
        "batch_size": best["batch_size"],
        "dtype": cell_dtype,
        "precision": best["dtype"],
        "config": best["config"],
        "compile": _compile_dict(best),
        "compiled_ms": best["compiled_ms"],
        "eager_ms": best["eager_ms"],
        "speedup_vs_eager": best["eager_ms"] / best["compiled_ms"] if (best["eager_ms"] or 0) > 0 else None,
        "compile_s": best["compile_s"],
        "peak_mem_bytes": best.get("peak_mem_bytes"),
        "serving_peak_mem_bytes": serving_peak(best.get("eager_peak_mem_bytes"), best.get("peak_mem_bytes")),
        "job_id": best["job_id"],
        "device_name": best["device_name"],
        "torch_version": best["torch_version"],
        "triton_version": best.get("triton_version"),
        "cuda_version": best.get("cuda_version"),
        "driver_version": best.get("driver_version"),
        "python_version": best.get("python_version"),
        "serving_profile": best.get("serving_profile"),
    }
    entry.update(fields)
    return entry


def derive_presets(
    table: pa.Table, limits: Limits = Limits(), accuracy: tuple[AccuracyBudget, ...] = ()
) -> dict[str, Any]:
    """Best eligible config per cell (see `eligible`), with its speedup over eager, over the default
    config and over a stock PyTorch user (`store.stock`); eager instead where that
    config's row shows eager faster by the project's rule (`orchestrator.tune.eager`: a row of
    several processes, `measure.repeats`).

    With accuracy budgets (a sweep's `accuracy:`), a cell is a model and batch size in its own
    precision (the sweep's one dtype), every precision's rows are its candidates, and each budget
    gets a preset: the fastest that fits it (`compiler.accuracy`: a determined cell, the error
    against fp64 within the tolerance).

    Cells where no config is eligible are listed under `no_preset` with every config's status
    (and the budget it broke), so a missing preset is explained rather than silently absent.
    """
    all_rows = table.to_pylist()
    groups: dict[tuple, list[dict[str, Any]]] = defaultdict(list)
    own = _own_policy(all_rows) if accuracy else None
    for row in all_rows:
        groups[(row["hardware"], row["model"], row["batch_size"], own or row["dtype"])].append(row)
    presets, missing, checks = [], [], []
    thresholds = cstats.load_thresholds()
    for (hardware, model, bs, dtype), rows in sorted(groups.items(), key=lambda kv: tuple(map(str, kv[0]))):
        figures = acc.figures_of_rows(rows, dtype)
        doubted = _doubted(rows, thresholds, limits)
        for budget in accuracy or (None,):
            if doubted:  # never decided on a timing that cannot be trusted: undecided, with the reason
                missing.append(
                    {
                        "hardware": hardware,
                        "model": model,
                        "batch_size": bs,
                        "dtype": dtype,
                        **({"budget": budget.name} if budget else {}),
                        "undecided": cstats.UNDECIDED,
                        "statuses": doubted,
                    }
                )
                continue
            judgement = acc.judge(budget, figures, thresholds) if budget else None
            fits = [
                r
                for r in rows
                if eligible(r, limits) and (not judgement or acc.within(r, "compiled", judgement, dtype)[0])
            ]
            if not fits:
                missing.append(
                    {
                        "hardware": hardware,
                        "model": model,
                        "batch_size": bs,
                        "dtype": dtype,
                        **({"budget": budget.name} if budget else {}),
                        "statuses": {
                            (f"{r['config']}@{r['dtype']}" if budget else str(r["config"])): _status(
                                r, limits
                            )
                            for r in rows
                        },
                    }
                )
                continue
            entry, check = _swept(fits, rows, dtype, limits, judgement)
            if budget is not None:
                entry.update(
                    budget=budget.name,
                    accuracy_rule=judgement.rule,
                    accuracy_decision=judgement.decision,
                    accuracy_why=judgement.why,
                    weights=figures.weights,
                )
            checks.append(check)
            presets.append(entry)
    data = preset_document(presets, missing, all_rows, limits)
    trusted = [r for r in all_rows if not cstats.timing_doubts(r, thresholds)]  # what won, on trusted timings
    data["what_won"] = what_won(presets, eager.add_effects(setting_effects(trusted), checks))
    return data


def _doubted(
    rows: list[dict[str, Any]], thresholds: cstats.Thresholds, limits: Limits
) -> dict[str, str] | None:
    """Where a cell's ok row has a doubted timing (`compiler.statistics.timing_doubts`): every
    config's status, the doubted ones with their reasons; None where every timing is trusted."""
    doubts = {id(r): cstats.timing_doubts(r, thresholds) for r in rows if r["status"] == "ok"}
    if not any(doubts.values()):
        return None
    return {
        f"{r['config']}@{r['dtype']}": (
            cstats.doubted_status(doubts[id(r)]) if doubts.get(id(r)) else _status(r, limits)
        )
        for r in rows
    }


def _own_policy(rows: list[dict[str, Any]]) -> str:
    """The cells' own precision in a sweep with accuracy budgets: the stock policy where its rows are
    there, else the one precision the rows share."""
    from compiler.precision import STOCK

    found = {r["dtype"] for r in rows}
    return STOCK if STOCK in found or len(found) != 1 else found.pop()


def _swept(
    fits: list[dict[str, Any]], rows: list[dict[str, Any]], dtype: str, limits: Limits, judgement: Any
) -> tuple[dict[str, Any], dict[str, Any]]:
    """A sweep's preset of one cell (and budget) from the rows that fit: the fastest, eager where its
    row shows eager faster (and eager's error fits too), with its figures against the stock user."""
    best = min(fits, key=lambda r: r["compiled_ms"])
    default = next((r for r in fits if _is_default(r)), None)
    over = sum(1 for r in rows if r["status"] == "ok" and limits.excess(r))
    why = f"fastest of {len(fits)} eligible configs swept"
    entry = preset_entry(
        best,
        dtype,
        source="swept",
        decision=why,
        speedup_vs_default=default["compiled_ms"] / best["compiled_ms"] if default else None,
        default_config=default["config"] if default else None,
        candidates=len(fits),
        over_budget=over,
    )
    check: dict[str, Any] = {}
    veto = acc.within(best, "eager", judgement, dtype)[1] if judgement else None
    entry, _ = eager.reconsider(entry, why, best, "compiled", best["dtype"], log=check, veto=veto)
    if entry["source"] == "eager" and default:  # medians of two rows, as for a compiled preset
        entry["speedup_vs_default"] = default["compiled_ms"] / entry["eager_ms"]
    entry["dtype"] = dtype
    ref = cstats.cell_reference([r for r in rows if r["dtype"] == best["dtype"]])
    if entry["source"] != "eager" and ref.median_ms and best["compiled_ms"]:  # the report's one reference
        entry["speedup_vs_eager"] = ref.median_ms / best["compiled_ms"]
    user = stock_user(rows, dtype)
    if user is not None:
        entry.update(versus(user, best, "eager" if entry["source"] == "eager" else "compiled"))
    return entry, check["eager_check"]


def _status(row: dict[str, Any], limits: Limits) -> str:
    excess = limits.excess(row) if row["status"] == "ok" else None
    return f"ok, {excess}" if excess else row["status"]


def stack_key(stack: dict[str, Any]) -> str:
    """A software stack as one readable key, e.g. 'torch 2.11.0+cu130, triton 3.6.0, cuda 13.0,
    python 3.12, driver 580.159.04' (the parts a compile cache and a measurement depend on)."""
    return ", ".join(f"{k} {v}" for k, v in stack.items() if v)


def preset_document(
    presets: list[dict[str, Any]],
    missing: list[dict[str, Any]],
    rows: list[dict[str, Any]],
    limits: Limits,
) -> dict[str, Any]:
    """presets.json: the flat lists, and `classes`: per hardware class and software stack, its
    presets and its class defaults (from `rows`, the results they were chosen from)."""
    by_class: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for row in rows:
        by_class[row["hardware"]].append(row)
    stacks = {
        hw: sorted({json.dumps(row_stack(r), sort_keys=True) for r in hw_rows if r["status"] == "ok"})
        for hw, hw_rows in by_class.items()
    }
    classes: dict[str, dict[str, Any]] = {}
    for hw, hw_rows in sorted(by_class.items()):
        per_stack: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for r in hw_rows:
            if r["status"] == "ok":
                per_stack[stack_key(row_stack(r))].append(r)
        classes[hw] = {
            key: {
                "stack": row_stack(stack_rows[0]),
                "presets": [p for p in presets if p["hardware"] == hw and stack_key(row_stack(p)) == key],
                "defaults": class_defaults(stack_rows, limits),
            }
            for key, stack_rows in sorted(per_stack.items())
        }
    return {
        "format": PRESET_FORMAT,
        "budgets": limits.to_dict(),
        "presets": presets,
        "no_preset": missing,
        "defaults": {hw: class_defaults(hw_rows, limits) for hw, hw_rows in sorted(by_class.items())},
        "stacks": {hw: [json.loads(s) for s in found] for hw, found in sorted(stacks.items())},
        "classes": classes,
    }


def write_presets(
    out_dir: Target, limits: Limits = Limits(), accuracy: tuple[AccuracyBudget, ...] | None = None
) -> tuple[Path | str, dict[str, Any]]:
    """Derive the presets of the results under `out_dir` (a path or a URI) and write them there
    (`write_preset_files`); return where presets.json went and what it holds. `accuracy`: the
    budgets to decide under; None, the sweep's own (its latest run's `accuracy:`)."""
    out = resolve(out_dir)
    table = read_results(out)
    if table.num_rows == 0:
        raise FileNotFoundError(f"no result rows under {results_path(out)}; run `orchestrate sweep` first")
    if accuracy is None:
        accuracy = sweep_accuracy(out)
    data = derive_presets(table, limits, accuracy)
    return write_preset_files(out, data), data


def sweep_accuracy(out: Location) -> tuple[AccuracyBudget, ...]:
    """The accuracy budgets of the sweep an output's latest run ran (none where it declared none)."""
    from store.runlog import read_runs

    for run in reversed(read_runs(out)):
        declared = (run.get("spec") or {}).get("accuracy")
        if declared is not None:
            return acc.parse_budgets(declared if isinstance(declared, list) else [declared])
        if run.get("spec"):
            return ()
    return ()


def write_preset_files(out_dir: Target, data: dict[str, Any]) -> Path | str:
    """`<out>/presets.parquet` (the `presets` table) and `<out>/presets.json`, each written whole
    (a reader never sees half a file); returns where the JSON went."""
    out = resolve(out_dir)
    sink = pa.BufferOutputStream()
    pq.write_table(presets_table(data["presets"]), sink, write_page_checksum=True)
    durable_write(out.join(PRESETS_TABLE_FILE), sink.getvalue().to_pybytes())
    path = out.join(PRESETS_FILE)
    durable_write(path, json.dumps(data, indent=2, default=str))
    return path.target


def durable_write(loc: Location, data: bytes | str) -> None:
    """Write the whole file `loc` through `compiler.durable` (fsynced tmp + rename locally, one
    PUT on an object store)."""
    durable.write_bytes(loc.path, data.encode() if isinstance(data, str) else data, filesystem=loc.fs)


def presets_table(entries: list[dict[str, Any]]) -> pa.Table:
    """Preset entries as the `presets` table (`compile`, `runtime`, `eager_over_compile` and
    `model_spec` as JSON text; null where the entry has none, as an eager preset's `compile`)."""
    rows = []
    for e in entries:
        row = {name: e.get(name) for name in PRESETS_SCHEMA.names}
        for key in ("compile", "runtime", "eager_over_compile", "model_spec"):
            if e.get(key) is not None:
                row[key] = json.dumps(e[key], sort_keys=True)
        rows.append(row)
    return pa.Table.from_pylist(rows, schema=PRESETS_SCHEMA)


def read_presets_table(out_dir: Target) -> pa.Table | None:
    """The `presets` table written under `out_dir`, or None if there is none."""
    path = resolve(out_dir).join(PRESETS_TABLE_FILE)
    if not path.exists():
        return None
    return pq.read_table(pa.BufferReader(path.read_bytes()), schema=PRESETS_SCHEMA)
