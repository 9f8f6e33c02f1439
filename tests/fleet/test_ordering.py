"""Longest-expected-first ordering: history first, then the heuristic."""

from __future__ import annotations

import dataclasses

from compiler.config import CompileConfig
from compiler.job import Job, MeasureSpec, ModelSpec
from orchestrator.fleet.ordering import History, heuristic_cost, longest_first


def job(
    config: str = "default",
    mode: str | None = None,
    bs: int = 1,
    model: str = "hf:microsoft/resnet-50",
    overrides: dict | None = None,
    hardware: str = "A100",
) -> Job:
    return Job(
        sweep="s",
        hardware=hardware,
        device="cuda",
        model=ModelSpec(id=model, name=model.rsplit("/", 1)[-1], overrides=overrides or {}),
        batch_size=bs,
        dtype="fp32",
        config=CompileConfig(name=config, mode=mode),
        measure=MeasureSpec(),
        timeout_s=60,
    )


def test_heuristic_puts_autotuning_and_big_batches_and_full_models_first():
    assert heuristic_cost(job(mode="max-autotune")) > heuristic_cost(job(mode="reduce-overhead"))
    assert heuristic_cost(job(mode="reduce-overhead")) > heuristic_cost(job())
    assert heuristic_cost(job(bs=16)) > heuristic_cost(job(bs=1))
    assert heuristic_cost(job()) > heuristic_cost(job(overrides={"depths": [1, 1, 1, 1]}))
    tuned = dataclasses.replace(job(), config=CompileConfig(name="t", options={"max_autotune": True}))
    assert heuristic_cost(tuned) == heuristic_cost(job(mode="max-autotune"))


def test_history_orders_measured_jobs_longest_first_before_unmeasured_ones():
    a, b, c = job(config="a"), job(config="b"), job(config="c", mode="max-autotune")
    history = History(
        [
            {
                "hardware": "A100",
                "model_id": a.model.id,
                "config": "a",
                "batch_size": 1,
                "subprocess_s": 10.0,
            },
            {
                "hardware": "A100",
                "model_id": b.model.id,
                "config": "b",
                "batch_size": 1,
                "subprocess_s": 30.0,
            },
            {
                "hardware": "A100",
                "model_id": b.model.id,
                "config": "b",
                "batch_size": 1,
                "subprocess_s": 50.0,
            },
            {"hardware": "T4", "model_id": a.model.id, "config": "a", "batch_size": 1, "subprocess_s": None},
        ]
    )
    assert history.expected_s(b) == 40.0
    assert history.expected_s(c) is None
    assert [j.config.name for j in longest_first([a, c, b], history)] == ["b", "a", "c"]


def test_a_job_with_processes_started_ahead_is_expected_to_take_its_wall_time():
    """With processes started ahead, `subprocess_s` counts each process's wait at its gate (a job
    waiting behind a long one: its whole run); the job held its slot for its `wall_s`."""
    short, long = job(config="short"), job(config="long")
    row = {"hardware": "A100", "model_id": short.model.id, "batch_size": 1}
    history = History(
        [
            {**row, "config": "short", "wall_s": 57.0, "subprocess_s": 1351.0},
            {**row, "config": "long", "wall_s": 320.0, "subprocess_s": 776.0},
        ]
    )
    assert history.expected_s(short) == 57.0
    assert [j.config.name for j in longest_first([short, long], history)] == ["long", "short"]


def test_history_falls_back_to_model_and_config_across_hardware_and_batch():
    history = History(
        [
            {
                "hardware": "T4",
                "model_id": "hf:microsoft/resnet-50",
                "config": "default",
                "batch_size": 4,
                "subprocess_s": 12.0,
            }
        ]
    )
    assert history.expected_s(job(hardware="A100", bs=1)) == 12.0


def test_without_history_order_is_by_heuristic_and_keeps_every_job():
    jobs = [job(config="d"), job(config="m", mode="max-autotune"), job(config="r", mode="reduce-overhead")]
    ordered = longest_first(jobs, History([]))
    assert [j.config.name for j in ordered] == ["m", "r", "d"]
    assert sorted(j.job_id for j in ordered) == sorted(j.job_id for j in jobs)


def test_timing_only_rows_order_jobs_but_do_not_count_as_done():
    a, b = job(config="a"), job(config="b")
    row = {"hardware": "A100", "model_id": a.model.id, "batch_size": 1}
    history = History(
        [{**row, "job_id": a.job_id, "config": "a", "subprocess_s": 5.0}],
        timing_only=[{**row, "job_id": b.job_id, "config": "b", "subprocess_s": 60.0}],
    )
    assert history.job_ids == {a.job_id}
    assert [j.config.name for j in longest_first([a, b], history)] == ["b", "a"]


def test_history_from_output_reads_other_directories_for_timing(tmp_path):
    from store.sink import ResultSink

    earlier, out = tmp_path / "earlier", tmp_path / "out"
    b = job(config="b")
    sink = ResultSink(earlier)
    sink.add(
        {
            "job_id": b.job_id,
            "run_id": "r1",
            "hardware": "A100",
            "model_id": b.model.id,
            "model": b.model.name,
            "dtype": b.dtype,
            "config": "b",
            "batch_size": 1,
            "status": "ok",
            "eager_ms": 2.0,
            "compiled_ms": 1.0,
            "speedup": 2.0,
            "subprocess_s": 42.0,
        }
    )
    sink.close()
    history = History.from_output(out, [earlier])
    assert history.job_ids == set()
    assert history.expected_s(b) == 42.0


def test_a_harness_failure_is_not_done_and_a_models_failure_is():
    """`--resume` runs a job whose only row is `harness_error` (its scratch could not be made, its
    Ray task raised, its worker was lost) again; a model's own failure is a result, never rerun.
    The rows still count as recorded: a run into that output without --resume is refused."""
    rows = [
        {"job_id": "a", "sweep": "s", "status": "harness_error"},
        {"job_id": "b", "sweep": "s", "status": "runtime_error"},
        {"job_id": "c", "sweep": "s", "status": "harness_error"},
        {"job_id": "c", "sweep": "s", "status": "ok"},  # run again by an earlier --resume
    ]
    history = History(rows)
    assert history.job_ids == {"b", "c"} and history.recorded == 4 and history.sweeps == {"s"}
