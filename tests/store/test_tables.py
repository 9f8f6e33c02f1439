"""The results table: schema checks, the crash-safe Parquet sink, reading back, run.json."""

from __future__ import annotations

import json
import time
from contextlib import closing
from datetime import datetime, timezone

import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest

from store import runlog
from store.rows import failure_row, make_row
from store.schema import (
    PARTITION_COLUMNS,
    RESULT_COLUMNS,
    RESULTS_FILE_SCHEMA,
    RESULTS_SCHEMA,
    STATUSES,
    TABLES,
    SchemaError,
    check_row,
    read_results,
    read_table,
    rows_to_table,
)
from store.sink import ResultSink, finished_job_ids

MINIMAL = {"job_id": "j1", "run_id": "r1", "hardware": "cpu", "status": "ok"}


def part_files(out, hardware=None):
    base = out / "results"
    pattern = f"hardware={hardware}/part-*.parquet" if hardware else "hardware=*/part-*.parquet"
    return sorted(base.glob(pattern))


# --- schema ---------------------------------------------------------------------------------------


def test_schema_columns_have_descriptions_and_partition_is_excluded_from_files():
    assert RESULT_COLUMNS[0] == "job_id"
    assert len(set(RESULT_COLUMNS)) == len(RESULT_COLUMNS)
    for name, schema in TABLES.items():
        assert len(set(schema.names)) == len(schema.names), name
        assert schema.names[:3] in (["job_id", "run_id", "hardware"], ["job_id", "run_id"]), name
        for f in schema:
            assert f.metadata and f.metadata[b"description"], (name, f.name)
    assert PARTITION_COLUMNS == ("hardware",)
    assert "hardware" not in RESULTS_FILE_SCHEMA.names
    assert len(RESULTS_FILE_SCHEMA) == len(RESULTS_SCHEMA) - 1


def test_check_row_fills_missing_columns_with_none():
    row = check_row(dict(MINIMAL))
    assert tuple(row) == RESULT_COLUMNS
    assert row["job_id"] == "j1" and row["status"] == "ok"
    assert all(row[c] is None for c in RESULT_COLUMNS if c not in MINIMAL)


def test_check_row_rejects_unknown_columns():
    with pytest.raises(SchemaError, match="compiled_msec"):
        check_row({**MINIMAL, "compiled_msec": 1.0})


@pytest.mark.parametrize("status", ["okay", "OK", "failed", None, ""])
def test_check_row_rejects_bad_status(status):
    with pytest.raises(SchemaError, match="status"):
        check_row({**MINIMAL, "status": status})


@pytest.mark.parametrize("status", STATUSES)
def test_check_row_accepts_every_status(status):
    assert check_row({**MINIMAL, "status": status})["status"] == status


@pytest.mark.parametrize("key", ["job_id", "run_id", "hardware"])
def test_check_row_requires_identity_columns(key):
    with pytest.raises(SchemaError, match=key):
        check_row({**MINIMAL, key: None})


def test_rows_to_table_with_and_without_partitions():
    with_hw = rows_to_table([MINIMAL])
    assert with_hw.schema == RESULTS_SCHEMA
    assert with_hw.column("hardware").to_pylist() == ["cpu"]
    without = rows_to_table([MINIMAL], with_partitions=False)
    assert without.schema == RESULTS_FILE_SCHEMA
    with pytest.raises(SchemaError):
        rows_to_table([{**MINIMAL, "status": "nope"}])


# --- rows -----------------------------------------------------------------------------------------


def test_make_row_from_a_job_and_a_result(table_jobs, make_result):
    job = table_jobs["A100/resnet/bs4/fp32/tuned"]
    row = make_row(job, make_result(eager_ms=9.0, compiled_ms=3.0), run_id="run-1", wall_s=30.0)
    assert tuple(row) == RESULT_COLUMNS
    assert row["job_id"] == job.job_id
    assert row["job_name"] == "A100/resnet/bs4/fp32/tuned"
    assert (row["hardware"], row["model"], row["model_id"]) == ("A100", "resnet", "hf:microsoft/resnet-50")
    assert (row["batch_size"], row["dtype"], row["config"]) == (4, "fp32", "tuned")
    assert row["backend"] == "inductor" and row["mode"] is None
    assert json.loads(row["options"]) == {"max_autotune": True}
    assert row["speedup"] == pytest.approx(3.0)
    assert row["started_at"] == datetime(2025, 1, 2, 3, 4, 5, tzinfo=timezone.utc)
    assert (row["wall_s"], row["attempt"], row["run_id"]) == (30.0, 1, "run-1")


def test_make_row_drops_error_of_ok_rows_and_defaults_to_crash(table_jobs, make_result):
    job = table_jobs["cpu/mlp/bs1/fp32/default"]
    assert make_row(job, make_result(error="stray warning"), run_id="r")["error"] is None
    assert make_row(job, {}, run_id="r")["status"] == "crash"
    row = failure_row(job, "timeout", "killed after 300 s", run_id="r", wall_s=300.0)
    assert (row["status"], row["error"], row["compiled_ms"]) == ("timeout", "killed after 300 s", None)


# --- sink and reading back ------------------------------------------------------------------------


@pytest.fixture
def rows(table_jobs, make_result):
    """Five rows: three on A100, two on cpu, one of them failed."""
    names = [
        "A100/resnet/bs1/fp32/default",
        "A100/resnet/bs1/fp32/ro",
        "A100/mlp/bs4/fp32/tuned",
        "cpu/resnet/bs1/fp32/default",
        "cpu/mlp/bs1/fp32/ro",
    ]
    out = [make_row(table_jobs[n], make_result(), run_id="run-1", wall_s=1.0) for n in names[:-1]]
    out.append(
        make_row(table_jobs[names[-1]], make_result("compile_error", compiled_ms=None), run_id="run-1")
    )
    return out


def test_sink_writes_hive_partitioned_parquet(tmp_path, rows):
    sink = ResultSink(tmp_path, max_delay_s=60)
    for row in rows:
        sink.add(row)
    sink.close()
    assert (sink.rows_written, sink.files_written) == (5, 2)
    a100, cpu = part_files(tmp_path, "A100"), part_files(tmp_path, "cpu")
    assert len(a100) == 1 and len(cpu) == 1
    assert pq.read_metadata(a100[0]).num_rows == 3
    assert "hardware" not in pq.read_schema(a100[0]).names
    assert not list((tmp_path / "results").rglob(".*"))  # no temp files left behind


def _choice(row, winner: bool) -> dict:
    return {
        "job_id": row["job_id"],
        "run_id": row["run_id"],
        "hardware": row["hardware"],
        "op": "mm",
        "op_index": 0,
        "input_shapes": ["16x768", "768x3072"],
        "choice": "triton_mm_1" if winner else "mm",
        "kind": "triton_template" if winner else "extern",
        "time_ms": 0.05 if winner else 0.07,
        "rank": 1 if winner else 2,
        "is_winner": winner,
        "from_cache": False,
    }


def test_sink_writes_a_jobs_kernel_choices_before_its_result_row(tmp_path, rows):
    sink = ResultSink(tmp_path, max_delay_s=60)
    for row in rows:
        sink.add(row, {"kernel_choices": [_choice(row, True), _choice(row, False)]})
    sink.close()
    choices = read_table(tmp_path, "kernel_choices")
    assert choices.num_rows == 10 and set(choices.column("hardware").to_pylist()) == {"A100", "cpu"}
    assert set(choices.column("job_id").to_pylist()) == {r["job_id"] for r in rows}
    # written first: every kernel_choices file is older than (or as old as) every results file
    side = sorted(p.stat().st_mtime_ns for p in (tmp_path / "kernel_choices").rglob("part-*.parquet"))
    results = sorted(p.stat().st_mtime_ns for p in (tmp_path / "results").rglob("part-*.parquet"))
    assert side[-1] <= results[0]


def test_triton_kernel_rows_travel_from_a_result_to_their_table(tmp_path, table_jobs, make_result):
    """A job's `triton_kernels` (as compiler.kernels.triton_kernel_rows writes them on a GPU) reach
    their table keyed by the job, through side_rows and the sink."""
    from store.rows import make_row, side_rows

    job = table_jobs["A100/resnet/bs1/fp32/default"]
    kernel = {
        "kernel": "triton_poi_fused_relu_0",
        "heuristic": "POINTWISE",
        "size_hints": '{"x": 1024}',
        "config": '{"XBLOCK": 256}',
        "num_warps": 4,
        "num_stages": 1,
        "coordinate_descent": True,
        "found_by_coordesc": True,
        "autotune_ms": 12.5,
    }
    result = make_result(triton_kernels=[kernel, {**kernel, "kernel": "triton_red_fused_1", "config": None}])
    sink = ResultSink(tmp_path)
    sink.add(make_row(job, result, run_id="r1"), side_rows(job, result, run_id="r1"))
    sink.close()
    got = read_table(tmp_path, "triton_kernels").to_pylist()
    assert [r["kernel"] for r in got] == ["triton_poi_fused_relu_0", "triton_red_fused_1"]
    assert all(r["job_id"] == job.job_id and r["run_id"] == "r1" and r["hardware"] == "A100" for r in got)
    assert got[0]["found_by_coordesc"] and got[1]["config"] is None


def test_triton_kernel_rows_are_empty_without_triton_kernels():
    from compiler.kernels import autotuner_ids, triton_kernel_rows

    assert triton_kernel_rows(exclude=autotuner_ids()) == []  # CPU: Inductor emits C++, not Triton


def test_sink_refuses_an_unknown_table_and_a_row_without_its_job(tmp_path, rows):
    sink = ResultSink(tmp_path)
    with pytest.raises(ValueError, match="unknown side table 'kernels'"):
        sink.add(rows[0], {"kernels": []})
    with pytest.raises(SchemaError, match="kernel_choices row lacks job_id"):
        rows_to_table([{**_choice(rows[0], True), "job_id": None}], table="kernel_choices")
    assert read_table(tmp_path, "kernel_choices").num_rows == 0  # no folder yet: an empty table


def test_read_back_with_plain_pyarrow(tmp_path, rows):
    with closing(ResultSink(tmp_path)) as sink:
        for row in rows:
            sink.add(row)
    table = ds.dataset(tmp_path / "results", partitioning="hive").to_table()
    assert table.num_rows == 5
    assert sorted(table.column("hardware").to_pylist()) == ["A100"] * 3 + ["cpu"] * 2
    assert pa.types.is_string(table.schema.field("hardware").type)
    assert table.schema.field("batch_size").type == pa.int32()
    assert table.schema.field("started_at").type == pa.timestamp("us", tz="UTC")
    assert sorted(table.column("job_id").to_pylist()) == sorted(r["job_id"] for r in rows)


def test_read_back_with_read_results(tmp_path, rows):
    with closing(ResultSink(tmp_path)) as sink:
        for row in rows:
            sink.add(row)
    table = read_results(tmp_path)
    assert table.num_rows == 5
    assert table.schema.names == list(RESULT_COLUMNS)
    for name in RESULT_COLUMNS:
        assert table.schema.field(name).type == RESULTS_SCHEMA.field(name).type, name
    by_id = {r["job_id"]: r for r in table.to_pylist()}
    for row in rows:
        back = by_id[row["job_id"]]
        assert back["hardware"] == row["hardware"]
        assert back["status"] == row["status"]
        assert back["eager_peak_mem_bytes"] == 3 * 2**30  # beyond int32
        assert back["started_at"] == row["started_at"]
        assert back["options"] == row["options"]
    assert read_results(tmp_path, columns=["job_id", "hardware"]).column_names == ["job_id", "hardware"]


def test_read_results_of_a_directory_without_results(tmp_path):
    table = read_results(tmp_path / "nothing")
    assert table.num_rows == 0 and table.schema == RESULTS_SCHEMA
    assert read_results(tmp_path, columns=["job_id"]).column_names == ["job_id"]
    assert finished_job_ids(tmp_path) == set()


def test_leftover_dot_file_is_ignored_and_then_removed(tmp_path, rows):
    with closing(ResultSink(tmp_path)) as sink:
        for row in rows:
            sink.add(row)
    # A driver killed mid-write leaves a partial temp file next to the complete ones.
    stale = tmp_path / "results" / "hardware=cpu" / ".part-0123456789abcdef.parquet"
    stale.write_bytes(b"PAR1\x00\x01garbage, not a parquet file")
    stale_dir = tmp_path / "results" / "hardware=H100"
    stale_dir.mkdir()
    (stale_dir / ".part-feed.parquet").write_bytes(b"\x00" * 100)

    assert read_results(tmp_path).num_rows == 5
    assert ds.dataset(tmp_path / "results", partitioning="hive").to_table().num_rows == 5
    assert len(finished_job_ids(tmp_path)) == 5

    ResultSink(tmp_path).close()
    assert not stale.exists()
    assert not (stale_dir / ".part-feed.parquet").exists()
    assert read_results(tmp_path).num_rows == 5  # complete files are kept


def test_finished_job_ids(tmp_path, rows):
    with closing(ResultSink(tmp_path)) as sink:
        for row in rows:
            sink.add(row)
    assert finished_job_ids(tmp_path) == {r["job_id"] for r in rows}  # failed rows count as done


def test_sink_flushes_after_max_delay_on_tick(tmp_path, rows, monkeypatch):
    clock = [100.0]
    monkeypatch.setattr(time, "monotonic", lambda: clock[0])
    sink = ResultSink(tmp_path, max_rows=100, max_delay_s=1.0)
    sink.add(rows[0])
    assert part_files(tmp_path) == []
    assert read_results(tmp_path).num_rows == 0
    clock[0] += 0.9
    sink.tick()  # too early
    assert part_files(tmp_path) == []
    clock[0] += 0.2
    assert part_files(tmp_path) == []  # nothing happens without add/tick
    sink.tick()
    assert len(part_files(tmp_path)) == 1
    assert read_results(tmp_path).num_rows == 1
    sink.tick()  # empty buffer: no new file
    assert len(part_files(tmp_path)) == 1
    # The delay counts from the oldest waiting row: a later add past it flushes both.
    sink.add(rows[1])
    clock[0] += 0.6
    sink.add(rows[2])
    assert read_results(tmp_path).num_rows == 1
    clock[0] += 0.5
    sink.add(rows[3])
    assert read_results(tmp_path).num_rows == 4
    assert sink.files_written == 3  # rows[3] is on cpu, the others on A100


def test_sink_flushes_at_max_rows(tmp_path, rows):
    sink = ResultSink(tmp_path, max_rows=3, max_delay_s=3600)
    sink.add(rows[0])
    sink.add(rows[1])
    assert part_files(tmp_path) == []
    sink.add(rows[2])
    assert read_results(tmp_path).num_rows == 3
    sink.add(rows[3])
    assert read_results(tmp_path).num_rows == 3
    sink.close()
    assert read_results(tmp_path).num_rows == 4
    assert sink.rows_written == 4


def test_sink_close_writes_the_buffer(tmp_path, rows):
    sink = ResultSink(tmp_path, max_delay_s=3600)
    for row in rows:
        sink.add(row)
    assert read_results(tmp_path).num_rows == 0
    sink.close()
    assert read_results(tmp_path).num_rows == 5
    sink.close()  # idempotent
    assert read_results(tmp_path).num_rows == 5


def test_second_sink_appends_new_files(tmp_path, rows):
    for chunk in (rows[:2], rows[2:]):
        with closing(ResultSink(tmp_path)) as sink:
            for row in chunk:
                sink.add(row)
    assert read_results(tmp_path).num_rows == 5
    assert len(part_files(tmp_path, "A100")) == 2


# --- run.json -------------------------------------------------------------------------------------


def test_run_log_appends_and_finishes_entries(tmp_path, table_spec):
    out = tmp_path / "out"
    assert runlog.read_runs(out) == []
    runlog.start_run(out, "run-a", table_spec, ["orchestrate", "sweep"], {"cpu": {"slots": 1}}, 12, 0)
    runlog.start_run(out, "run-b", table_spec, ["orchestrate", "sweep", "--resume"], {}, 12, 5)
    runlog.finish_run(out, "run-a", {"ok": 11, "timeout": 1})

    data = json.loads((out / "run.json").read_text())
    runs = data["runs"]
    assert [r["run_id"] for r in runs] == ["run-a", "run-b"]
    a, b = runs
    assert a["counts"] == {"ok": 11, "timeout": 1}
    assert a["finished_at"] and a["interrupted"] is False
    assert b["finished_at"] is None and "counts" not in b
    assert (b["planned"], b["skipped"]) == (12, 5)
    assert b["argv"][-1] == "--resume"
    assert a["spec_file"] == "tables.yaml"
    assert a["spec"]["configs"]["ro"] == {"mode": "reduce-overhead"}
    assert a["hardware"] == {"cpu": {"slots": 1}}
    assert {"torch", "ray", "pyarrow"} <= set(a["versions"])
    assert a["host"]["cpus"] >= 1
    runlog.finish_run(out, "run-b", {"ok": 7}, interrupted=True)
    assert runlog.read_runs(out)[1]["interrupted"] is True
    assert sorted(p.name for p in out.iterdir()) == ["run.json"]


def test_a_job_efficiency_written_before_schema_13_reads_with_its_accuracy_phase_as_work(tmp_path, rows):
    """Older files' `job_efficiency` left the accuracy phase out, where the sweep's summary
    (`analysis.efficiency`) counted it: read back, it is recomputed as rows are written now, and a
    current file's value is left as written."""
    from store.schema import SCHEMA_VERSION, SCHEMA_VERSION_KEY

    part = tmp_path / "results" / f"hardware={rows[0]['hardware']}"
    part.mkdir(parents=True)
    phases = {"wall_s": 100.0, "phase_compile_s": 40.0, "phase_timing_s": 20.0, "phase_accuracy_s": 10.0}
    for name, row, version, written in (("old", rows[0], 12, 0.6), ("new", rows[1], SCHEMA_VERSION, 0.55)):
        table = pa.Table.from_pylist([{**row, **phases, "job_efficiency": written}], schema=RESULTS_SCHEMA)
        table = table.drop_columns(["hardware"]).replace_schema_metadata(
            {SCHEMA_VERSION_KEY: str(version).encode()}
        )
        pq.write_table(table, part / f"part-{name}.parquet")
    got = {r["job_id"]: r["job_efficiency"] for r in read_results(tmp_path).to_pylist()}
    assert got[rows[0]["job_id"]] == pytest.approx(0.7)  # (40 + 20 + 10) / 100
    assert got[rows[1]["job_id"]] == pytest.approx(0.55)


def test_files_carry_the_schema_version_and_older_files_read_alongside_newer_ones(tmp_path, rows):
    """History that lasts: a results file of the first schema (no version key, a subset of today's
    columns, as written before the phase, repeats and baseline columns existed) reads together with
    one the sink writes now; the columns it lacks are nulls."""
    from store.schema import SCHEMA_VERSION, file_schema_version

    part = tmp_path / "results" / f"hardware={rows[0]['hardware']}"  # its job's class: job_name says it
    part.mkdir(parents=True)
    old_columns = [
        "job_id",
        "run_id",
        "job_name",
        "model",
        "batch_size",
        "dtype",
        "config",
        "status",
        "eager_ms",
        "compiled_ms",
    ]  # the first schema had more; an ok row's two figures every version has (the reader requires them)
    old = pa.table({c: [rows[0][c]] for c in old_columns})
    old = old.cast(pa.schema([RESULTS_SCHEMA.field(c).remove_metadata() for c in old_columns]))
    pq.write_table(old.replace_schema_metadata(None), part / "part-old.parquet")
    with closing(ResultSink(tmp_path)) as sink:
        sink.add(rows[1])

    table = read_results(tmp_path)
    assert table.num_rows == 2 and table.schema == RESULTS_SCHEMA
    got = {r["job_id"]: r for r in table.to_pylist()}
    first = got[rows[0]["job_id"]]
    assert first["compiled_ms"] == rows[0]["compiled_ms"] and first["hardware"] == rows[0]["hardware"]
    assert first["baseline_ms"] is None and first["phase_compile_s"] is None and first["speedup"] is None
    # its fp32 turned TF32 off, as every fp32 before schema 9 did: it reads as fp32-strict, never as
    # the stock fp32 a row written now means
    assert rows[0]["dtype"] == rows[1]["dtype"] == "fp32"
    assert first["dtype"] == "fp32-strict" and first["job_name"].split("/")[3] == "fp32-strict"
    assert got[rows[1]["job_id"]]["dtype"] == "fp32"
    versions = sorted(
        file_schema_version(pq.read_metadata(f).metadata) for f in tmp_path.rglob("part-*.parquet")
    )
    assert versions == [1, SCHEMA_VERSION]
