"""What a tune runs, before any round does: its options (`TuneOptions`), its cells and the
candidates of each (`plan_space`), how each round measures (`rung_measure`), the job of a candidate
in a round (`make_job`), and rung 0's jobs (`rung0_jobs`), which `commands.common.check_plan_locally`
also makes from this machine's classes before Ray starts. `orchestrator.tune.search` runs the rounds.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from compiler.accuracy import STOCK_BUDGET, AccuracyBudget, searched
from compiler.capabilities import known
from compiler.job import Baseline, Job, MeasureSpec, software_stack
from orchestrator.fleet.inventory import HardwareClass
from orchestrator.fleet.inventory import resolve as resolve_classes
from orchestrator.fleet.options import SweepOptions
from orchestrator.spec.matrix import select_matching
from orchestrator.spec.sweep import SweepSpec
from orchestrator.tune.cells import Cell
from orchestrator.tune.effects import dropped_knobs
from orchestrator.tune.presets import Limits
from orchestrator.tune.space import BASE_MODES, KNOB_NAMES, Candidate, candidates, is_base
from store.layout import TUNE_FILE
from store.storage import Location, Target, checked

DEFAULT_ETA = 3
DEFAULT_CONFIRM_REPEATS = 3
DEFAULT_EXTEND_REPEATS = 2


class NothingToTune(ValueError):
    """The selection left no cell to tune."""


@dataclass
class TuneOptions:
    """A tune's options: the sweep options of the tune as a whole (`sweep`), and what only a tune
    has: the accuracy budgets, the search space, the limits and how the rounds keep and confirm
    candidates. Each round is a sweep with options derived from `sweep` (`round_sweep_options`)."""

    sweep: SweepOptions
    """OUT (`out_dir`), the cluster (`address`), `resume` (finish the tune in OUT), `only` (the
    candidates' job names), `cpus_per_job`, `timeout_cap_s`, `allow_missing`, `scratch_root`,
    `overlap` (every round's), `max_attempts` and `lock_clocks` (every round's), the shared compile
    cache (`shared_cache`: `orchestrate tune` turns it on unless --no-shared-cache; `cache_redis`, an
    existing server, else a private one for the tune), `argv`, `deadline` (the tune stops as on
    Ctrl-C) and `resume_command` (default: this sweep file with --resume). `history_dirs` is not
    used: a tune's rounds are ordered by their own plan."""
    accuracy: tuple[AccuracyBudget, ...] = ()
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
    limits: Limits = field(default_factory=Limits)
    """A candidate's compile-time and memory limits (--max-compile-s, --max-memory-mb)."""
    eta: int = DEFAULT_ETA
    """Rung 0 keeps the best 1/eta of each cell's candidates (at least one) for rung 1."""
    confirm_repeats: int = DEFAULT_CONFIRM_REPEATS
    extend_repeats: int = DEFAULT_EXTEND_REPEATS
    """Fresh processes an inconclusive confirmation is extended by (`search.run_extend`); 0: none."""
    eager_presets: bool = True
    """A cell's preset may be eager where its row timed eager faster (`orchestrator.tune.eager`);
    False (`--no-eager`) keeps the compiled config and only records the check."""
    cache_from: Location | None = None
    """An earlier run's output whose shared-cache snapshot (`orchestrator.fleet.cache.SNAPSHOT_FILE`)
    the private server starts with: its GEMM/conv timings and Triton configs (`--cache-from`)."""


def round_sweep_options(opts: TuneOptions, out: Location, resume: str, cache: Any) -> SweepOptions:
    """The sweep options every round of a tune into `out` runs with (a round's own folder is set
    per round): the tune's, resuming (the jobs a round's folder holds are skipped), on the tune's
    running shared cache (`cache`; None: none), with `resume` as the command that resumes the tune.
    The tune applies --only and --timeout-cap itself, to its candidates and their jobs."""
    return dataclasses.replace(
        opts.sweep,
        out_dir=out,
        resume=True,
        only=None,
        timeout_cap_s=None,
        history_dirs=[],
        shared_cache=cache is not None,
        cache_redis=cache,
        resume_command=resume,
    )


def rung_measure(
    measure: MeasureSpec,
    rung: str,
    confirm_repeats: int = DEFAULT_CONFIRM_REPEATS,
    extend_repeats: int = DEFAULT_EXTEND_REPEATS,
) -> MeasureSpec:
    """How each round measures: rung 0 cheaply (a quarter of the timed calls, in few rounds),
    rung 1 as the sweep says, the confirmation in `confirm_repeats` processes (at least 2, so
    its interval covers the spread between processes), its extension in `extend_repeats` more. One process each before that; FLOPs are
    not counted (the tuner compares latencies)."""
    one = dataclasses.replace(measure, flops=False, warm_compile=False, repeats=1)
    if rung == "rung0":
        return dataclasses.replace(
            one, iterations=max(10, measure.iterations // 4), rounds=max(2, min(measure.rounds, 4))
        )
    if rung == "rung1":
        return one
    if rung == "extend":  # more processes of the confirmation's jobs, pooled with its own
        return dataclasses.replace(one, repeats=max(1, extend_repeats))
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
        serving=spec.serving_of(cell.model),
    )


def _bases(bases: tuple[str, ...] | None, device: str) -> tuple[str, ...]:
    if bases is not None:
        return bases
    return BASE_MODES if device == "cuda" else ()  # a CPU max-autotune compile takes minutes


def pruned_knobs(prune_from: Target | None) -> dict[str, dict[str, str]]:
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


def plan_space(
    spec: SweepSpec, classes: dict[str, HardwareClass], opts: TuneOptions, pruned: dict[str, dict[str, str]]
) -> dict[Cell, list[Candidate]]:
    """Every candidate of every cell on `classes` (`orchestrator.tune.space.candidates`): the
    precisions the accuracy budgets let each class search (`compiler.accuracy.searched`), the
    knobs asked for that an earlier tune did not prune. A class the sweep names that is missing
    raises `MissingHardwareError`."""
    hardware = resolve_classes(spec.hardware, classes, opts.sweep.allow_missing)
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
    space left to search: the candidates `opts.sweep.only` selects by job name, with the bases their
    knobs are turned on. The tune's plan, made from the cluster's classes, or before Ray starts
    from this machine's (`commands.common.check_plan_locally`). An --only that selects nothing
    raises `NoJobMatches`."""
    measure0 = rung_measure(spec.measure, "rung0")
    every = {
        (cell, cand): make_job(spec, cell, cand, measure0, opts.sweep.timeout_cap_s, stack=stack)
        for cell, cands in space.items()
        for cand in cands
    }
    chosen = {
        j.job_id
        for j in select_matching(every.values(), opts.sweep.only, "the tune's {n} candidate jobs", "")
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


def tune_budgets(spec: SweepSpec, opts: TuneOptions) -> tuple[AccuracyBudget, ...]:
    """The accuracy budgets a tune decides under: --accuracy, else the sweep's, else `stock`."""
    return opts.accuracy or spec.accuracy or (AccuracyBudget(STOCK_BUDGET),)


def plan_locally(spec: SweepSpec, opts: TuneOptions) -> Callable[[dict[str, HardwareClass]], list[Job]]:
    """The tune's rung-0 plan from given classes, for the check before Ray starts."""
    return lambda classes: list(
        rung0_jobs(spec, plan_space(spec, classes, opts, pruned_knobs(opts.prune_from)), opts)[0].values()
    )
