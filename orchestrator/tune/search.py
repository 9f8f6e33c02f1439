"""`orchestrate tune SWEEP`: per (hardware class, model, batch size) cell and accuracy budget, the
fastest configuration within the budget that beats a stock PyTorch user by a margin the
statistics support.

Successive halving, in rounds of jobs dispatched across the cluster like any sweep; each stage's
rules are a module of their own (`orchestrator.tune.rung0`, `knobs`, `rung1`, `confirm`, `decide`,
`deployed`), and what one round hands the next, per cell, is `orchestrator.tune.cells.CellRun`:

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
   settings are equal (`Job.baseline`), else apart. `orchestrator.tune.decide` decides: a
   candidate wins only where the interval of stock / candidate lies above 1
   (`compiler.statistics.beats`), eager where it beats the choice, and `orchestrator.tune.deployed`
   deploys a lower precision only where it beats the stock user too.
5. `extend`: where that refused a speedup of at least `confirm_extend_gain` (thresholds.json) for
   an interval that did not lie above 1 (few processes of a launch-bound cell give wide ones),
   every confirmation job of the cell again in `--extend-repeats` more fresh processes; the
   decision rests on all of them, pooled (`workers.repeats.pool`).

Candidates recompile across rungs, and the candidates of one cell share GEMM/conv shapes, so
their jobs share compile and autotune work through a Redis server by default
(`TuneOptions.sweep`'s `shared_cache`, `orchestrator.fleet.cache`): one server for the whole tune, its
address handed to every rung. Rows say what their compile got from it (`compile_cache`,
`compile_from_cache` and the hit/miss columns).

Each round is a sweep output of its own under OUT (`OUT/rung0`, `OUT/knobs`, `OUT/rung1`,
`OUT/confirm`, `OUT/extend`: `orchestrate report` works on each), so an interrupted tune resumes with `--resume`
from the jobs already recorded. OUT also gets `tune.json` (every cell's candidates, figures,
judgements and decisions), the presets (`presets.parquet`, `presets.json`; `orchestrate export`
reads them) and `deployed.json` (per cell and budget, the speedup over stock eager and stock
`torch.compile`, and the error against fp64).

In code, `_run_tune` is the list of stages, each a function taking the `TuneContext` (what every
round needs: the sweep, the options, OUT, the cache's address, the stack) and what the stage
before it produced: `run_rung0` → `run_knobs` → `run_rung1` → `run_confirm` (each a `Round`: its
jobs and rows, run by `run_round`) → `run_extend`, then `run_decide` → `write` → `summarize`. Each
calls into its stage's module, per cell; `decide_cell` is the decision and the deployment of one
cell, which `run_extend` makes too. The plan they draw from (options, cells, candidates, each
round's jobs) is `orchestrator.tune.plan`.
"""

from __future__ import annotations

import dataclasses
import json
import shlex
import sys
import time
from dataclasses import dataclass, field
from typing import Any, TextIO

from analysis import efficiency
from compiler import statistics as cstats
from compiler.accuracy import AccuracyBudget
from compiler.job import Job, software_stack
from orchestrator.fleet import summary as fleet_summary
from orchestrator.fleet.cache import SNAPSHOT_FILE, CacheLive, check_access, named_access, shared_cache
from orchestrator.fleet.driver import SweepOptions, ray_session, run_sweep
from orchestrator.fleet.existing import OutputExistsError
from orchestrator.fleet.inventory import cluster_classes
from orchestrator.fleet.preflight import Checked
from orchestrator.spec.sweep import SweepSpec
from orchestrator.tune import confirm, decide, deployed, eager, knobs, rung0, rung1
from orchestrator.tune.cells import Cell, CellRun, Results, check_rows_kept
from orchestrator.tune.effects import effects_document, setting_effects, what_won
from orchestrator.tune.plan import (
    TuneOptions,
    make_job,
    plan_space,
    pruned_knobs,
    round_sweep_options,
    rung0_jobs,
    rung_measure,
    tune_budgets,
)
from orchestrator.tune.presets import Limits, durable_write, preset_document, write_preset_files
from orchestrator.tune.space import Candidate
from orchestrator.tune.summary import TuneSummary, tune_document
from store.fields import HARNESS_ERROR
from store.layout import DEPLOYED_FILE, ROUNDS, TUNE_FILE
from store.lock import holding
from store.rows import latest_rows
from store.runlog import check_same_sweep
from store.schema import read_results
from store.storage import Location, checked, refusal_stops
from workers.repeats import pool
from workers.runner import plural


def run_tune(spec: SweepSpec, opts: TuneOptions, stream: TextIO | None = None) -> TuneSummary:
    """Run the search (see the module docstring) into `opts.sweep.out_dir`; return what it decided.

    OUT's lock is held from before anything is read to the end (`lock.OutputLocked` while another
    live driver holds it); the per-rung sweeps lock OUT/<rung> inside it. A named cache server that
    does not answer is refused before that (`check_cache`): nothing is written."""
    stream = stream or sys.stderr
    out = checked(opts.sweep.out_dir)
    resume = opts.sweep.resume_command or shlex.join(
        ["orchestrate", "tune", spec.source or "SWEEP.yaml", "--out", str(out), "--resume"]
    )
    named = check_cache(opts, stream)
    with (
        refusal_stops(out, "nothing of this tune was written", resume),
        holding(out, opts.sweep.argv, stream=stream),
    ):
        return _run_tune(spec, opts, out, resume, stream, named)


def _run_tune(
    spec: SweepSpec, opts: TuneOptions, out: Location, resume: str, stream: TextIO, named: Any
) -> TuneSummary:
    """The tune's stages, in order; the four rounds run inside one shared compile cache and Ray
    (`named`: the checked server of --cache-redis, else None)."""
    check_output(spec, opts, out)
    pruned = pruned_knobs(opts.prune_from)  # a bad --prune-from is refused before Ray starts
    started = time.monotonic()
    seed = opts.cache_from.join(SNAPSHOT_FILE) if opts.cache_from else None
    with (
        shared_cache(
            opts.sweep.shared_cache, named, opts.sweep.scratch_root, stream, keep=out, seed=seed
        ) as cache,
        ray_session(opts.sweep.address),
    ):
        ctx = TuneContext.open(spec, opts, out, resume, stream, cache, pruned, started)
        runs, rung0_round = run_rung0(ctx)
        knobs_round = run_knobs(ctx, runs, rung0_round)
        rung1_round = run_rung1(ctx, runs, knobs_round)
        confirmed = run_extend(ctx, runs, run_confirm(ctx, runs, rung1_round))
    decided = run_decide(ctx, runs, confirmed)
    won = write(ctx, runs, decided, rung0_round, knobs_round)
    return summarize(ctx, runs, decided, won)


def check_output(spec: SweepSpec, opts: TuneOptions, out: Location) -> None:
    """Before anything runs: refuse an OUT that holds a tune unless --resume (`OutputExistsError`),
    and one whose rounds hold another sweep's rows (`check_same_sweep`)."""
    if not opts.sweep.resume:
        found = [r for r in ROUNDS if read_results(out.join(r), columns=["job_id"]).num_rows]
        if found or out.join(TUNE_FILE).exists():
            raise OutputExistsError(
                f"{out} already holds a tune ({', '.join(found) or TUNE_FILE}). Pass --resume to finish it, "
                "or --out to write somewhere else; nothing was changed."
            )
    for name in ROUNDS:  # each rung's sweep checks its rows too, once its damage is repaired
        check_same_sweep(out.join(name), spec)


def check_cache(opts: TuneOptions, stream: TextIO):
    """The --cache-redis server with its credentials, checked (None: none named), and a note of
    what --max-compile-s judges with a shared cache."""
    named = opts.sweep.cache_redis if opts.sweep.shared_cache else None
    if named is not None:
        named = check_access(named_access(named) if isinstance(named, str) else named)
    if opts.sweep.shared_cache and opts.limits.max_compile_s is not None:
        print(
            "note: --max-compile-s with the shared compile cache: a candidate's compile_s may be served "
            "from the cache (compile_from_cache), shorter than its cold compile; use --no-shared-cache "
            "where the budget must judge cold compiles",
            file=stream,
        )
    return named


@dataclass
class TuneContext:
    """What every round of one tune needs, made once the shared cache and Ray are up."""

    spec: SweepSpec
    opts: TuneOptions
    out: Location
    resume: str
    """The command that resumes the tune, for the messages that stop it."""
    stream: TextIO
    sweep: SweepOptions
    """Every round's sweep options; a round's are these with its folder (`round_options`)."""
    stack: dict[str, str]
    """This driver's software stack, every job's."""
    budgets: tuple[AccuracyBudget, ...]
    """The accuracy budgets the tune decides under (`tune_budgets`)."""
    stock_names: set[str]
    """The sweep's configs: the stock modes to beat."""
    pruned: dict[str, dict[str, str]]
    """Knobs left out of a class's search (--prune-from): hardware class -> knob -> why."""
    started: float
    """`time.monotonic()` at the tune's start, for its wall time."""
    jobs_run: dict[str, int] = field(default_factory=dict)
    """Jobs each round ran, by round name."""
    timed_rows: list[dict[str, Any]] = field(default_factory=list)
    """The rows this tune's rounds ran (not those a resumed tune found): where its time went."""
    harness_errors: dict[str, int] = field(default_factory=dict)
    """Jobs each round left as `harness_error` (not finished: `tune --resume` runs them again)."""

    @classmethod
    def open(
        cls,
        spec: SweepSpec,
        opts: TuneOptions,
        out: Location,
        resume: str,
        stream: TextIO,
        cache: CacheLive | None,
        pruned: dict[str, dict[str, str]],
        started: float,
    ) -> TuneContext:
        """The context of a tune whose shared compile cache is `cache` (None: none), which every
        round uses as it is (a server that stopped answering in one round is not used in the
        next); the rounds' sweep options are made here, once."""
        sweep = round_sweep_options(opts, out, resume, cache)
        return cls(
            spec=spec,
            opts=opts,
            out=out,
            resume=resume,
            stream=stream,
            sweep=sweep,
            stack=software_stack(),
            budgets=tune_budgets(spec, opts),
            stock_names={c.name for c in spec.configs},
            pruned=pruned,
            started=started,
        )

    def round_options(self, name: str) -> SweepOptions:
        """The sweep options of round `name`: the tune's, into OUT/<name>."""
        return dataclasses.replace(self.sweep, out_dir=self.out.join(name))

    def job(self, cell: Cell, cand: Candidate, rung: str, baseline: Candidate | None = None) -> Job:
        """`cand`'s job on `cell` as round `rung` measures it (`rung_measure`), beside `baseline`."""
        measure = rung_measure(self.spec.measure, rung, self.opts.confirm_repeats)
        return make_job(self.spec, cell, cand, measure, self.opts.sweep.timeout_cap_s, baseline, self.stack)


@dataclass
class Round:
    """A round's jobs by (cell, candidate), and the rows its folder holds by job id."""

    jobs: dict[tuple[Cell, Candidate], Job]
    rows: dict[str, dict[str, Any]]

    def results(self, cell: Cell) -> Results:
        """`cell`'s candidates of the round, each with its row (None: it has none)."""
        return [(c, self.rows.get(j.job_id)) for (ce, c), j in self.jobs.items() if ce == cell]


def run_round(ctx: TuneContext, name: str, jobs: list[Job], what: str) -> dict[str, dict[str, Any]]:
    """Run `jobs` as a sweep into OUT/<name> (resuming: the jobs recorded there are skipped), after
    a progress line saying `what`; return the rows that folder holds, by job id (`RowsLost` where a
    job of `jobs` has none)."""
    where = ctx.out.join(name)
    print(f"tune {name}: {what}", file=ctx.stream, flush=True)
    if jobs:
        # a folder of the tune's output, checked with it, on the tune's live cluster and cache
        ready = Checked(where, [], ctx.sweep.cache_redis)
        ran = run_sweep(ctx.spec, ctx.round_options(name), ctx.stream, plan=lambda classes: jobs, ready=ready)
    ctx.jobs_run[name] = len(jobs)
    everything = read_results(where).to_pylist()
    if jobs:
        ctx.timed_rows += [r for r in everything if r.get("run_id") == ran.run_id]
    rows = latest_rows(everything, lambda r: r["job_id"])
    check_rows_kept(name, where, jobs, rows, ctx.resume)
    if unfinished := sum(rows[j.job_id]["status"] == HARNESS_ERROR for j in jobs):
        ctx.harness_errors[name] = unfinished
        print(f"tune {name}: {fleet_summary.unfinished(unfinished, ctx.resume)}", file=ctx.stream, flush=True)
    return rows


def run_rung0(ctx: TuneContext) -> tuple[dict[Cell, CellRun], Round]:
    """Stage 1, rung0. Takes the context; plans the search on the cluster's classes (`plan_space`,
    `rung0_jobs`: --only, the knobs --prune-from left) and measures every cell's bases cheaply.
    Produces a `CellRun` per cell with a base to measure, and the round."""
    space = plan_space(ctx.spec, cluster_classes(ctx.opts.sweep.cpus_per_job), ctx.opts, ctx.pruned)
    jobs, space = rung0_jobs(ctx.spec, space, ctx.opts, ctx.stack)
    runs = {cell: CellRun(cell, space[cell]) for cell, _ in jobs}
    what = (
        f"{plural(len(jobs), 'base')} over {plural(len(runs), 'cell')} in "
        f"{plural(len({c.dtype for _, c in jobs}), 'precision')}, measured cheaply"
    )
    return runs, Round(jobs, run_round(ctx, "rung0", list(jobs.values()), what))


def run_knobs(ctx: TuneContext, runs: dict[Cell, CellRun], rung0_round: Round) -> Round:
    """Stage 2, knobs. Takes rung 0's round; judges each cell's accuracy per budget from it and
    picks the bases the knobs are turned on (`rung0.promote`), then measures each knob on them,
    cheaply. Produces the round."""
    jobs = {
        (cell, cand): ctx.job(cell, cand, "rung0")
        for cell, run in runs.items()
        for cand in rung0.promote(run, rung0_round.results(cell), ctx.budgets, ctx.opts.limits)
    }
    what = (
        f"{plural(len(jobs), 'knob')} turned on each cell's fastest bases (its own precision's, and each "
        "budget's), measured cheaply"
    )
    return Round(jobs, run_round(ctx, "knobs", list(jobs.values()), what))


def run_rung1(ctx: TuneContext, runs: dict[Cell, CellRun], knobs_round: Round) -> Round:
    """Stage 3, rung1. Takes the knobs round; promotes each cell's survivors (`knobs.promote`) and
    measures those `rung1.to_measure` picks with the sweep's settings. Produces the round."""
    for cell, run in runs.items():
        knobs.promote(run, knobs_round.results(cell), ctx.opts.limits, ctx.opts.eta, ctx.stock_names)
    jobs = {
        (cell, c): ctx.job(cell, c, "rung1")
        for cell, run in runs.items()
        for c in rung1.to_measure(run, ctx.opts.limits, ctx.stock_names)
    }
    what = (
        f"{plural(len(jobs), 'candidate')} of {plural(len({cell for cell, _ in jobs}), 'cell')} measured "
        "with the sweep's settings (the survivors where they are more than the confirmation times, "
        "else the knobs turned together)"
    )
    return Round(jobs, run_round(ctx, "rung1", list(jobs.values()), what))


def run_confirm(ctx: TuneContext, runs: dict[Cell, CellRun], rung1_round: Round) -> dict[str, dict[str, Any]]:
    """Stage 4, confirm. Takes rung 1's round; picks what each cell's confirmation measures
    (`rung1.promote`: the stock user and per precision chosen its fastest candidate against its
    stock mode), makes its jobs (`confirm.cell_jobs`) and runs them in --confirm-repeats fresh processes.
    Produces the round's rows by job id."""
    jobs: list[Job] = []
    for cell, run in runs.items():
        results1 = rung1.survivor_results(run, rung1_round.results(cell))
        rung1.promote(run, results1, ctx.opts.limits, ctx.stock_names)
        made = confirm.cell_jobs(run, lambda c, b, cell=cell: ctx.job(cell, c, "confirm", b))
        jobs += [j for j in made if j.job_id not in {k.job_id for k in jobs}]
    return run_round(ctx, "confirm", jobs, confirm.summary(runs.values(), ctx.opts.confirm_repeats))


def run_extend(
    ctx: TuneContext, runs: dict[Cell, CellRun], confirmed: dict[str, dict[str, Any]]
) -> dict[str, dict[str, Any]]:
    """Stage 4b, extend. Takes the confirmation's rows; decides each cell once on them
    (`decide_cell`), and where that refused a speedup of at least `confirm_extend_gain`
    (thresholds.json) for an interval that did not lie above 1, runs every confirmation job of the
    cell again in --extend-repeats more fresh processes (`confirm.extension`). Produces the
    confirmation's rows by job id, each extended one pooled with its extension
    (`workers.repeats.pool`): the decision then rests on all their processes."""
    if ctx.opts.extend_repeats < 1:
        return confirmed
    gain = cstats.load_thresholds().confirm_extend_gain
    measure = rung_measure(ctx.spec.measure, "extend", ctx.opts.confirm_repeats, ctx.opts.extend_repeats)
    more: dict[str, Job] = {}
    cells = 0
    for run in runs.values():
        if run.picks is None or run.state is None:
            continue
        decide_cell(run, ctx.budgets, confirmed, ctx.opts.limits, ctx.opts.eager_presets, ctx.stock_names)
        extension = confirm.extension(run, gain, ctx.opts.extend_repeats, measure)
        if extension is not None:
            cells += 1
            more.update(extension)
    if not more:
        return confirmed
    what = (
        f"{plural(len(more), 'confirmation job')} of {plural(cells, 'cell')} whose interval could not "
        f"tell a speedup of {gain:g}x or more, each in {ctx.opts.extend_repeats} more fresh processes"
    )
    rows = run_round(ctx, "extend", list(more.values()), what)
    pooled = dict(confirmed)
    for job_id, job in more.items():
        if job_id in confirmed and job.job_id in rows:
            pooled[job_id] = pool([confirmed[job_id], rows[job.job_id]])
    return pooled


def decide_cell(
    run: CellRun,
    budgets: tuple[AccuracyBudget, ...],
    rows: dict[str, dict[str, Any]],
    limits: Limits,
    eager_presets: bool,
    stock_names: set[str],
) -> deployed.Decision:
    """Stages 5 and 6 for one cell, on its confirmation rows: per precision chosen, the decision
    (`decide.decide_cell`), then per budget what is deployed (`deployed.deploy_cell`)."""
    choices = decide.decide_cell(run, budgets, rows, limits, eager_presets, stock_names)
    return deployed.deploy_cell(run, choices, budgets)


@dataclass
class Decided:
    """What the tune decided, over every cell."""

    entries: list[dict[str, Any]] = field(default_factory=list)
    """Preset entries, one per cell and budget that got a preset."""
    missing: list[dict[str, Any]] = field(default_factory=list)
    """Cells without a preset in their own precision, and why (the candidates' statuses)."""
    decisions: dict[str, str] = field(default_factory=dict)
    """Per cell (and budget), the decision in words."""


def run_decide(ctx: TuneContext, runs: dict[Cell, CellRun], confirmed: dict[str, dict[str, Any]]) -> Decided:
    """Stages 5 and 6, decide and deploy. Takes the confirmation's rows; per cell and budget, the
    preset (`decide_cell`), with its model entry and how many candidates were over a limit.
    Produces the decisions; each cell's log gets its first budget's preset."""
    found = Decided()
    thresholds = cstats.load_thresholds()
    for run in runs.values():
        doubted = decide.doubted_cell(run, confirmed, thresholds)
        if doubted is not None:  # never decided on a timing that cannot be trusted
            entry, why = doubted
            found.missing.append(entry)
            found.decisions[run.cell.name] = f"undecided: {cstats.UNDECIDED} {cstats.MARK} ({why})"
            run.log["undecided"] = entry["statuses"]
            continue
        decided = decide_cell(
            run, ctx.budgets, confirmed, ctx.opts.limits, ctx.opts.eager_presets, ctx.stock_names
        )
        found.decisions.update(decided.decisions)
        if decided.missing is not None:
            found.missing.append(decided.missing)
        for entry in decided.entries:
            entry["model_spec"] = dataclasses.asdict(run.cell.model)
            entry["over_budget"] = sum(
                1 for v in run.log.get("candidates", {}).values() if v.get("over_budget")
            )
            found.entries.append(entry)
        if decided.entries:
            first = decided.entries[0]
            run.log["preset"] = {k: first[k] for k in ("config", "precision", "source")}
    return found


def write(
    ctx: TuneContext, runs: dict[Cell, CellRun], decided: Decided, rung0_round: Round, knobs_round: Round
) -> list[dict[str, Any]]:
    """Stage 6, write. Takes the decisions and the cheap rounds' rows (what each setting gained,
    `setting_effects`); writes the presets, deployed.json and tune.json into OUT. Produces the
    what-won table."""
    log = {run.cell.name: run.log for run in runs.values()}
    checks = [c["eager_check"] for c in log.values() if "eager_check" in c]
    checks += [
        b["eager_check"] for c in log.values() for b in c.get("budgets", {}).values() if "eager_check" in b
    ]
    effects = eager.add_effects(
        setting_effects([*rung0_round.rows.values(), *knobs_round.rows.values()]), checks
    )
    won = what_won(decided.entries, effects)
    data = preset_document(decided.entries, decided.missing, list(rung0_round.rows.values()), ctx.opts.limits)
    data["what_won"] = won
    out = ctx.out
    with refusal_stops(out, f"every job's row is saved, but not the presets nor {TUNE_FILE}", ctx.resume):
        write_preset_files(out, data)
        durable_write(
            out.join(DEPLOYED_FILE), json.dumps(deployed.summary(decided.entries), indent=1, default=str)
        )
        document = tune_document(
            ctx.spec, ctx.opts, ctx.budgets, ctx.pruned, effects_document(effects), won, ctx.jobs_run, log
        )
        durable_write(out.join(TUNE_FILE), json.dumps(document, indent=1, default=str))
    return won


def summarize(
    ctx: TuneContext, runs: dict[Cell, CellRun], decided: Decided, won: list[dict[str, Any]]
) -> TuneSummary:
    """What the tune decided, for the command to print."""
    sources = [e["source"] for e in decided.entries]
    summary = deployed.summary(decided.entries)
    return TuneSummary(
        out_dir=ctx.out,
        cells=len(runs),
        tuned=sources.count("tuned"),
        stock=sources.count("stock"),
        no_preset=len(decided.missing),
        eager=sources.count("eager"),
        jobs=ctx.jobs_run,
        wall_s=time.monotonic() - ctx.started,
        decisions=decided.decisions,
        what_won=won,
        pruned=ctx.pruned,
        deployed=summary,
        budgets=[b.name for b in ctx.budgets],
        time_went=efficiency.render(ctx.timed_rows),
        harness_errors=dict(ctx.harness_errors),
        resume_command=ctx.resume,
    )
