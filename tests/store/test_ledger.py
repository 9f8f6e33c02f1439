"""The commit ledger and the strict reader on hand-built outputs (real Parquet files, no Ray): what
the sink lists, foreign / damaged / missing parts, exact schemas with no cast, rows that break the
table's rules, a torn ledger line, a commit in flight, an object store, and the consumers that
must not raise TypeError on a null. The same damage on a real sweep's output, with `--resume`:
tests/integration/test_damaged_output.py."""

from __future__ import annotations

import json
import shutil
import time
import warnings

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from orchestrator.cli import main
from store import runlog
from store.integrity import DamagedOutputError
from store.ledger import LEDGER_DIR, load
from store.lock import OutputLock
from store.reader import LedgerWarning, LegacyOutputWarning, find_damaged, repair
from store.rows import make_row, side_rows
from store.schema import (
    RESULTS_SCHEMA,
    SCHEMA_VERSION_KEY,
    TABLES,
    read_results,
    read_table,
    table_spec,
)
from store.sink import ResultSink
from store.storage import StorageError, resolve

SPECS = [table_spec(t) for t in TABLES]
NAMES = ("cpu/mlp/bs1/fp32/default", "cpu/mlp/bs1/fp32/ro", "cpu/mlp/bs4/fp32/default")


@pytest.fixture
def out(tmp_path, table_jobs, make_result):
    """Three cpu jobs, one part file each, listed in the ledger."""
    out = tmp_path / "out"
    sink = ResultSink(out)
    for name in NAMES:
        sink.add(make_row(table_jobs[name], make_result(), run_id="r1", wall_s=1.0))
        sink.flush()
    return out


def parts(out):
    return sorted((out / "results" / "hardware=cpu").glob("part-*.parquet"))


def refusal(out) -> DamagedOutputError:
    with pytest.raises(DamagedOutputError) as info, warnings.catch_warnings():
        warnings.simplefilter("ignore", LegacyOutputWarning)
        read_results(out)
    return info.value


def rewrite(path, change):
    pq.write_table(change(pq.read_table(path)), path, write_page_checksum=True)


def test_the_sink_lists_each_part_with_its_digest_rows_and_job_ids(out, table_jobs):
    [segment] = (out / LEDGER_DIR).glob("*.jsonl")
    lines = [json.loads(line) for line in segment.read_text().splitlines()]
    assert sorted(e["part"] for e in lines) == [f"results/hardware=cpu/{p.name}" for p in parts(out)]
    import hashlib

    for e in lines:
        data = (out / e["part"]).read_bytes()
        assert e["sha256"] == hashlib.sha256(data).hexdigest() and e["rows"] == 1
    assert sorted(i for e in lines for i in e["job_ids"]) == sorted(table_jobs[n].job_id for n in NAMES)
    assert read_results(out).num_rows == 3


@pytest.mark.parametrize(
    ("damage", "kind"),
    [
        (lambda ps: shutil.copyfile(ps[0], ps[1]), "damaged"),  # replaced by another's bytes
        (lambda ps: shutil.copyfile(ps[0], ps[0].with_name("part-copy.parquet")), "foreign"),
        (lambda ps: ps[0].rename(ps[0].with_name("part-moved.parquet")), "missing"),
    ],
    ids=["replaced", "copied", "renamed"],
)
def test_parts_the_ledger_does_not_vouch_for_are_named(out, damage, kind):
    damage(parts(out))
    error = refusal(out)
    assert kind in {d.kind for d in error.damaged}
    assert "--resume" in str(error) and "\n" not in str(error)
    fixed = repair(resolve(out), SPECS, "T")
    assert read_results(out).num_rows == len({*read_results(out, ["job_id"]).column("job_id").to_pylist()})
    assert all(dest is None or dest.local_path.exists() for _, dest in fixed.moved)
    assert not find_damaged(resolve(out), SPECS)[0]


@pytest.mark.parametrize(
    ("edit", "says"),
    [
        (lambda e: e | {"rows": 2}, "lists 2 rows, the file (sha256 as listed) holds 1"),
        (lambda e: e | {"job_ids": ["0" * 20]}, "lists job_id(s) 000000000000, the file"),
        (lambda e: e | {"job_ids": []}, "lists job_id(s) none, the file"),
    ],
    ids=["rows", "job_ids", "no job_ids"],
)
def test_a_ledger_line_that_disagrees_with_its_matching_part_is_damage(out, edit, says):
    """The digest matches, so the part is as committed, but its line says other rows or job_ids:
    the line was edited. Nothing reads job_ids from the ledger instead of the part (a resume
    plans from the rows), but a reader must not vouch for a part through a line that lies."""
    [segment] = (out / LEDGER_DIR).glob("*.jsonl")
    lines = [json.loads(line) for line in segment.read_text().splitlines()]
    lines[0] = edit(lines[0])
    segment.write_text("".join(json.dumps(e) + "\n" for e in lines))
    [d] = refusal(out).damaged
    assert (d.rel, d.kind) == (lines[0]["part"], "damaged")
    assert says in d.reason and d.reason.endswith("its line was changed"), d.reason
    repair(resolve(out), SPECS, "T")  # the part to quarantine, its job to run again
    assert (out / "quarantine" / "T" / lines[0]["part"]).exists()
    assert read_results(out).num_rows == 2


def mistype_speedup(t):
    return t.set_column(t.schema.get_field_index("speedup"), "speedup", pa.array(["99.5"]))


def int_job_id(t):
    return t.set_column(0, "job_id", pa.array([7]))


def set_float(t, name, value):
    return t.set_column(t.schema.get_field_index(name), name, pa.array([value], pa.float64()))


def set_str(t, name, value):
    return t.set_column(t.schema.get_field_index(name), name, pa.array([value]))


def null_figures(t):
    i = t.schema.get_field_index("compiled_ms")
    return t.set_column(i, "compiled_ms", pa.nulls(1, pa.float64()))


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        (mistype_speedup, "speedup is string, not double"),
        (int_job_id, "job_id is int64, not string"),
        (
            lambda t: t.drop_columns(["compiled_ms", "max_rel_err"]),
            "missing column(s) compiled_ms, max_rel_err",
        ),
        (lambda t: t.append_column("unrelated", pa.array([1])), "unknown column(s) unrelated"),
        (null_figures, "status ok but compiled_ms null"),
        (
            lambda t: t.set_column(t.schema.get_field_index("status"), "status", pa.array(["fine"])),
            "status 'fine'",
        ),
        (
            lambda t: t.set_column(t.schema.get_field_index("model"), "model", pa.nulls(1, pa.string())),
            "model null",
        ),
        (
            lambda t: t.set_column(t.schema.get_field_index("job_id"), "job_id", pa.array([""])),
            "job_id null or empty",
        ),
        (
            lambda t: t.set_column(t.schema.get_field_index("model"), "model", pa.array(["m\x1b[31m\n|x"])),
            "model 'm\\x1b[31m\\n|x' holds a control character",
        ),
        (
            lambda t: t.set_column(
                t.schema.get_field_index("batch_size"),
                t.schema.field("batch_size"),
                pa.array([-5], pa.int32()),
            ),
            "batch_size -5 is below 1",
        ),
        (
            lambda t: t.set_column(t.schema.get_field_index("compiled_ms"), "compiled_ms", pa.array([-1.0])),
            "status ok but compiled_ms -1.0",
        ),
        # a derived figure may be null, never NaN: `report` showed `nanx`, exit 0, without a ledger
        (lambda t: set_float(t, "speedup", float("nan")), "status ok but speedup nan"),
        (
            lambda t: set_float(t, "speedup_vs_baseline", float("inf")),
            "status ok but speedup_vs_baseline inf",
        ),
        (lambda t: set_float(t, "compile_s", -2.0), "status ok but compile_s -2.0"),
        # valid Parquet, plausible values, but not what the writer wrote (found without a ledger too)
        (lambda t: set_str(t, "model", "resnet"), "is not its cell 'cpu/resnet/bs"),
        (lambda t: set_float(t, "speedup", 6.0), "speedup 6.0 is not eager_ms / compiled_ms = 2.0"),
        (  # the ratio overflows: no job measured that
            lambda t: set_float(set_float(t, "compiled_ms", 5e-324), "speedup", None),
            "speedup None is not eager_ms / compiled_ms = inf",
        ),
        (lambda t: t.slice(0, 0), "no rows (the sink writes no part without rows)"),
        (
            lambda t: t.set_column(
                t.schema.get_field_index("peak_mem_bytes"),
                t.schema.field("peak_mem_bytes"),
                pa.array([-5], pa.int64()),
            ),
            "peak_mem_bytes -5 is negative",
        ),
        (  # an older schema version may lack later columns, never an ok row's two figures
            lambda t: t.drop_columns(["eager_ms"]).replace_schema_metadata({SCHEMA_VERSION_KEY: b"1"}),
            "schema version 1: missing column(s) eager_ms",
        ),
    ],
    ids=[
        "string speedup",
        "int job_id",
        "missing",
        "extra",
        "null ok figure",
        "unknown status",
        "null model",
        "empty job_id",
        "control character in a model name",
        "batch size below 1",
        "negative latency",
        "NaN speedup",
        "infinite ratio",
        "negative compile time",
        "model renamed",
        "speedup off its figures",
        "a compiled time that overflows the speedup",
        "a part emptied of its rows",
        "negative count",
        "old version without a figure",
    ],
)
@pytest.mark.parametrize("ledger", [True, False], ids=["ledger", "pre-ledger"])
def test_schema_and_rows_are_exact_with_no_cast(out, change, reason, ledger):
    bad = parts(out)[0]
    rewrite(bad, change)
    if not ledger:
        shutil.rmtree(out / LEDGER_DIR)
    error = refusal(out)
    [d] = error.damaged
    assert d.rel == f"results/hardware=cpu/{bad.name}"
    assert (reason in d.reason) if not ledger else ("differ from the commit ledger" in d.reason)


def test_a_part_moved_to_another_hardware_folder_is_named_without_a_ledger(out):
    """Its rows would read as another class's: job_name, which starts with the class, says not."""
    shutil.rmtree(out / LEDGER_DIR)
    moved = out / "results" / "hardware=H100" / parts(out)[0].name
    moved.parent.mkdir()
    parts(out)[0].rename(moved)
    [d] = refusal(out).damaged
    assert d.rel == f"results/hardware=H100/{moved.name}" and "is not its cell 'H100/mlp/bs" in d.reason


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        (lambda rows: [dict(r, is_winner=True) for r in rows], "2 winner(s) among 2 candidates"),
        (
            lambda rows: [dict(r, time_ms=r["time_ms"] * (9 if r["is_winner"] else 1)) for r in rows],
            "1 winner(s)",
        ),
        (lambda rows: [dict(r, time_ms=float("nan")) for r in rows], "time_ms nan is not a time"),
        (lambda rows: [dict(r, op_index=-1) for r in rows], "op_index -1 is negative"),
        (lambda rows: [dict(r, input_shapes=None) for r in rows], "input_shapes null"),
    ],
    ids=["two winners", "winner not the fastest", "NaN time", "negative op index", "no input shapes"],
)
def test_kernel_choices_that_the_recorder_never_writes_are_named(
    tmp_path, table_jobs, make_result, change, reason
):
    from tests.integration.test_fleet import fake_kernel_choices

    job = table_jobs[NAMES[0]]
    sink = ResultSink(tmp_path, ledger=False)  # no ledger: only the row checks can tell
    choices = side_rows(job, {"kernel_choices": change(fake_kernel_choices())}, run_id="r1")
    sink.add(make_row(job, make_result(), run_id="r1"), choices)
    sink.close()
    with pytest.raises(DamagedOutputError) as info, warnings.catch_warnings():
        warnings.simplefilter("ignore", LegacyOutputWarning)
        read_table(tmp_path, "kernel_choices")
    [d] = info.value.damaged
    assert d.rel.startswith("kernel_choices/hardware=cpu/") and reason in d.reason, d.reason


def test_a_job_with_two_rows_names_both_parts_without_a_ledger(out):
    shutil.copyfile(parts(out)[0], parts(out)[0].with_name("part-0copy.parquet"))
    shutil.rmtree(out / LEDGER_DIR)
    error = refusal(out)
    assert len(error.damaged) == 2 and all("also has a row in" in d.reason for d in error.damaged)


def test_an_output_from_before_ledgers_reads_with_one_note_and_a_resume_lists_it(out, capsys, no_ray):
    shutil.rmtree(out / LEDGER_DIR)
    assert main(["report", str(out)]) == 0
    [note] = capsys.readouterr().err.splitlines()
    assert note.startswith(f"note: {out} was written before outputs had a commit ledger")
    assert repair(resolve(out), SPECS, "T").adopted == 3
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert read_results(out).num_rows == 3


def test_a_torn_ledger_line_lists_nothing_and_repair_rewrites_the_ledger(out):
    [segment] = (out / LEDGER_DIR).glob("*.jsonl")
    lines = segment.read_text().splitlines(keepends=True)
    segment.write_text("".join(lines[:2]) + lines[2][:30])  # a power cut mid-append
    with pytest.warns(LedgerWarning, match="unreadable line"), pytest.raises(DamagedOutputError) as info:
        read_results(out)
    assert [d.kind for d in info.value.damaged] == ["foreign"]
    fixed = repair(resolve(out), SPECS, "T")
    assert [d.kind for d, _ in fixed.moved] == ["foreign"]
    assert (out / "quarantine" / "T" / LEDGER_DIR / segment.name).read_text().endswith(lines[2][:30])
    assert read_results(out).num_rows == 2 and not load(resolve(out)).unreadable


def test_an_unlisted_part_is_in_flight_only_while_a_live_driver_writes(out):
    import os
    import subprocess
    import sys

    from tests.store.test_lock import HOLDER, REPO

    stray = shutil.copyfile(parts(out)[0], parts(out)[0].with_name("part-new.parquet"))
    driver = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(out)], cwd=REPO, stdout=subprocess.PIPE, text=True
    )
    try:  # another live process (a sweep) holds the output
        assert driver.stdout.readline().strip() == "held"
        assert read_results(out).num_rows == 3  # a commit in progress: left out, unread
        old = time.time() - 600
        os.utime(stray, (old, old))
        assert [d.kind for d in refusal(out).damaged] == ["foreign"]  # too old to be in flight
        os.utime(stray)
    finally:
        driver.kill()
        driver.wait()
    assert [d.kind for d in refusal(out).damaged] == ["foreign"]  # no writer: nothing is in flight
    with OutputLock.acquire(out):  # this process's own lock (`presets` holds it): no one else writes
        assert [d.kind for d in refusal(out).damaged] == ["foreign"]


def test_the_ledger_works_on_an_object_store(s3_bucket, table_jobs, make_result):
    uri = s3_bucket.uri("run")
    sink = ResultSink(uri)
    for name in NAMES[:2]:
        sink.add(make_row(table_jobs[name], make_result(), run_id="r1"))
        sink.flush()
    loc = resolve(uri)
    ledger = load(loc)
    assert len(ledger.segments) == 1 and len(ledger.entries) == 2
    assert read_results(uri).num_rows == 2
    first = next(iter(ledger.entries))
    loc.join("results", "hardware=cpu", "part-copy.parquet").write_bytes(loc.join(first).read_bytes())
    with pytest.raises(DamagedOutputError, match="part-copy.parquet .foreign"):
        read_results(uri)
    repair(loc, SPECS, "T")
    assert read_results(uri).num_rows == 2


# --- consumers given rows with nulls: no TypeError ---------------------------------------------


def test_reports_presets_and_kernels_take_null_fields(table_jobs, make_result):
    from orchestrator.tune.presets import class_defaults, derive_presets
    from reports.kernels import render as render_kernels
    from reports.kernels import summarize
    from reports.speedup import render

    good = make_row(table_jobs["cpu/mlp/bs1/fp32/default"], make_result(), run_id="r")
    bare = {name: None for name in RESULTS_SCHEMA.names} | {
        "status": "ok",
        "job_id": "x",
        "run_id": "r",
        "hardware": "cpu",
    }
    no_speedup = good | {"job_id": "y", "speedup": None, "config": None}
    table = pa.Table.from_pylist([good, bare, no_speedup], schema=RESULTS_SCHEMA)
    assert "3 results: 3 ok" in render(table)
    derive_presets(table)
    class_defaults(table.to_pylist())
    choice = {"job_id": "x", "op_index": 0, "hardware": None, "op": None, "input_shapes": None}
    choice |= {"input_dtypes": None, "from_cache": False, "is_winner": None, "time_ms": None, "kind": None}
    render_kernels(summarize([choice]))


@pytest.mark.parametrize("content", [b"", b"  \n", b"\x00\xff{", b"[" * 100_000])
def test_an_empty_garbage_or_nested_run_json_is_one_line(tmp_path, content):
    (tmp_path / "run.json").write_bytes(content)
    with pytest.raises(runlog.RunLogError) as info:
        runlog.read_runs(tmp_path)
    [line] = str(info.value).splitlines()
    assert line.startswith(f"{tmp_path}/run.json: damaged") and "--resume" in line and "none is lost" in line


def test_a_100_mb_run_json_is_refused_before_it_is_read(tmp_path):
    with open(tmp_path / "run.json", "wb") as f:
        f.truncate(100 * 2**20)
    started = time.monotonic()
    with pytest.raises(runlog.RunLogError, match="104857600 bytes, more than any run log"):
        runlog.read_runs(tmp_path)
    assert time.monotonic() - started < 1.0


def test_rows_of_another_sweep_than_run_json_records_are_foreign(out, capsys, no_ray):
    """A part copied in from another sweep's output, its ledger line with it: an output holds one
    sweep, and run.json says which (the rows' `sweep` column says theirs)."""
    run = {"run_id": "r0", "spec_file": "sweeps/vision.yaml", "spec": {"name": "vision"}}
    (out / "run.json").write_text(json.dumps({"runs": [run]}))
    error = refusal(out)
    assert {d.kind for d in error.damaged} == {"foreign"}
    assert "rows of sweep 'tables', while run.json records 'vision'" in error.damaged[0].reason
    repair(resolve(out), SPECS, "T")
    assert read_results(out).num_rows == 0 and len(list((out / "quarantine" / "T").rglob("*.parquet"))) == 3


@pytest.mark.parametrize("link", ["results", "results/hardware=cpu"])
def test_a_table_folder_that_links_to_another_output_is_refused_and_left_alone(
    out, tmp_path, link, capsys, no_ray
):
    """Through the link a report showed the other output's rows, and a resume moved its files into
    this output's quarantine."""
    other = tmp_path / "other"
    (other / link).parent.mkdir(parents=True, exist_ok=True)
    (other / link).symlink_to(out / link)
    before = sorted(p.name for p in parts(out))
    assert main(["report", str(other)]) == 2
    line = capsys.readouterr().err.strip()
    assert line.startswith(f"error: {other / link} is a symbolic link to {out / link}") and "\n" not in line
    with pytest.raises(StorageError, match="is a symbolic link"):
        repair(resolve(other), SPECS, "T")
    assert sorted(p.name for p in parts(out)) == before and not (other / "quarantine").exists()


@pytest.mark.parametrize("ledger", [True, False], ids=["ledger", "pre-ledger"])
def test_a_part_larger_than_any_the_sink_writes_is_named_unread(out, ledger):
    """A sparse 3 GiB file named like a part: reading it took 36 s and 8 GiB of memory."""
    if not ledger:
        shutil.rmtree(out / LEDGER_DIR)
    with open(parts(out)[0].with_name("part-huge.parquet"), "wb") as f:
        f.truncate(3 * 2**30)
    started = time.monotonic()
    [d] = refusal(out).damaged
    assert d.rel.endswith("part-huge.parquet") and time.monotonic() - started < 5
    assert (
        "not listed in the commit ledger" if ledger else "3221225472 bytes, larger than any part"
    ) in d.reason
