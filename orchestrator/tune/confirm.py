"""Stage 4 of a tune, the confirmation (`orchestrator.tune.search.run_confirm`, then `run_extend`).
Its rules, per cell: the jobs that time what rung 1 picked in fresh processes (`cell_jobs`, `plan`): the
stock user in processes of its own, and per precision picked its fastest candidate against its
fastest stock mode, in the same processes where their runtime settings are equal, else apart; and
where the decision on those rows refused a speedup of at least `confirm_extend_gain`
(thresholds.json) for its interval, every confirmation job of the cell again in more fresh
processes (`extension`), which the decision then pools with the first."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from compiler.job import Job, MeasureSpec
from orchestrator.tune.cells import CellRun, Picks, PrecisionJobs
from orchestrator.tune.space import Candidate
from workers.runner import plural

MakeJob = Callable[[Candidate, Candidate | None], Job]


def cell_jobs(run: CellRun, make: MakeJob) -> list[Job]:
    """The confirmation's jobs of the cell (`plan` of its picks), kept in `run.confirm`."""
    assert run.state is not None and run.picks is not None
    run.confirm = plan(run.picks, make)
    return [j for jobs in run.confirm.values() for j in jobs.jobs()]


def _same_runtime(a: Candidate, b: Candidate) -> bool:
    return a.config.runtime == b.config.runtime


def plan(picks: Picks, make: MakeJob) -> dict[str, PrecisionJobs]:
    """Per precision, the confirmation jobs of a cell's picks. The stock user (the stock config
    and eager under torch's defaults) is timed in processes of its own, with the other stock mode
    beside it where their runtime settings are equal; where the sweep has one stock mode and the
    own precision's candidate is timed beside the stock config, those processes time the stock
    user. A process keeps its first cuDNN plan per convolution (its key holds shapes, dtype, layout,
    `deterministic` and `allow_tf32`, not the benchmark flag), so configs whose runtime settings
    differ never share one."""
    found: dict[str, PrecisionJobs] = {}
    if picks.own is not None:
        own = picks.own
        jobs = PrecisionJobs(own)
        paired = own.candidate is not None and own.mode is not None and _same_runtime(own.candidate, own.mode)
        if own.mode is not None:
            second = picks.second if picks.second and _same_runtime(picks.second, own.mode) else None
            if second is not None or not paired:  # else the pair's processes time the stock user too
                jobs.mode = make(own.mode, second)
        if own.candidate is not None:
            if own.mode is not None and _same_runtime(own.candidate, own.mode):
                jobs.pair = make(own.candidate, own.mode)
            else:
                jobs.candidate = make(own.candidate, None)
        found[own.policy] = jobs
    for pick in picks.budgets.values():
        if pick.policy in found:
            continue
        jobs = PrecisionJobs(pick)
        if pick.candidate is not None and pick.mode is not None and _same_runtime(pick.candidate, pick.mode):
            jobs.pair = make(pick.candidate, pick.mode)
        else:
            jobs.candidate = make(pick.candidate, None) if pick.candidate is not None else None
            jobs.mode = make(pick.mode, None) if pick.mode is not None else None
        found[pick.policy] = jobs
    return found


def summary(runs, repeats: int) -> str:
    """What the confirmation round runs, for its progress line."""
    runs = list(runs)
    precisions = [p for run in runs for p in run.confirm.values()]
    jobs = sum(len(p.jobs()) for p in precisions)
    paired = sum(1 for p in precisions if p.pair is not None)
    apart = sum(
        1 for p in precisions if p.pair is None and p.candidate is not None and p.pick.mode is not None
    )
    return (
        f"{plural(len(runs), 'cell')}, {plural(jobs, 'job')} of {repeats} processes each: per cell a stock user "
        f"(its fastest stock config, the other stock mode and eager, torch's defaults; with one stock mode, in its "
        f"own precision's candidate's processes), and per precision chosen "
        f"the best candidate against its stock mode: in the same processes ({paired}), or apart, as they "
        f"differ in a runtime setting ({apart})"
    )


def refused_gain(run: CellRun) -> float | None:
    """The largest speedup estimate the cell's decision refused because its interval did not lie
    above 1 (`decide.note_refused`), in its own precision or under any budget; None: none. The
    notes of its own precision are taken, so that a decision made again notes afresh."""
    found = list(run.log.pop("refused", []))
    for blog in (run.log.get("budgets") or {}).values():
        found += blog.get("refused", [])
    return max(found) if found else None


def extension(run: CellRun, gain: float, repeats: int, measure: MeasureSpec) -> dict[str, Job] | None:
    """Where the cell's decision refused a speedup of at least `gain` because its interval did not
    lie above 1 (`refused_gain`): every confirmation job of the cell again in `repeats` more fresh
    processes (`measure`), by the id of the job each extends; None where it refused none as large."""
    refused = refused_gain(run)
    if refused is None or refused < gain:
        return None
    run.log["extended"] = f"a speedup of {refused:.3f}x refused on its interval: {repeats} more processes"
    return {
        job.job_id: dataclasses.replace(job, measure=measure)
        for jobs in run.confirm.values()
        for job in jobs.jobs()
    }
