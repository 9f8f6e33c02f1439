"""`orchestrate tune SWEEP`: search beyond the stock modes, per (hardware class, model, batch
size, precision) cell, and keep a tuned config only where it beats the best stock mode by a
margin the statistics support.

Successive halving, in three rounds of jobs dispatched across the cluster like any sweep:

1. `rung0`: every candidate of every cell (`orchestrator.tune.space`), measured cheaply (one
   process, a quarter of the sweep's timed calls). Each job compiles cold and checks its output
   against the fp64 reference; a candidate that fails it, or breaks a budget, is out.
2. `rung1`: per cell the best 1/eta of the candidates, and always the best stock config and
   the best other one, measured again with the sweep's `measure` settings (a cell left with
   just those two skips it: the confirmation measures them better).
3. `confirm`: per cell, the fastest non-stock candidate of rung 1 and the best stock config:
   one job compiles both in the same processes (`Job.baseline`) and times eager, the stock
   config and the candidate interleaved, in `--confirm-repeats` fresh processes (rung 1's
   one-process figures only rank; a candidate a little behind there may still be faster). The
   candidate wins only if the paired interval of stock / candidate lies above 1
   (`compiler.statistics.beats`); otherwise the stock config stays the preset. Either becomes
   eager (do not compile) where the same processes timed eager faster (`orchestrator.tune.eager`).

Candidates recompile across rungs, and the candidates of one cell share GEMM/conv shapes, so
their jobs share compile and autotune work through a Redis server by default
(`TuneOptions.shared_cache`, `orchestrator.fleet.cache`): one server for the whole tune, its
address handed to every rung. Rows say what their compile got from it (`compile_cache`,
`compile_from_cache` and the hit/miss columns).

Each round is a sweep output of its own under OUT (`OUT/rung0`, `OUT/rung1`, `OUT/confirm`:
`orchestrate report` works on each), so an interrupted tune resumes with `--resume` from the
jobs already recorded. OUT also gets `tune.json` (every cell's candidates, figures and
decision) and the presets (`presets.parquet`, `presets.json`; `orchestrate export` reads them).
"""

from __future__ import annotations

import dataclasses
import json
import shlex
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TextIO

from compiler.capabilities import known
from orchestrator.fleet.cache import SNAPSHOT_FILE, check_address, shared_cache
from orchestrator.fleet.driver import OutputExistsError, SweepOptions, ray_session, run_sweep
from orchestrator.fleet.inventory import HardwareClass, cluster_classes
from orchestrator.fleet.inventory import resolve as resolve_classes
from orchestrator.spec.matrix import select_matching
from orchestrator.spec.sweep import SweepSpec
from orchestrator.store.lock import holding
from orchestrator.store.rows import latest_rows
from orchestrator.store.runlog import check_same_sweep
from orchestrator.store.schema import read_results
from orchestrator.store.storage import Location, Target, checked, refusal_stops
from orchestrator.tune import eager
from orchestrator.tune.cells import (
    Cell,
    best_pair,
    check_rows_kept,
    combine_helping_knobs,
    confirm_plan,
    decide,
    figures_of,
    promote,
)
from orchestrator.tune.effects import dropped_knobs, effects_document, setting_effects, what_won
from orchestrator.tune.presets import Budgets, durable_write, preset_document, write_preset_files
from orchestrator.tune.space import BASE_MODES, KNOB_NAMES, Candidate, candidates
from workers.job import Baseline, Job, MeasureSpec, software_stack
from workers.runner import plural

TUNE_FILE = "tune.json"
ROUNDS = ("rung0", "rung1", "confirm")
DEFAULT_ETA = 3
DEFAULT_CONFIRM_REPEATS = 3


class NothingToTune(ValueError):
    """The selection left no cell to tune."""


@dataclass
class TuneOptions:
    out_dir: Target
    address: str | None = None
    resume: bool = False
    only: str | None = None
    precisions: tuple[str, ...] = ()
    """Precision policies a candidate may use besides the cell's own (e.g. tf32, bf16)."""
    knobs: tuple[str, ...] = KNOB_NAMES
    bases: tuple[str, ...] | None = None
    """Torch modes added as bases (candidates with knobs of their own) where the sweep lacks them;
    None: `max-autotune` and `max-autotune-no-cudagraphs` on GPU classes, none on CPU."""
    prune_from: Target | None = None
    """An earlier tune's output: knobs it measured to gain nothing (or to hurt) on every cell of a class are left out of that
    class's search (`orchestrator.tune.effects.dropped_knobs`)."""
    budgets: Budgets = field(default_factory=Budgets)
    eta: int = DEFAULT_ETA
    """Rung 0 keeps the best 1/eta of each cell's candidates (at least one) for rung 1."""
    confirm_repeats: int = DEFAULT_CONFIRM_REPEATS
    eager_presets: bool = True
    """A cell's preset may be eager where its row timed eager faster (`orchestrator.tune.eager`);
    False (`--no-eager`) keeps the compiled config and only records the check."""
    cpus_per_job: int | None = None
    timeout_cap_s: float | None = None
    allow_missing: bool = False
    scratch_root: str | None = None
    shared_cache: bool = True
    """Share compile and autotune work between the tune's jobs through Redis (see the module doc)."""
    cache_redis: str | None = None
    """HOST:PORT of an existing Redis server; None starts a private one for the tune."""
    cache_from: Location | None = None
    """An earlier run's output whose shared-cache snapshot (`orchestrator.fleet.cache.SNAPSHOT_FILE`)
    the private server starts with: its GEMM/conv timings and Triton configs (`--cache-from`)."""
    argv: list[str] = field(default_factory=list)


@dataclass
class TuneSummary:
    out_dir: Location
    cells: int
    tuned: int
    stock: int
    no_preset: int
    eager: int
    """Cells whose preset is eager: the compiled preset chosen ran slower than eager there
    (`orchestrator.tune.eager`)."""
    jobs: dict[str, int]
    wall_s: float
    decisions: dict[str, str]
    what_won: list[dict[str, Any]] = field(default_factory=list)
    pruned: dict[str, dict[str, str]] = field(default_factory=dict)


def rung_measure(
    measure: MeasureSpec, rung: str, confirm_repeats: int = DEFAULT_CONFIRM_REPEATS
) -> MeasureSpec:
    """How each round measures: rung 0 cheaply (a quarter of the timed calls, in few rounds),
    rung 1 as the sweep says, the confirmation in `confirm_repeats` processes (at least 2, so
    its interval covers the spread between processes). One process each before that; FLOPs are
    not counted (the tuner compares latencies)."""
    one = dataclasses.replace(measure, flops=False, warm_compile=False, repeats=1)
    if rung == "rung0":
        return dataclasses.replace(
            one, iterations=max(10, measure.iterations // 4), rounds=max(2, min(measure.rounds, 4))
        )
    if rung == "rung1":
        return one
    return dataclasses.replace(one, repeats=max(2, confirm_repeats))


def plan_cells(spec: SweepSpec, hardware: dict[str, HardwareClass]) -> list[Cell]:
    return [
        Cell(hw, cls.device, model, bs, dtype)
        for hw, cls in hardware.items()
        for model in spec.models
        for bs in spec.batch_sizes
        for dtype in spec.dtypes
    ]


def make_job(
    spec: SweepSpec,
    cell: Cell,
    cand: Candidate,
    measure: MeasureSpec,
    timeout_cap_s: float | None,
    baseline: Candidate | None = None,
    stack: dict[str, str] | None = None,
) -> Job:
    timeout = cell.model.timeout_s or cand.config.effective_timeout(spec.timeout_s)
    if baseline is not None:  # two cold compiles in the first process
        timeout += cell.model.timeout_s or baseline.config.effective_timeout(spec.timeout_s)
    if timeout_cap_s:
        timeout = min(timeout, timeout_cap_s)
    return Job(
        sweep=spec.name,
        hardware=cell.hardware,
        device=cell.device,  # type: ignore[arg-type]
        model=cell.model,
        batch_size=cell.batch_size,
        dtype=cand.dtype,
        config=cand.config,
        measure=measure,
        timeout_s=timeout,
        stack=software_stack() if stack is None else stack,
        baseline=Baseline(baseline.config, baseline.dtype) if baseline is not None else None,
    )


def _bases(bases: tuple[str, ...] | None, device: str) -> tuple[str, ...]:
    if bases is not None:
        return bases
    return BASE_MODES if device == "cuda" else ()  # a CPU max-autotune compile takes minutes


def _pruned(prune_from: Target | None) -> dict[str, dict[str, str]]:
    """hardware class -> knob -> why, from an earlier tune's tune.json (see TuneOptions.prune_from)."""
    if prune_from is None:
        return {}
    where = checked(prune_from).join(TUNE_FILE)
    if not where.exists():
        raise NothingToTune(f"--prune-from: {where} does not exist (give the --out of an earlier tune)")
    try:
        document = json.loads(where.read_text()).get("setting_effects") or {}
    except ValueError as exc:
        raise NothingToTune(f"--prune-from: {where} is not valid JSON ({exc})") from None
    return {hw: knobs for hw, knobs in dropped_knobs(document).items() if knobs}


def _latest(out: Location) -> dict[str, dict[str, Any]]:
    return latest_rows(read_results(out).to_pylist(), lambda r: r["job_id"])


def rung0_jobs(
    spec: SweepSpec,
    classes: dict[str, HardwareClass],
    opts: TuneOptions,
    pruned: dict[str, dict[str, str]],
    stack: dict[str, str] | None = None,
) -> dict[tuple[Cell, Candidate], Job]:
    """Every candidate of every cell on `classes` that `opts.only` selects, as rung 0 measures it:
    the tune's plan, made from the cluster's classes, or before Ray starts from this machine's
    (`commands.common.check_plan_locally`). A class the sweep names that is missing raises
    `MissingHardwareError`; an --only that selects nothing `NoJobMatches`."""
    hardware = resolve_classes(spec.hardware, classes, opts.allow_missing)
    space = {
        cell: candidates(
            spec.configs,
            cell.model,
            cell.device,
            cell.dtype,
            opts.precisions,
            tuple(k for k in opts.knobs if k not in pruned.get(cell.hardware, {})),
            _bases(opts.bases, cell.device),
            known(cell.hardware),
        )
        for cell in plan_cells(spec, hardware)
    }
    measure0 = rung_measure(spec.measure, "rung0")
    jobs0 = {
        (cell, cand): make_job(spec, cell, cand, measure0, opts.timeout_cap_s, stack=stack)
        for cell, cands in space.items()
        for cand in cands
    }
    chosen = {
        j.job_id for j in select_matching(jobs0.values(), opts.only, "the tune's {n} candidate jobs", "")
    }
    jobs0 = {k: j for k, j in jobs0.items() if j.job_id in chosen}
    if not jobs0:
        raise NothingToTune(f"no candidate job to run on {', '.join(hardware) or 'no hardware class'}")
    return jobs0


def plan_locally(spec: SweepSpec, opts: TuneOptions) -> Callable[[dict[str, HardwareClass]], list[Job]]:
    """The tune's rung-0 plan from given classes, for the check before Ray starts."""
    return lambda classes: list(rung0_jobs(spec, classes, opts, _pruned(opts.prune_from)).values())


def run_tune(spec: SweepSpec, opts: TuneOptions, stream: TextIO | None = None) -> TuneSummary:
    """Run the search (see the module docstring) into `opts.out_dir`; return what it decided.

    OUT's lock is held from before anything is read to the end (`lock.OutputLocked` while another
    live driver holds it); the per-rung sweeps lock OUT/<rung> inside it."""
    stream = stream or sys.stderr
    out = checked(opts.out_dir)
    resume = shlex.join(["orchestrate", "tune", spec.source or "SWEEP.yaml", "--out", str(out), "--resume"])
    with (
        refusal_stops(out, "nothing of this tune was written", resume),
        holding(out, opts.argv, stream=stream),
    ):
        return _run_tune(spec, opts, out, resume, stream)


def _run_tune(spec: SweepSpec, opts: TuneOptions, out: Location, resume: str, stream: TextIO) -> TuneSummary:
    if not opts.resume:
        found = [r for r in ROUNDS if read_results(out.join(r), columns=["job_id"]).num_rows]
        if found or out.join(TUNE_FILE).exists():
            raise OutputExistsError(
                f"{out} already holds a tune ({', '.join(found) or TUNE_FILE}). Pass --resume to finish it, "
                "or --out to write somewhere else; nothing was changed."
            )
    for name in ROUNDS:  # each rung's sweep checks its rows too, once its damage is repaired
        check_same_sweep(out.join(name), spec)
    pruned = _pruned(opts.prune_from)  # a bad --prune-from is refused before Ray starts
    t0 = time.monotonic()
    jobs_run: dict[str, int] = {}
    log: dict[str, dict[str, Any]] = {}

    def run_round(name: str, jobs: list[Job], what: str) -> dict[str, dict[str, Any]]:
        where = out.join(name)
        print(f"tune {name}: {what}", file=stream, flush=True)
        if jobs:
            sweep_opts = SweepOptions(
                out_dir=where,
                address=opts.address,
                resume=True,
                cpus_per_job=opts.cpus_per_job,
                allow_missing=opts.allow_missing,
                scratch_root=opts.scratch_root,
                shared_cache=cache_address is not None,
                cache_redis=cache_address,
                argv=opts.argv,
                resume_command=resume,
            )
            run_sweep(spec, sweep_opts, stream, plan=lambda classes: jobs)
        jobs_run[name] = len(jobs)
        rows = _latest(where)
        check_rows_kept(name, where, jobs, rows, resume)
        return rows

    if opts.shared_cache and opts.cache_redis:
        check_address(opts.cache_redis)
    if opts.shared_cache and opts.budgets.max_compile_s is not None:
        print(
            "note: --max-compile-s with the shared compile cache: a candidate's compile_s may be served "
            "from the cache (compile_from_cache), shorter than its cold compile; use --no-shared-cache "
            "where the budget must judge cold compiles",
            file=stream,
        )
    with (
        shared_cache(
            opts.shared_cache,
            opts.cache_redis,
            opts.scratch_root,
            stream,
            keep=out,
            seed=opts.cache_from.join(SNAPSHOT_FILE) if opts.cache_from else None,
        ) as cache_address,
        ray_session(opts.address),
    ):
        stack = software_stack()
        jobs0 = rung0_jobs(spec, cluster_classes(opts.cpus_per_job), opts, pruned, stack)
        cells = list(dict.fromkeys(cell for cell, _ in jobs0))
        rows0 = run_round(
            "rung0",
            list(jobs0.values()),
            f"{plural(len(jobs0), 'candidate')} over {plural(len(cells), 'cell')}, measured cheaply",
        )

        survivors: dict[Cell, list[Candidate]] = {}
        for cell in cells:
            results = [(c, rows0.get(j.job_id)) for (ce, c), j in jobs0.items() if ce == cell]
            survivors[cell] = promote(results, opts.eta, opts.budgets)
            combined = combine_helping_knobs(results, opts.budgets)
            if combined is not None:
                survivors[cell].append(combined)
            log[cell.name] = {
                "candidates": {f"{c.config.name}@{c.dtype}": figures_of(r, opts.budgets) for c, r in results},
                "promoted": [f"{c.config.name}@{c.dtype}" for c in survivors[cell]],
            }
        # A cell whose survivors are one stock config and one other goes straight to the
        # confirmation, which measures exactly those two, better: rung 1 would only repeat it.
        ranked = {
            cell
            for cell, keep in survivors.items()
            if len(keep) > 2
            or len({c.stock for c in keep}) < 2
            or any((cell, c) not in jobs0 for c in keep)  # a combination rung 0 never measured
        }
        measure1 = rung_measure(spec.measure, "rung1")
        jobs1 = {
            (cell, c): make_job(spec, cell, c, measure1, opts.timeout_cap_s, stack=stack)
            for cell in ranked
            for c in survivors[cell]
        }
        rows1 = run_round(
            "rung1",
            list(jobs1.values()),
            f"{plural(len(jobs1), 'candidate')} promoted, measured with the sweep's settings "
            f"({plural(len(cells) - len(ranked), 'cell')} with only a stock config and one other: "
            "straight to the confirmation)",
        )

        rung1 = {
            cell: [(c, rows1.get(j.job_id)) for (ce, c), j in jobs1.items() if ce == cell]
            if cell in ranked
            else [(c, rows0.get(jobs0[cell, c].job_id)) for c in survivors[cell]]
            for cell in cells
        }
        pairs: dict[Cell, tuple[Candidate, Candidate]] = {}
        for cell, results in rung1.items():
            log[cell.name]["rung1"] = {
                f"{c.config.name}@{c.dtype}": figures_of(r, opts.budgets) for c, r in results
            }
            stock, tuned, _ = best_pair(results, opts.budgets)
            if stock and tuned:  # rung 1's one-process figures rank; only a paired interval decides
                pairs[cell] = (tuned[0], stock[0])
        measure2 = rung_measure(spec.measure, "confirm", opts.confirm_repeats)
        jobs2: dict[Cell, tuple[Job, Job | None]] = {}
        for cell, (cand, base) in pairs.items():
            if cand.config.runtime == base.config.runtime:
                jobs2[cell] = (
                    make_job(spec, cell, cand, measure2, opts.timeout_cap_s, baseline=base, stack=stack),
                    None,
                )
            else:  # a process keeps its first cuDNN plans: each side in processes of its own
                jobs2[cell] = (
                    make_job(spec, cell, cand, measure2, opts.timeout_cap_s, stack=stack),
                    make_job(spec, cell, base, measure2, opts.timeout_cap_s, stack=stack),
                )
        apart = sum(1 for _, b in jobs2.values() if b is not None)
        rows2 = run_round(
            "confirm",
            [j for pair in jobs2.values() for j in pair if j is not None],
            confirm_plan(len(jobs2) - apart, apart, measure2.repeats),
        )

    entries, missing, decisions = [], [], {}
    for cell in cells:
        confirmation = None
        if cell in pairs:
            job, apart_job = jobs2[cell]
            apart_row = rows2.get(apart_job.job_id) if apart_job is not None else None
            confirmation = (*pairs[cell], rows2.get(job.job_id), apart_row)
            log[cell.name]["confirm"] = figures_of(confirmation[2], opts.budgets)
            if apart_job is not None:
                log[cell.name]["confirm_stock_apart"] = figures_of(apart_row, opts.budgets)
        entry, why = decide(cell, rung1[cell], confirmation, opts.budgets, log[cell.name], opts.eager_presets)
        decisions[cell.name] = why
        log[cell.name]["decision"] = why
        if entry is None:
            missing.append(
                {
                    "hardware": cell.hardware,
                    "model": cell.model.name,
                    "batch_size": cell.batch_size,
                    "dtype": cell.dtype,
                    "statuses": {
                        k: v.get("over_budget") or v["status"]
                        for k, v in log[cell.name]["candidates"].items()
                    },
                }
            )
            continue
        entry["model_spec"] = dataclasses.asdict(cell.model)
        entry["over_budget"] = sum(1 for v in log[cell.name]["candidates"].values() if v.get("over_budget"))
        log[cell.name]["preset"] = {
            "config": entry["config"],
            "precision": entry["precision"],
            "source": entry["source"],
        }
        entries.append(entry)

    checks = [c["eager_check"] for c in log.values() if "eager_check" in c]
    effects = eager.add_effects(setting_effects(list(rows0.values())), checks)
    won = what_won(entries, effects)
    data = preset_document(entries, missing, list(rows0.values()), opts.budgets)
    data["what_won"] = won
    with refusal_stops(out, f"every job's row is saved, but not the presets nor {TUNE_FILE}", resume):
        write_preset_files(out, data)
        durable_write(
            out.join(TUNE_FILE),
            json.dumps(
                {
                    "format": 1,
                    "sweep": spec.source,
                    "argv": opts.argv,
                    "budgets": opts.budgets.to_dict(),
                    "eta": opts.eta,
                    "confirm_repeats": opts.confirm_repeats,
                    "eager_presets": opts.eager_presets,
                    "precisions": list(opts.precisions),
                    "knobs": list(opts.knobs),
                    "bases": list(opts.bases)
                    if opts.bases is not None
                    else "max-autotune modes on GPU classes",
                    "pruned": pruned,
                    "setting_effects": effects_document(effects),
                    "what_won": won,
                    "jobs": jobs_run,
                    "cells": log,
                },
                indent=1,
                default=str,
            ),
        )
    sources = [e["source"] for e in entries]
    return TuneSummary(
        out_dir=out,
        cells=len(cells),
        tuned=sources.count("tuned"),
        stock=sources.count("stock"),
        no_preset=len(missing),
        eager=sources.count("eager"),
        jobs=jobs_run,
        wall_s=time.monotonic() - t0,
        decisions=decisions,
        what_won=won,
        pruned=pruned,
    )
