"""A confirmation that cannot tell is extended (`orchestrator.tune.search.run_extend`): where the
decision refused a speedup of at least `confirm_extend_gain` for an interval that did not lie
above 1, every confirmation job of the cell runs again in more fresh processes, and the decision
rests on all of them pooled (`workers.repeats.pool`). The rounds' rows are hand-built, as in
tests/tune/test_deployed.py; the round that runs them is the one every round uses (its real run on
Ray: tests/integration/test_tune.py)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from compiler.job import MeasureSpec
from compiler.statistics.thresholds import THRESHOLDS_ENV
from orchestrator.fleet.options import SweepOptions
from orchestrator.tune import confirm, rung0, rung1, search
from orchestrator.tune import knobs as knobs_stage
from orchestrator.tune.cells import CellRun
from orchestrator.tune.plan import TuneOptions
from orchestrator.tune.space import candidates
from store.rows import make_row
from tests.conftest import _result
from tests.tune.test_deployed import BUDGETS, CELL, KNOBS, LIMITS, NAMES, RUNG0, accuracy, cheap
from tests.tune.test_tune import RESNET, STOCK, make_job_for
from workers.repeats import pool

CALLS = 30


def spread_row(job, compiled: list[float], eager: list[float], baseline: list[float] | None = None):
    """A row whose processes' medians are the given ones, one process per entry (calls within a
    process vary by 1%)."""
    rng = np.random.default_rng(len(compiled) * 7 + int(compiled[0] * 100))

    def side(centers):
        return [float(c * (1 + 0.01 * x)) for c in centers for x in rng.standard_normal(CALLS)]

    extra = (
        {"baseline_samples_ms": side(baseline), "baseline_ms": float(np.median(baseline))} if baseline else {}
    )
    result = _result(
        "ok",
        float(np.median(eager)),
        float(np.median(compiled)),
        compiled_samples_ms=side(compiled),
        eager_samples_ms=side(eager),
        samples_per_repeat=[CALLS] * len(compiled),
        repeats=len(compiled),
        **accuracy(job.dtype),
        **extra,
    )
    return make_row(job, result, run_id="r")


def test_pooled_rows_hold_every_process_and_the_worst_accuracy():
    job = make_job_for(CELL, next(iter(candidates(STOCK, RESNET, "cuda", "fp32", (), (), ()))), None)
    a = spread_row(job, [4.0, 6.0], [9.0, 9.2])
    b = spread_row(job, [4.1, 3.9, 4.0], [9.1, 8.9, 9.0])
    b["fp64_max_rel_err"] = 5e-3
    got = pool([a, b])
    assert got["repeats"] == 5 and got["samples_per_repeat"] == [CALLS] * 5
    assert got["compiled_samples_ms"] == a["compiled_samples_ms"] + b["compiled_samples_ms"]
    assert got["compiled_ms"] == pytest.approx(float(np.median(got["compiled_samples_ms"])))
    assert got["fp64_max_rel_err"] == 5e-3 and got["job_id"] == a["job_id"]
    # a row that did not time is left out; with one left, that one as it is
    failed = {**b, "status": "crash", "compiled_samples_ms": None}
    assert pool([a, failed]) == a


def _cell_run():
    """The cell of tests/tune/test_deployed.py, after its knobs round: bf16 ranked far ahead."""
    space = candidates(STOCK, RESNET, "cuda", "fp32", ("bf16",), ("freezing",), (), None)
    by_key = {c.key: c for c in space}
    run = CellRun(CELL, space)
    rows0 = [(by_key[k], cheap(make_job_for(CELL, by_key[k], None), ms)) for k, ms in RUNG0.items()]
    asked = rung0.promote(run, rows0, BUDGETS, LIMITS)
    knobs_stage.promote(
        run, [(c, cheap(make_job_for(CELL, c, None), KNOBS[c.key])) for c in asked], LIMITS, 20, NAMES
    )
    rung1.promote(run, rung1.survivor_results(run, []), LIMITS, NAMES)
    jobs = confirm.cell_jobs(run, lambda c, b: make_job_for(CELL, c, b))
    return run, {j.name: j for j in jobs}


def test_an_inconclusive_confirmation_is_extended_and_decided_on_every_process(monkeypatch):
    run, jobs = _cell_run()
    user, bf16 = "H100/resnet/bs16/fp32/ro/vs/default", "H100/resnet/bs16/bf16/ro+freezing/vs/ro"
    own = "H100/resnet/bs16/fp32/ro+freezing/vs/ro"
    # two processes a side that disagree: bf16 looks 1.6x faster than the stock user, not surely
    first = {
        user: spread_row(jobs[user], [9.0, 5.5], [12.0, 12.0], [10.0, 10.0]),
        own: spread_row(jobs[own], [9.0, 9.0], [12.0, 12.0], [9.0, 9.0]),
        bf16: spread_row(jobs[bf16], [3.5, 6.5], [6.0, 6.0], [4.0, 4.0]),
    }
    confirmed = {jobs[n].job_id: r for n, r in first.items()}
    ran: list = []

    def run_round(ctx, name, more, what):  # the extension's processes agree with the first ones' best
        ran.append((name, {j.name for j in more}, {j.measure.repeats for j in more}, what))
        centers = {
            user: ([9.0, 9.1, 8.9], [10.0] * 3),
            own: ([9.0] * 3, [9.0] * 3),
            bf16: ([3.5, 3.6, 3.4], [4.0] * 3),
        }
        return {j.job_id: spread_row(j, centers[j.name][0], [12.0] * 3, centers[j.name][1]) for j in more}

    monkeypatch.setattr(search, "run_round", run_round)
    opts = TuneOptions(SweepOptions(out_dir="o"), extend_repeats=3)
    ctx = SimpleNamespace(
        opts=opts, spec=SimpleNamespace(measure=MeasureSpec()), budgets=BUDGETS, stock_names=NAMES
    )
    decided_before = search.decide_cell(run, BUDGETS, confirmed, LIMITS, True, NAMES)
    assert decided_before.entries[1]["precision"] == "fp32"  # bf16 refused on its interval
    pooled = search.run_extend(ctx, {CELL: run}, confirmed)
    ((name, names, repeats, what),) = ran
    assert name == "extend" and names == set(first) and repeats == {3}, ran
    assert "3 confirmation jobs of 1 cell" in what and "extended" in run.log
    assert {pooled[jobs[n].job_id]["repeats"] for n in first} == {5}
    decided = search.decide_cell(run, BUDGETS, pooled, LIMITS, True, NAMES)
    bf16_entry = decided.entries[1]
    assert (bf16_entry["budget"], bf16_entry["precision"]) == ("bf16", "bf16")
    assert bf16_entry["vs_stock_compile"] > 2 and bf16_entry["vs_stock_compile_ci_low"] > 1


def test_a_conclusive_or_small_refusal_is_not_extended(monkeypatch):
    run, jobs = _cell_run()
    rows = {
        "H100/resnet/bs16/fp32/ro/vs/default": spread_row(
            jobs["H100/resnet/bs16/fp32/ro/vs/default"], [9.0, 9.0], [12.0] * 2, [10.0] * 2
        ),
        "H100/resnet/bs16/fp32/ro+freezing/vs/ro": spread_row(
            jobs["H100/resnet/bs16/fp32/ro+freezing/vs/ro"], [9.0, 9.0], [12.0] * 2, [9.0] * 2
        ),
        "H100/resnet/bs16/bf16/ro+freezing/vs/ro": spread_row(
            jobs["H100/resnet/bs16/bf16/ro+freezing/vs/ro"], [3.5, 3.5], [6.0] * 2, [4.0] * 2
        ),
    }
    confirmed = {jobs[n].job_id: r for n, r in rows.items()}
    monkeypatch.setattr(
        search, "run_round", lambda ctx, name, more, what: {} if not more else pytest.fail(what)
    )
    ctx = SimpleNamespace(
        opts=TuneOptions(SweepOptions(out_dir="o")),
        spec=SimpleNamespace(measure=MeasureSpec()),
        budgets=BUDGETS,
        stock_names=NAMES,
    )
    assert search.run_extend(ctx, {CELL: run}, confirmed) == confirmed  # bf16 is sure; fp32's 1.0x is no gain
    ctx.opts = TuneOptions(SweepOptions(out_dir="o"), extend_repeats=0)
    assert search.run_extend(ctx, {CELL: run}, confirmed) is confirmed


def test_a_cell_whose_confirmation_timing_is_doubted_is_left_undecided(monkeypatch):
    """A confirmation row timed while other processes took its cores decides nothing: the cell goes
    to `no_preset`, undecided, with the job and its reason; the same rows trusted decide it."""
    monkeypatch.delenv(THRESHOLDS_ENV)  # the project's limits, not the suite's trusting ones
    run, jobs = _cell_run()
    user, bf16 = "H100/resnet/bs16/fp32/ro/vs/default", "H100/resnet/bs16/bf16/ro+freezing/vs/ro"
    own = "H100/resnet/bs16/fp32/ro+freezing/vs/ro"
    rows = {
        user: spread_row(jobs[user], [9.0, 9.1, 8.9], [12.0] * 3, [10.0] * 3),
        own: spread_row(jobs[own], [9.0] * 3, [12.0] * 3, [9.0] * 3),
        bf16: spread_row(jobs[bf16], [3.5, 3.6, 3.4], [6.0] * 3, [4.0] * 3),
    }
    for row in rows.values():
        row["host_other_share"] = [0.02] * 3
    rows[bf16]["host_other_share"] = [0.02, 0.61, 0.02]
    confirmed = {jobs[n].job_id: r for n, r in rows.items()}
    ctx = SimpleNamespace(opts=TuneOptions(SweepOptions(out_dir="o")), budgets=BUDGETS, stock_names=NAMES)
    found = search.run_decide(ctx, {CELL: run}, confirmed)
    assert found.entries == []
    ((missing,),) = [found.missing]
    assert missing["undecided"] == "timing doubted" and list(missing["statuses"]) == [bf16]
    assert "other processes took 61% of its cores" in missing["statuses"][bf16]
    assert found.decisions[CELL.name].startswith("undecided: timing doubted !")
    rows[bf16]["host_other_share"] = [0.02] * 3
    found = search.run_decide(ctx, {CELL: run}, confirmed)
    assert found.missing == [] and found.entries and "undecided" not in run.log.get("preset", {})
