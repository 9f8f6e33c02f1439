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
from orchestrator.store import runlog
from orchestrator.store.integrity import DamagedOutputError
from orchestrator.store.ledger import LEDGER_DIR, load
from orchestrator.store.lock import OutputLock
from orchestrator.store.reader import LedgerWarning, LegacyOutputWarning, find_damaged, repair
from orchestrator.store.rows import make_row
from orchestrator.store.schema import RESULTS_SCHEMA, TABLES, read_results, table_spec
from orchestrator.store.sink import ResultSink
from orchestrator.store.storage import resolve

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
