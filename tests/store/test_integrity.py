"""Damaged output directories on hand-built tables: truncated, emptied, bit-flipped and mistyped
part files are named (never read as part of an answer), strays are ignored with a warning, and
quarantine moves files aside without losing a byte. The same cases on a real sweep's output, with
`sweep --resume`, are in tests/integration/test_damaged_output.py."""

from __future__ import annotations

import json
import os
import shutil
import warnings

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from orchestrator.cli import main
from store import runlog
from store.integrity import (
    DamagedOutputError,
    StrayFileWarning,
    list_parts,
)
from store.reader import LegacyOutputWarning, find_damaged, repair
from store.rows import make_row
from store.schema import TABLES, read_results, table_spec
from store.sink import ResultSink
from store.storage import resolve

SPECS = [table_spec(t) for t in TABLES]


@pytest.fixture
def out(tmp_path, table_jobs, make_result):
    """An output with four cpu jobs, one part file each."""
    out = tmp_path / "out"
    sink = ResultSink(out)
    for name in ("cpu/mlp/bs1/fp32/default", "cpu/mlp/bs1/fp32/ro", "cpu/mlp/bs4/fp32/default"):
        sink.add(make_row(table_jobs[name], make_result(), run_id="r1", wall_s=1.0))
        sink.flush()
    sink.add(make_row(table_jobs["cpu/mlp/bs4/fp32/ro"], make_result(), run_id="r1", wall_s=1.0))
    sink.close()
    return out


def parts(out):
    return sorted((out / "results" / "hardware=cpu").glob("part-*.parquet"))


def truncate(path):
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def flip_a_data_byte(path):
    """One bit of the first data page: the footer and the file length stay as they were."""
    data = bytearray(path.read_bytes())
    data[40] ^= 0x01
    path.write_bytes(bytes(data))


def mistype(path):
    """A file with the right names and the wrong type (a latency as text)."""
    table = pq.read_table(path).set_column(0, "job_id", pa.array([1]))  # job_id as an integer
    table = table.drop_columns(["compiled_ms"]).append_column("compiled_ms", pa.array(["fast"]))
    pq.write_table(table, path)


DAMAGE = {
    "truncated": (truncate, "Parquet"),
    "emptied": (lambda p: p.write_bytes(b""), "empty file"),
    "a flipped bit": (flip_a_data_byte, ""),
    "mistyped": (mistype, ""),
}


@pytest.mark.parametrize("ledger", [True, False], ids=["ledger", "pre-ledger"])
@pytest.mark.parametrize("kind", list(DAMAGE))
def test_a_damaged_part_is_named_not_read_around(out, kind, ledger):
    """With a ledger, the digest catches every one; without (an old output), the file's own checks."""
    damage, reason = DAMAGE[kind]
    bad = parts(out)[1]
    damage(bad)
    if not ledger:
        shutil.rmtree(out / "_ledger")
    with pytest.raises(DamagedOutputError) as info, warnings.catch_warnings():
        warnings.simplefilter("ignore", LegacyOutputWarning)
        read_results(out)
    message = str(info.value)
    reason = "its bytes differ from the commit ledger's" if ledger else reason
    assert f"results/hardware=cpu/{bad.name}" in message and reason in message
    assert "--resume" in message and "quarantine" in message
    assert [d.loc.path for d in info.value.damaged] == [str(bad)]
    found, strays, *_ = find_damaged(resolve(out), SPECS)
    assert [d.rel for d in found] == [f"results/hardware=cpu/{bad.name}"] and strays == []


def test_checksums_catch_the_bit_flip_that_plain_parquet_reads_as_data(out):
    bad = parts(out)[0]
    flip_a_data_byte(bad)
    pq.read_table(bad, page_checksum_verification=False)  # without checksums: "fine"
    with pytest.raises(DamagedOutputError):
        read_results(out)


def test_strays_are_ignored_with_a_warning_naming_each(out):
    (out / "results" / "notes.txt").write_text("ran on the new driver")
    (out / "results" / "hardware=cpu" / "README").write_text("x")
    (out / "results" / "copy").mkdir()
    (out / "results" / "copy" / "part-1.parquet").write_bytes(parts(out)[0].read_bytes())
    (out / "results" / "hardware=cpu" / ".part-inflight.parquet").write_bytes(b"half")
    (out / "results" / "hardware=cpu" / "_SUCCESS").write_text("")  # another tool's marker: silent
    # a part renamed out of sight, and a folder where a part belongs: their rows are gone, so named
    (out / "results" / "hardware=cpu" / "_part-hidden.parquet").write_bytes(parts(out)[0].read_bytes())
    (out / "results" / "hardware=cpu" / "part-folder.parquet").mkdir()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        table = read_results(out)
    assert table.num_rows == 4
    named = sorted(str(w.message).split(":")[0] for w in caught if w.category is StrayFileWarning)
    strays = ("copy/part-1.parquet", "hardware=cpu/README", "notes.txt", "hardware=cpu/_part-hidden.parquet")
    assert named == sorted(
        f"ignoring {out}/results/{rel}" for rel in (*strays, "hardware=cpu/part-folder.parquet")
    )


def test_quarantine_moves_files_whole_and_the_rest_reads(out):
    bad = parts(out)[2]
    truncate(bad)
    content = bad.read_bytes()
    [(found, dest)] = repair(resolve(out), SPECS, stamp="T1").moved
    rel = found.rel
    assert rel == f"results/hardware=cpu/{bad.name}"
    assert dest.path == str(out / "quarantine" / "T1" / "results" / "hardware=cpu" / bad.name)
    assert not bad.exists() and (out / "quarantine" / "T1" / rel).read_bytes() == content
    assert read_results(out).num_rows == 3  # quarantine/ is not a table folder


def test_report_and_presets_name_the_damaged_file_and_the_fix(out, capsys, no_ray):
    bad = parts(out)[0]
    truncate(bad)
    for command in (["report", str(out)], ["presets", str(out)]):
        assert main(command) == 2, command
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith(f"error: {out}: damaged part file(s): results/"), err
        assert bad.name in err and "--resume" in err
    assert bad.exists(), "a reader must not move or delete anything"


def test_report_prints_a_stray_as_one_warning_line(out, capsys, no_ray):
    (out / "results" / "notes.txt").write_text("x")
    assert main(["report", str(out)]) == 0
    err = capsys.readouterr().err
    assert f"warning: ignoring {out}/results/notes.txt: not a part file" in err
    assert "Warning" not in err  # our line, not Python's warnings format


RUN_JSON_SHAPES = [
    '{"runs": [[]]}',
    '{"runs": null}',
    '{"runs": [{"x": 1}]}',
    '[{"runs": []}]',
    '{"runs": [{"run_id": 5}]}',
    '{"runs": [{"run_id": "r1", "spec": [1]}]}',
]


@pytest.mark.parametrize(
    "text",
    ["{not json", '{"runs": 5}', "[]", '{"runs": [1]}', "\x00\x01", '{"other": []}', *RUN_JSON_SHAPES],
)
def test_a_damaged_run_json_is_named(tmp_path, text):
    (tmp_path / "run.json").write_text(text)
    with pytest.raises(runlog.RunLogError) as info:
        runlog.read_runs(tmp_path)
    assert str(info.value).startswith(f"{tmp_path}/run.json: damaged") and "--resume" in str(info.value)


@pytest.mark.parametrize("kind", ["directory", "deep"])
def test_a_run_json_that_is_a_directory_or_nested_too_deep_is_named(tmp_path, kind):
    if kind == "directory":
        (tmp_path / "run.json").mkdir()
    else:
        (tmp_path / "run.json").write_text("[" * 50_000 + "]" * 50_000)
    with pytest.raises(runlog.RunLogError) as info:
        runlog.read_runs(tmp_path)
    assert str(info.value).startswith(f"{tmp_path}/run.json: damaged") and "--resume" in str(info.value)


def test_damaged_parts_on_s3_are_named_and_quarantined(s3_bucket, table_jobs, make_result):
    import pyarrow.fs as pafs

    uri = s3_bucket.uri("run")
    sink = ResultSink(uri)
    for name in ("cpu/mlp/bs1/fp32/default", "cpu/mlp/bs1/fp32/ro"):
        sink.add(make_row(table_jobs[name], make_result(), run_id="r1"))
        sink.flush()
    loc = resolve(uri)
    files, _ = list_parts(loc.join("results"))
    files[0].write_bytes(files[0].read_bytes()[:100])
    with pytest.raises(DamagedOutputError, match=files[0].path.rsplit("/", 1)[-1]):
        read_results(uri)
    found, *_ = find_damaged(loc, SPECS)
    repair(loc, SPECS, stamp="T")
    assert read_results(uri).num_rows == 1
    moved = loc.join("quarantine", "T", found[0].rel)
    assert loc.fs.get_file_info(moved.path).type == pafs.FileType.File


@pytest.mark.parametrize("text", RUN_JSON_SHAPES)
def test_every_reader_refuses_a_run_json_of_the_wrong_shape(out, capsys, no_ray, text):
    """It parses, but is not the run log this tool writes: report and presets exited 0, reading
    around it (an export then failed on it with a traceback)."""
    (out / "run.json").write_text(text)
    for command in ("report", "presets", "kernels"):
        assert main([command, str(out)]) == 2, command
        [line] = capsys.readouterr().err.splitlines()
        assert line.startswith(f"error: {out}/run.json: damaged") and "--resume" in line, line
    assert (out / "run.json").read_text() == text, "a reader moves nothing"


def test_a_ledger_that_is_a_file_is_named_and_repair_moves_it(out, capsys, no_ray):
    """`_ledger` replaced by a regular file read as an output from before ledgers (exit 0, a note):
    nothing checked the parts against digests any more."""
    shutil.rmtree(out / "_ledger")
    (out / "_ledger").write_text("x")
    for command in ("report", "presets", "kernels"):
        assert main([command, str(out)]) == 2, command
        [line] = capsys.readouterr().err.splitlines()
        assert line.startswith(
            f"error: {out}/_ledger: a regular file, not the folder of the commit ledger"
        ), line
        assert "--resume" in line
    fixed = repair(resolve(out), SPECS, "T1")
    assert fixed.ledger_moved is not None
    assert fixed.ledger_moved[1].path == str(out / "quarantine" / "T1" / "_ledger")
    assert (out / "quarantine" / "T1" / "_ledger").read_text() == "x"
    assert fixed.adopted == 4 and (out / "_ledger").is_dir()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert read_results(out).num_rows == 4


CHILD = """
import os, sys
import pyarrow
from orchestrator.cli import main
before = len(os.listdir("/proc/self/task"))
code = main(["report", sys.argv[1]])
print(code, len(os.listdir("/proc/self/task")) - before)
"""


def test_a_part_copied_into_another_hardware_folder_exits_2_with_no_thread_left(out):
    """`report` printed the error, then `terminate called without an active exception`, exit 134
    (about one run in 50): Arrow's pool threads, started by the strict reader's reads, were alive
    when the interpreter exited. The reader starts none now (a count, so the race need not hit)."""
    import subprocess
    import sys
    from pathlib import Path

    copy = out / "results" / "hardware=H100"
    copy.mkdir()
    shutil.copy(parts(out)[0], copy)
    repo = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": str(repo)}
    child = subprocess.run(
        [sys.executable, "-c", CHILD, str(out)], capture_output=True, text=True, timeout=60, cwd=repo, env=env
    )
    assert child.stdout.split() == ["2", "0"], (child.stdout, child.stderr)
    [line] = child.stderr.splitlines()
    assert f"results/hardware=H100/{parts(out)[0].name} (foreign" in line, line
    cli = subprocess.run(
        [sys.executable, "-m", "orchestrator", "report", str(out)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=repo,
        env=env,
    )
    assert cli.returncode == 2 and cli.stderr.splitlines() == [line], cli.stderr


def _lock_fifo(out):
    os.mkfifo(out / ".orchestrate.lock")


def _deep_ledger_line(out):
    [segment] = (out / "_ledger").glob("*.jsonl")
    with open(segment, "a") as f:
        f.write("[" * 100_000 + "]" * 100_000 + "\n")


def _fifo_part(out):
    os.mkfifo(out / "results" / "hardware=cpu" / "part-fifo.parquet")


# an adversarial pass's finds: damage -> (exit code, the line the command prints first)
ODD_ENTRIES = {
    "lock is a folder": (
        lambda out: (out / ".orchestrate.lock").mkdir(),
        2,
        "error: {out}/.orchestrate.lock: a folder, not a lock this tool writes",
    ),  # IsADirectoryError, a traceback
    "lock is a FIFO": (_lock_fifo, 2, "error: {out}/.orchestrate.lock: not a regular file"),  # open() waited
    "a ledger line nested 100,000 deep": (_deep_ledger_line, 0, "warning: {out}/_ledger: unreadable line(s)"),
    "a FIFO named like a part": (
        _fifo_part,
        0,
        "warning: ignoring {out}/results/hardware=cpu/part-fifo.parquet",
    ),
}


@pytest.mark.parametrize("kind", list(ODD_ENTRIES))
def test_odd_entries_in_an_output_are_one_line_not_a_traceback_or_a_wait(out, capsys, no_ray, kind):
    damage, code, first = ODD_ENTRIES[kind]
    damage(out)
    for command in ("report", "presets"):
        assert main([command, str(out)]) == code, command
        err = capsys.readouterr().err
        assert err.startswith(first.format(out=out)) and "Traceback" not in err, err
        if code:
            assert err.count("\n") == 1, err


def test_export_names_a_model_entry_without_a_name_from_its_id(tmp_path):
    """A sweep may leave a model's name out (`- {id: hf:org/resnet-50}`): export's lookup of the
    run log's model entries raised a TypeError on it; entries of another shape are left out."""
    from orchestrator.tune.sweep_models import model_specs as _model_specs

    models = [
        {"id": "python:workers.toy:mlp"},
        {"x": 1},
        5,
        None,
        {"id": "hf:org/vit", "name": "v", "bogus": 1},
    ]
    (tmp_path / "run.json").write_text(json.dumps({"runs": [{"run_id": "r1", "spec": {"models": models}}]}))
    specs = _model_specs(runlog.read_runs(tmp_path))
    assert sorted(specs) == ["mlp", "v"]
    assert specs["mlp"].id == "python:workers.toy:mlp" and specs["v"].id == "hf:org/vit"
