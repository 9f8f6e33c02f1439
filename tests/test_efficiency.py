"""Where a sweep's time went (analysis/efficiency.py): the job efficiency and the largest phases,
printed at the end of a sweep and by `orchestrate report` (a real sweep's end is
tests/integration/test_sweep_cpu.py's)."""

from __future__ import annotations

from contextlib import closing

import pytest

from analysis import efficiency
from compiler.job import PHASES
from orchestrator.cli import main
from store.rows import make_row
from store.sink import ResultSink

JOB = "cpu/resnet/bs1/fp32/default"


def _phases(**seconds: float) -> dict[str, float]:
    return {f"phase_{p}_s": seconds.get(p, 0.0) for p in PHASES}


def _import_bound(job, make_result, run_id: str = "run-1") -> dict:
    """A job of three processes: 30 s of imports, 10 s compiling, 5 s timing, 1 s accuracy, in
    55 s of wall time; none started ahead (the node had no spare core)."""
    result = make_result(
        **_phases(start=1.0, imports=30.0, build=3.0, compile=10.0, timing=5.0, accuracy=1.0),
        started_ahead=[False, False, False],
        gate_wait_s=[0.0, 0.0, 0.0],
        ahead_hidden_s=0.0,
        ahead_off="no spare core: this node's 2 cores go to its 2 jobs of 1 core each",
    )
    return make_row(job, result, run_id=run_id, wall_s=55.0)


def _overlapped(job, make_result, run_id: str = "run-1") -> dict:
    """The same work with its two later processes started ahead: 26 s of their start-up (34 s
    of start-up in all) hidden, 26 s of wall time."""
    result = make_result(
        **_phases(start=1.0, imports=30.0, build=3.0, compile=10.0, timing=5.0, accuracy=1.0),
        started_ahead=[False, True, True],
        gate_wait_s=[0.0, 2.0, 0.5],
        ahead_hidden_s=26.0,
        ahead_cpus="1",
    )
    return make_row(job, result, run_id=run_id, wall_s=26.0)


def test_an_import_bound_sweep_says_so(table_jobs, make_result):
    e = efficiency.efficiency([_import_bound(table_jobs[JOB], make_result)])
    assert e.jobs == 1 and e.wall_s == 55.0
    assert e.efficiency == pytest.approx(16.0 / 55.0)  # compile, timing, accuracy
    assert e.bound == "import-bound"
    assert e.top() == [
        ("imports", pytest.approx(30 / 55)),
        ("compile", pytest.approx(10 / 55)),
        ("timing", pytest.approx(5 / 55)),
    ]
    text = efficiency.render([_import_bound(table_jobs[JOB], make_result)])
    assert text.splitlines() == [
        "job efficiency 29% (compiling, timing and checking accuracy) of 55 s of wall time over 1 job; "
        "import-bound: imports 55%, compile 18%, timing 9% of the wall time",
        "processes started ahead: 0 of the 2 after a job's first, hiding 0.0 s of start-up",
        "not started ahead in 1 job: no spare core: this node's 2 cores go to its 2 jobs of 1 core each",
    ]


def test_start_up_hidden_behind_the_process_before_leaves_the_wall(table_jobs, make_result):
    rows = [_overlapped(table_jobs[JOB], make_result)]
    e = efficiency.efficiency(rows)
    # 26 of the 34 s of start-up hid: each start-up phase keeps 8/34 of itself
    assert e.phases["imports"] == pytest.approx(30.0 * 8 / 34)
    assert e.phases["start"] == pytest.approx(1.0 * 8 / 34) and e.phases["compile"] == 10.0
    assert e.efficiency == pytest.approx(16.0 / 26.0) and e.bound == "compile-bound"
    assert e.other_s == pytest.approx(26.0 - 8.0 - 16.0)
    assert "processes started ahead: 2 of the 2 after a job's first, hiding 26.0 s" in efficiency.render(rows)
    assert "not started ahead" not in efficiency.render(rows)


def test_a_job_behind_another_on_its_gpu_hides_its_first_process_too(table_jobs, make_result):
    """GPU lanes (workers.lanes): the job's first process started while the job before it ran;
    all 34 s of start-up hid, and the wait for the GPU is not the job's wall time."""
    result = make_result(
        **_phases(start=1.0, imports=30.0, build=3.0, compile=10.0, timing=5.0, accuracy=1.0),
        started_ahead=[True, True, True],
        gate_wait_s=[9.0, 2.0, 0.5],
        ahead_hidden_s=34.0,
        lane_wait_s=40.0,
    )
    row = make_row(table_jobs[JOB], result, run_id="run-1", wall_s=17.0)
    e = efficiency.efficiency([row])
    assert e.efficiency == pytest.approx(16.0 / 17.0) and e.phases["imports"] == pytest.approx(0.0)
    assert (e.ahead, e.later, e.firsts) == (2, 2, 1)
    assert "2 of the 2 after a job's first and 1 job's first, started before the job had its GPU" in (
        efficiency.render([row])
    )


def test_rows_without_a_wall_time_are_left_out(table_jobs, make_result):
    job = table_jobs[JOB]
    unrun = make_row(job, {"status": "unsupported", "error": "no"}, run_id="r")
    assert efficiency.efficiency([unrun]) is None and efficiency.render([unrun]) == ""


def test_sweep_end_and_report_print_where_the_time_went(tmp_path, table_jobs, make_result, capsys):
    jobs = [table_jobs[JOB], table_jobs["cpu/mlp/bs4/fp32/default"]]
    with closing(ResultSink(tmp_path)) as sink:
        sink.add(_import_bound(jobs[0], make_result, run_id="run-1"))
        sink.add(_overlapped(jobs[1], make_result, run_id="run-2"))
    # the end of a sweep: the run's own rows
    first = efficiency.for_run(tmp_path, "run-1")
    assert first.startswith("job efficiency 29% ") and "over 1 job;" in first and "import-bound" in first
    assert efficiency.for_run(tmp_path, "run-0") == ""
    assert efficiency.for_run(tmp_path / "absent", "run-1") == ""
    # the report: every row of the output, in the terminal and in report.md
    assert main(["report", str(tmp_path)]) == 0
    printed = capsys.readouterr().out
    assert (
        "job efficiency 40% (compiling, timing and checking accuracy) of 81 s of wall time over 2 jobs"
        in printed
    )
    assert "processes started ahead: 2 of the 4 after a job's first, hiding 26.0 s of start-up" in printed
    report = (tmp_path / "report.md").read_text()
    assert "# Where the time went" in report and "| imports |" in report
