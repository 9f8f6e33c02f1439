"""A finished output damaged in every way that keeps its files valid Parquet: a part
replaced by another's bytes, copied under a new name, renamed; a castable wrong type; a missing
and an extra column; a flipped byte in a column name in the footer; an `ok` row with every other
column null. Each one on an output with its commit ledger and (where a ledger is not what finds
it) on the same output from before ledgers:

- `report`, `presets` and `kernels` exit 2 with one `error:` line naming the file, no traceback;
- `sweep --resume` leaves exactly one row per planned job, and the removed bytes in quarantine.

The sweep is real (driver, scheduler, sink, a local Ray) with a synthetic task body, so each
resume takes seconds; tests/store/test_integrity.py has the byte-level cases (truncation, CRC).
"""

from __future__ import annotations

import functools
import hashlib
import io
import shutil
import warnings
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from orchestrator.cli import main
from orchestrator.fleet.driver import SweepOptions, run_sweep
from orchestrator.spec.sweep import parse_spec
from store.reader import LegacyOutputWarning
from store.runlog import RunLogError, read_runs
from store.schema import read_results, read_table
from tests.integration.test_fleet import fake_kernel_choices

pytestmark = [
    pytest.mark.integration,
    pytest.mark.filterwarnings("ignore::store.reader.LegacyOutputWarning"),
]

SWEEP = """\
name: damage
models:
  - {id: python:workers.toy:mlp, name: mlp}
batch_sizes: [1, 2, 4]
configs:
  a: {backend: eager}
  b: {mode: max-autotune}
"""
PLANNED = 6


def body(job_dict, threads, scratch_root=None, extra_path=(), lock_clocks=False):
    """A finished job's result, without compiling: figures, and two kernel choices."""
    return {
        "status": "ok",
        "eager_ms": 2.0,
        "compiled_ms": 1.0,
        "speedup": 2.0,
        "compile_s": 0.1,
        "max_abs_err": 0.0,
        "max_rel_err": 0.0,
        "started_at": "2026-11-25T10:00:00+00:00",
        "kernel_choices": fake_kernel_choices(),
    }


def sweep(out: Path, resume: bool = False) -> str:
    """The sweep into `out`, in this process's Ray; what the driver printed."""
    stream = io.StringIO()
    spec = parse_spec(SWEEP, "damage.yaml")
    run_sweep(spec, SweepOptions(out_dir=out, resume=resume), stream=stream, task_body=body)
    return stream.getvalue()


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    import ray

    from orchestrator.fleet import driver
    from store.sink import ResultSink

    # address="local": a bare ray.init() attaches to any cluster `ray start` left on this machine
    ray.init(
        address="local", num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False
    )
    try:
        out = tmp_path_factory.mktemp("damage") / "out"
        with pytest.MonkeyPatch.context() as patch:  # one part file per job, as slow jobs give
            patch.setattr(driver, "ResultSink", functools.partial(ResultSink, max_rows=1))
            sweep(out)
        yield out
    finally:
        ray.shutdown()


def parts(out: Path) -> list[Path]:
    return sorted((out / "results").glob("hardware=*/part-*.parquet"))


def planned_ids(out: Path) -> set[str]:
    return set(read_results(out, ["job_id"]).column("job_id").to_pylist())


def rewrite(path: Path, change) -> None:
    """The part file with its table changed by `change`, written as the sink writes it."""
    table = change(pq.read_table(path))
    pq.write_table(table, path, write_page_checksum=True)


def replace_column(table: pa.Table, name: str, values: pa.Array) -> pa.Table:
    return table.set_column(table.schema.get_field_index(name), name, values)


def flip_column_name(path: Path) -> None:
    data = bytearray(path.read_bytes())
    at = data.find(b"max_rel_err")
    data[at + 8] ^= 0x20  # max_rel_Err: the footer's schema, which no page checksum covers
    path.write_bytes(bytes(data))


def null_ok_row(table: pa.Table) -> pa.Table:
    return pa.table(
        {
            f.name: (pa.array(["ok"]) if f.name == "status" else pa.nulls(table.num_rows, f.type))
            for f in table.schema
        }
    )


# name -> damage(out) returning the files the error must name; whether a ledger is needed to see it
DAMAGE = {
    "part replaced by another's bytes": (
        lambda out: [shutil.copyfile(parts(out)[0], parts(out)[1]) and parts(out)[1]],
        False,  # without a ledger: the job_id has two rows
    ),
    "part copied under a new name": (
        lambda out: [Path(shutil.copyfile(parts(out)[0], parts(out)[0].with_name("part-copy.parquet")))],
        False,
    ),
    "part renamed": (
        lambda out: [parts(out)[0], parts(out)[0].rename(parts(out)[0].with_name("part-renamed.parquet"))],
        True,  # without a ledger a renamed part is the same rows: nothing to see
    ),
    "speedup as the string '99.5'": (
        lambda out: [
            rewrite(parts(out)[0], lambda t: replace_column(t, "speedup", pa.array(["99.5"] * t.num_rows)))
            or parts(out)[0]
        ],
        False,
    ),
    "job_id as an integer": (
        lambda out: [
            rewrite(parts(out)[0], lambda t: replace_column(t, "job_id", pa.array(range(t.num_rows))))
            or parts(out)[0]
        ],
        False,
    ),
    "a missing column": (
        lambda out: [rewrite(parts(out)[0], lambda t: t.drop_columns(["compiled_ms"])) or parts(out)[0]],
        False,
    ),
    "an extra column": (
        lambda out: [
            rewrite(parts(out)[0], lambda t: t.append_column("unrelated", pa.array([1] * t.num_rows)))
            or parts(out)[0]
        ],
        False,
    ),
    "a flipped byte in a column name": (
        lambda out: [flip_column_name(parts(out)[0]) or parts(out)[0]],
        False,
    ),
    "an ok row with every other column null": (
        lambda out: [rewrite(parts(out)[0], null_ok_row) or parts(out)[0]],
        False,
    ),
}
CASES = [(kind, True) for kind in DAMAGE] + [
    (kind, False) for kind, (_, needs) in DAMAGE.items() if not needs
]


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.parametrize(
    ("kind", "ledger"), CASES, ids=[f"{k}{'' if led else ' (pre-ledger)'}" for k, led in CASES]
)
def test_damage_is_named_by_every_reader_and_resume_repairs_it(finished, tmp_path, capsys, kind, ledger):
    out = tmp_path / "out"
    shutil.copytree(finished, out)
    planned = planned_ids(out)
    assert len(planned) == PLANNED and len(parts(out)) >= 2
    if not ledger:
        shutil.rmtree(out / "_ledger")
    damage, _ = DAMAGE[kind]
    named = damage(out)
    left = {p.relative_to(out): sha(p) for p in named if p.exists()}

    for command in ("report", "presets", "kernels"):
        assert main([command, str(out)]) == 2, (kind, command)
        err = capsys.readouterr().err
        assert "Traceback" not in err, err
        [line] = [x for x in err.splitlines() if x.startswith("error:")]
        assert err.splitlines()[-1] == line and line.startswith(f"error: {out}: damaged part file(s): "), err
        for path in named:
            assert f"results/{path.parent.name}/{path.name}" in line, (command, line)
        assert "--resume" in line, line

    printed = sweep(out, resume=True)
    for path in named:
        assert f"results/{path.parent.name}/{path.name} is " in printed, printed
    table = read_results(out)  # no DamagedOutputError, no warning
    ids = table.column("job_id").to_pylist()
    assert sorted(ids) == sorted(planned), "exactly one row per planned job"
    assert pc.all(pc.equal(table.column("speedup"), 2.0)).as_py()
    [stamp] = [p for p in (out / "quarantine").iterdir()]
    for rel, digest in left.items():  # the removed bytes, whole
        assert sha(stamp / rel) == digest
    assert list((out / "_ledger").glob("*.jsonl")), "the repaired output has a ledger"
    for command in ("report", "presets", "kernels"):
        assert main([command, str(out)]) == 0, command
    assert "error" not in capsys.readouterr().err


def test_an_output_from_before_ledgers_reads_with_one_note(finished, tmp_path, capsys):
    out = tmp_path / "out"
    shutil.copytree(finished, out)
    shutil.rmtree(out / "_ledger")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert read_results(out).num_rows == PLANNED
        assert read_table(out, "kernel_choices").num_rows == 2 * PLANNED
    assert {w.category for w in caught} == {LegacyOutputWarning}
    assert main(["report", str(out)]) == 0
    err = capsys.readouterr().err
    [note] = err.splitlines()
    assert note.startswith(f"note: {out} was written before outputs had a commit ledger")
    # a resume lists its parts: read again, no note; nothing ran again
    printed = sweep(out, resume=True)
    assert f"{PLANNED} already done" in printed and "part file(s) are listed in it now" in printed
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert read_results(out).num_rows == PLANNED


@pytest.mark.parametrize("content", ["empty", "garbage", "100 MB"])
def test_a_damaged_run_json_is_one_line_and_resume_loses_no_row(finished, tmp_path, capsys, content):
    out = tmp_path / "out"
    shutil.copytree(finished, out)
    before = sorted(read_results(out).to_pylist(), key=lambda r: r["job_id"])
    run_json = out / "run.json"
    if content == "empty":
        run_json.write_bytes(b"")
    elif content == "garbage":
        run_json.write_bytes(b"\x00\xff{garbage")
    else:
        with open(run_json, "wb") as f:
            f.truncate(100 * 2**20)
    for command in ("report", "presets"):  # the rows do not depend on it, but the output is damaged
        assert main([command, str(out)]) == 2, command
        [line] = capsys.readouterr().err.splitlines()
        assert line.startswith(f"error: {run_json}: damaged") and "--resume" in line, line
    with pytest.raises(RunLogError) as info:
        read_runs(out)
    [line] = str(info.value).splitlines()
    assert line.startswith(f"{run_json}: damaged") and "--resume" in line
    printed = sweep(out, resume=True)
    assert f"{out}/run.json: damaged" in printed and "a new run.json starts now" in printed
    after = sorted(read_results(out).to_pylist(), key=lambda r: r["job_id"])
    assert repr(after) == repr(before), "no row lost, none rerun"
    assert main(["report", str(out)]) == 0


def test_a_part_copied_into_another_hardware_folder_is_one_line_and_resume_repairs_it(
    finished, tmp_path, capfd
):
    """`cp` of a part into `results/hardware=H100/`: one error line from every reader (it aborted
    with `terminate called without an active exception`, exit 134, now and then), and a resume
    quarantines the copy and reruns nothing."""
    out = tmp_path / "out"
    shutil.copytree(finished, out)
    (out / "results" / "hardware=H100").mkdir()
    copy = Path(shutil.copy(parts(out)[0], out / "results" / "hardware=H100"))
    for command in ("report", "presets", "kernels"):
        assert main([command, str(out)]) == 2, command
        [line] = capfd.readouterr().err.splitlines()
        assert f"results/hardware=H100/{copy.name} (foreign" in line and "--resume" in line, line
    printed = sweep(out, resume=True)
    assert f"results/hardware=H100/{copy.name} is foreign" in printed and f"{PLANNED} already done" in printed
    assert sorted(read_results(out).column("hardware").to_pylist()) == ["cpu"] * PLANNED
