"""`orchestrate tune SWEEP`: per (hardware class, model, batch size) cell and accuracy budget, the
fastest configuration within the budget that beats a stock PyTorch user by a margin the
statistics support.

Successive halving, in four rounds of jobs dispatched across the cluster like any sweep
(`orchestrator.tune.stages` says what each round hands the next):

1. `rung0`: the bases of every cell (the sweep's stock configs, and torch's max-autotune modes on
   GPU classes) under every precision policy an accuracy budget lets the class search
   (`compiler.accuracy`), measured cheaply (one process, a quarter of the sweep's timed calls).
   Each job compiles cold and checks its output against an fp64 reference; a candidate that fails
   it, breaks a compile or memory limit, or is over a budget's error, is out for that budget.
   The cell's own-precision rows also say whether its outputs can judge precision at all
   (random weights: `undetermined` keeps the cell's precision).
2. `knobs`: each knob (`orchestrator.tune.space`) turned on the fastest base of the cell's own
   precision and on each budget's fastest base: precision first, it moves latency most, then the
   knobs on the winner.
3. `rung1`: per budget the best 1/eta, the best stock config, the best other candidate with its
   precision's best stock mode, and the knobs that each helped turned together, measured again
   with the sweep's `measure` settings (a cell left with one stock config and one other skips it).
4. `confirm`: in `--confirm-repeats` fresh processes each, the stock user (the fastest stock
   config with the other stock mode and eager beside it, torch's defaults), and per precision
   chosen the fastest candidate against its stock mode, in the same processes where their runtime
   settings are equal (`Job.baseline`), else apart. `orchestrator.tune.deployed` decides: a
   candidate wins only where the interval of stock / candidate lies above 1
   (`compiler.statistics.beats`), eager where it beats the choice, and a lower precision only where
   it beats the stock user too.

Candidates recompile across rungs, and the candidates of one cell share GEMM/conv shapes, so
their jobs share compile and autotune work through a Redis server by default
(`TuneOptions.shared_cache`, `orchestrator.fleet.cache`): one server for the whole tune, its
address handed to every rung. Rows say what their compile got from it (`compile_cache`,
`compile_from_cache` and the hit/miss columns).

Each round is a sweep output of its own under OUT (`OUT/rung0`, `OUT/knobs`, `OUT/rung1`,
`OUT/confirm`: `orchestrate report` works on each), so an interrupted tune resumes with `--resume`
from the jobs already recorded. OUT also gets `tune.json` (every cell's candidates, figures,
judgements and decisions), the presets (`presets.parquet`, `presets.json`; `orchestrate export`
reads them) and `deployed.json` (per cell and budget, the speedup over stock eager and stock
`torch.compile`, and the error against fp64).
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

from compiler.accuracy import STOCK_BUDGET, Budget, searched
from compiler.capabilities import known
from orchestrator.fleet.cache import SNAPSHOT_FILE, check_address, shared_cache
from orchestrator.fleet.driver import OutputExistsError, SweepOptions, ray_session, run_sweep
from orchestrator.fleet.inventory import HardwareClass, cluster_classes
from orchestrator.fleet.inventory import resolve as resolve_classes
from orchestrator.spec.matrix import select_matching
from orchestrator.spec.sweep import SweepSpec
from orchestrator.tune import deployed, eager, stages
from orchestrator.tune.cells import Cell, check_rows_kept
from orchestrator.tune.effects import dropped_knobs, effects_document, setting_effects, what_won
from orchestrator.tune.presets import Budgets, durable_write, preset_document, write_preset_files
from orchestrator.tune.space import BASE_MODES, KNOB_NAMES, Candidate, candidates, is_base
from store.lock import holding
from store.rows import latest_rows
from store.runlog import check_same_sweep
from store.schema import read_results
from store.storage import Location, Target, checked, refusal_stops
from workers.job import Baseline, Job, MeasureSpec, software_stack
from workers.runner import plural

TUNE_FILE = "tune.json"
DEPLOYED_FILE = "deployed.json"
ROUNDS = ("rung0", "knobs", "rung1", "confirm")
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
    accuracy: tuple[Budget, ...] = ()
    """Accuracy budgets (`compiler.accuracy`; --accuracy): each cell gets a preset per budget, the
    fastest config within it. Empty: the sweep's `accuracy:`, else `stock`."""
    precisions: tuple[str, ...] | None = None
    """The precision policies the search may use (--precisions; the cell's own always): None, every
    one the budgets let a class search."""
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
    deadline: float | None = None
    """`time.monotonic()` at which the tune stops as on Ctrl-C (`SweepOptions.deadline`)."""


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
    deployed: dict[str, Any] = field(default_factory=dict)
    """`deployed.json`: per cell and budget what was deployed and its speedup over a stock user."""
    budgets: list[str] = field(default_factory=list)
    """The accuracy budgets the presets were decided under (a preset per cell and budget)."""


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


def plan_space(
    spec: SweepSpec, classes: dict[str, HardwareClass], opts: TuneOptions, pruned: dict[str, dict[str, str]]
) -> dict[Cell, list[Candidate]]:
    """Every candidate of every cell on `classes` (`orchestrator.tune.space.candidates`): the
    precisions the accuracy budgets let each class search (`compiler.accuracy.searched`), the
    knobs asked for that an earlier tune did not prune. A class the sweep names that is missing
    raises `MissingHardwareError`."""
    hardware = resolve_classes(spec.hardware, classes, opts.allow_missing)
    budgets = tune_budgets(spec, opts)
    return {
        cell: candidates(
            spec.configs,
            cell.model,
            cell.device,
            cell.dtype,
            tuple(searched(budgets, known(cell.hardware), cell.dtype, opts.precisions)),
            tuple(k for k in opts.knobs if k not in pruned.get(cell.hardware, {})),
            _bases(opts.bases, cell.device),
            known(cell.hardware),
        )
        for cell in plan_cells(spec, hardware)
    }


def rung0_jobs(
    spec: SweepSpec,
    space: dict[Cell, list[Candidate]],
    opts: TuneOptions,
    stack: dict[str, str] | None = None,
) -> tuple[dict[tuple[Cell, Candidate], Job], dict[Cell, list[Candidate]]]:
    """The bases of every cell (`space.is_base`: no knob turned), as rung 0 measures them, and the
    space left to search: the candidates `opts.only` selects by job name, with the bases their
    knobs are turned on. The tune's plan, made from the cluster's classes, or before Ray starts
    from this machine's (`commands.common.check_plan_locally`). An --only that selects nothing
    raises `NoJobMatches`."""
    measure0 = rung_measure(spec.measure, "rung0")
    every = {
        (cell, cand): make_job(spec, cell, cand, measure0, opts.timeout_cap_s, stack=stack)
        for cell, cands in space.items()
        for cand in cands
    }
    chosen = {
        j.job_id for j in select_matching(every.values(), opts.only, "the tune's {n} candidate jobs", "")
    }
    kept: dict[Cell, list[Candidate]] = {}
    for (cell, cand), j in every.items():
        if j.job_id in chosen:
            kept.setdefault(cell, []).append(cand)
    for cell, cands in kept.items():  # a knob chosen alone still needs its base measured
        names = {(c.config.name, c.dtype) for c in cands}
        cands += [
            c
            for c in space[cell]
            if is_base(c)
            and (c.config.name, c.dtype) not in names
            and any(k.base_name == c.config.name and k.dtype == c.dtype for k in cands)
        ]
    jobs0 = {(cell, c): every[cell, c] for cell, cands in kept.items() for c in cands if is_base(c)}
    if not jobs0:
        hardware = sorted({cell.hardware for cell in space})
        raise NothingToTune(f"no candidate job to run on {', '.join(hardware) or 'no hardware class'}")
    return jobs0, kept


def tune_budgets(spec: SweepSpec, opts: TuneOptions) -> tuple[Budget, ...]:
    """The accuracy budgets a tune decides under: --accuracy, else the sweep's, else `stock`."""
    return opts.accuracy or spec.accuracy or (Budget(STOCK_BUDGET),)


def plan_locally(spec: SweepSpec, opts: TuneOptions) -> Callable[[dict[str, HardwareClass]], list[Job]]:
    """The tune's rung-0 plan from given classes, for the check before Ray starts."""
    return lambda classes: list(
        rung0_jobs(spec, plan_space(spec, classes, opts, _pruned(opts.prune_from)), opts)[0].values()
    )


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
                deadline=opts.deadline,
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
    budgets = tune_budgets(spec, opts)
    stock_names = {c.name for c in spec.configs}
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
        space = plan_space(spec, cluster_classes(opts.cpus_per_job), opts, pruned)
        jobs0, space = rung0_jobs(spec, space, opts, stack)
        runs = {cell: stages.CellRun(cell, space[cell]) for cell, _ in jobs0}
        for run in runs.values():
            log[run.cell.name] = run.log

        def job(cell: Cell, cand: Candidate, rung: str, baseline: Candidate | None = None) -> Job:
            measure = rung_measure(spec.measure, rung, opts.confirm_repeats)
            return make_job(spec, cell, cand, measure, opts.timeout_cap_s, baseline, stack)

        def results(
            rows: dict[str, Any], jobs: dict[tuple[Cell, Candidate], Job], cell: Cell
        ) -> stages.tb.Results:
            return [(c, rows.get(j.job_id)) for (ce, c), j in jobs.items() if ce == cell]

        cells = list(runs)
        rows0 = run_round(
            "rung0",
            list(jobs0.values()),
            f"{plural(len(jobs0), 'base')} over {plural(len(cells), 'cell')} in "
            f"{plural(len({c.dtype for _, c in jobs0}), 'precision')}, measured cheaply",
        )
        jobs_k = {
            (cell, cand): job(cell, cand, "rung0")
            for cell, run in runs.items()
            for cand in stages.judge(run, results(rows0, jobs0, cell), budgets, opts.budgets)
        }
        rows_k = run_round(
            "knobs",
            list(jobs_k.values()),
            f"{plural(len(jobs_k), 'knob')} turned on each cell's fastest bases (its own precision's, and each "
            "budget's), measured cheaply",
        )
        for cell, run in runs.items():
            stages.promote(run, results(rows_k, jobs_k, cell), opts.budgets, opts.eta, stock_names)
        jobs1 = {
            (cell, c): job(cell, c, "rung1")
            for cell, run in runs.items()
            for c in stages.rung1(run, opts.budgets, stock_names)
        }
        rows1 = run_round(
            "rung1",
            list(jobs1.values()),
            f"{plural(len(jobs1), 'candidate')} of {plural(len({cell for cell, _ in jobs1}), 'cell')} measured "
            "with the sweep's settings (the survivors where they are more than the confirmation times, "
            "else the knobs turned together)",
        )
        jobs2: list[Job] = []
        for cell, run in runs.items():
            results1 = stages.rung1_results(run, results(rows1, jobs1, cell))
            made = stages.confirm(
                run, results1, opts.budgets, stock_names, lambda c, b, cell=cell: job(cell, c, "confirm", b)
            )
            jobs2 += [j for j in made if j.job_id not in {k.job_id for k in jobs2}]
        rows2 = run_round("confirm", jobs2, stages.confirm_summary(runs.values(), opts.confirm_repeats))

    entries, missing, decisions = [], [], {}
    for run in runs.values():
        decided = stages.decide(run, budgets, rows2, opts.budgets, opts.eager_presets, stock_names)
        decisions.update(decided.decisions)
        if decided.missing is not None:
            missing.append(decided.missing)
        for entry in decided.entries:
            entry["model_spec"] = dataclasses.asdict(run.cell.model)
            entry["over_budget"] = sum(
                1 for v in run.log.get("candidates", {}).values() if v.get("over_budget")
            )
            entries.append(entry)
        if decided.entries:
            first = decided.entries[0]
            run.log["preset"] = {k: first[k] for k in ("config", "precision", "source")}

    checks = [c["eager_check"] for c in log.values() if "eager_check" in c]
    checks += [
        b["eager_check"] for c in log.values() for b in c.get("budgets", {}).values() if "eager_check" in b
    ]
    effects = eager.add_effects(setting_effects([*rows0.values(), *rows_k.values()]), checks)
    won = what_won(entries, effects)
    data = preset_document(entries, missing, list(rows0.values()), opts.budgets)
    data["what_won"] = won
    with refusal_stops(out, f"every job's row is saved, but not the presets nor {TUNE_FILE}", resume):
        write_preset_files(out, data)
        durable_write(out.join(DEPLOYED_FILE), json.dumps(deployed.summary(entries), indent=1, default=str))
        document = stages.tune_document(
            spec, opts, budgets, pruned, effects_document(effects), won, jobs_run, log
        )
        durable_write(out.join(TUNE_FILE), json.dumps(document, indent=1, default=str))
    sources = [e["source"] for e in entries]
    summary = deployed.summary(entries)
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
        deployed=summary,
        budgets=[b.name for b in budgets],
    )
