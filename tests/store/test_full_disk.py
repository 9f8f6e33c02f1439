"""A full or read-only output disk, for real (a small tmpfs filled up or remounted read-only, and
/dev/full): the sink keeps its finished part files, removes the one it could not write and says
how big it was; the lock leaves no empty lock file behind; whole-file writes leave no dot-file;
a sweep that cannot even take its lock stops in one line that names the command to resume."""

from __future__ import annotations

import errno
import os
import shlex
from pathlib import Path

import pytest

from orchestrator.cli import main
from orchestrator.fleet.driver import SweepOptions, run_sweep
from orchestrator.spec.sweep import parse_spec
from store.lock import LOCK_FILE, OutputLock
from store.rows import make_row
from store.schema import read_results
from store.sink import ResultSink
from store.storage import WriteRefused, format_size

CPU_NAMES = ["cpu/resnet/bs1/fp32/default", "cpu/mlp/bs1/fp32/ro", "cpu/mlp/bs4/fp32/tuned"]
SWEEP = """\
name: full
models:
  - {id: python:workers.toy:mlp, name: mlp}
batch_sizes: [1, 2]
configs:
  default: {}
hardware: [cpu]
"""


def leftovers(root: Path) -> list[Path]:
    """Temporary files of ours: a part being written, a whole file being replaced."""
    return sorted([*root.rglob(".part-*"), *root.rglob(".*.tmp")])


def part_bytes(out: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(out.rglob("part-*.parquet"))}


@pytest.fixture
def rows(table_jobs, make_result):
    return [make_row(table_jobs[n], make_result(), run_id="run-1") for n in CPU_NAMES]


@pytest.fixture
def one_part(small_disk, rows):
    """(disk, out, sink, bytes of its parts): a sink on a 1 MiB disk that has written one part."""
    disk = small_disk(1 << 20)
    out = disk.path / "out"
    sink = ResultSink(out, max_delay_s=3600)
    sink.add(rows[0])
    sink.flush()
    assert sink.rows_written == 1
    return disk, out, sink, part_bytes(out)


def test_a_full_disk_keeps_written_parts_removes_the_partial_one_and_says_what_it_needed(one_part, rows):
    disk, out, sink, written = one_part
    assert len(written) == 1

    filler = disk.fill()
    sink.add(rows[1])
    sink.add(rows[2])
    with pytest.raises(WriteRefused) as info:
        sink.flush()
    refused = info.value
    assert refused.cause.errno == errno.ENOSPC
    where = Path(str(refused.where))
    assert where.parent == out / "results" / "hardware=cpu" and where.name.startswith("part-")
    assert not where.exists() and not leftovers(out), "the partial part file is left"
    assert part_bytes(out) == written, "a finished part file changed"
    assert sink.rows_written == 1
    # the part's size is its encoded size (the bytes the write needed), measured before writing
    assert 1000 < refused.needed < 1 << 20

    line = str(
        refused.stopped(
            "1 rows of this run saved, 2 of its jobs not recorded", "orchestrate sweep S --resume"
        )
    )
    assert line == (
        f"no space left on device writing {where}: 1 rows of this run saved, 2 of its jobs not recorded; "
        f"the part being written needed about {format_size(refused.needed)}, {format_size(disk.free())} free. "
        "Free space and resume with: orchestrate sweep S --resume"
    )
    assert "\n" not in line
    # the sink writes nothing more, even once there is room: rows are never written twice
    filler.unlink()
    with pytest.raises(WriteRefused):
        sink.close()
    assert part_bytes(out) == written
    assert read_results(out).column("job_id").to_pylist() == [rows[0]["job_id"]]


def test_a_read_only_disk_refuses_a_new_partition_and_says_to_make_it_writable(
    one_part, table_jobs, make_result
):
    disk, out, sink, written = one_part
    disk.read_only()
    try:
        gpu_row = make_row(table_jobs["A100/mlp/bs1/fp32/default"], make_result(), run_id="run-1")
        sink.add(gpu_row)  # hardware=A100/ does not exist yet: its mkdir is refused
        with pytest.raises(WriteRefused) as info:
            sink.flush()
    finally:
        disk.read_only(False)
    refused = info.value
    assert refused.cause.errno == errno.EROFS
    assert str(refused.where).startswith(str(out / "results" / "hardware=A100" / "part-"))
    line = str(refused.stopped("1 rows of this run saved, 1 of its jobs not recorded", "RESUME"))
    assert line.startswith(f"read-only file system writing {refused.where}: 1 rows of this run saved")
    assert line.endswith(". Make it writable and resume with: RESUME") and "free" not in line
    assert part_bytes(out) == written and not leftovers(out)


def test_a_lock_that_cannot_be_written_is_not_left_behind_empty(small_disk):
    disk = small_disk(64 << 10)
    out = disk.path / "out"
    out.mkdir()
    filler = disk.fill()
    with pytest.raises(OSError) as info:
        OutputLock.acquire(out, ["orchestrate", "sweep", "a.yaml"])
    assert info.value.errno == errno.ENOSPC
    # an empty lock file would refuse every sweep on this output for minutes (unreadable, too new)
    assert not (out / LOCK_FILE).exists() and not leftovers(out)
    filler.unlink()
    OutputLock.acquire(out).release()


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
def test_a_whole_file_write_that_fails_leaves_no_temporary_file(tmp_path):
    """Location.write_bytes (run.json, the lock's heartbeat, presets.json) in a process whose
    file-size limit is 4 bytes (RLIMIT_FSIZE, SIGXFSZ ignored): its write fails with EFBIG, as a
    full disk fails with ENOSPC, and its temporary dot-file is gone; no root needed."""
    import subprocess
    import sys

    child = (
        "import resource, signal, sys\n"
        "from store.storage import resolve\n"
        "signal.signal(signal.SIGXFSZ, signal.SIG_IGN)\n"
        "resource.setrlimit(resource.RLIMIT_FSIZE, (4, 4))\n"
        "try:\n"
        "    resolve(sys.argv[1]).join('run.json').write_bytes(b'{\"runs\": []}')\n"
        "except OSError as exc:\n"
        "    print(exc.errno)\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", child, str(tmp_path)],
        cwd=Path(__file__).resolve().parents[2],  # this checkout's orchestrator
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert proc.stdout.strip() == str(errno.EFBIG), proc.stderr
    assert sorted(os.listdir(tmp_path)) == [], "the temporary file was left"


def test_a_sweep_on_a_full_disk_stops_in_one_line_before_ray_starts(small_disk, tmp_path, capsys, no_ray):
    disk = small_disk(64 << 10)
    sweep = tmp_path / "sweep.yaml"
    sweep.write_text(SWEEP)
    out = disk.path / "out"
    disk.fill()
    assert main(["sweep", str(sweep), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.splitlines() == [
        f"error: no space left on device writing {out}: no job of this run was recorded; "
        f"{format_size(disk.free())} free. Free space and resume with: "
        f"orchestrate sweep {shlex.quote(str(sweep))} --out {out} --resume"
    ], err
    assert not (out / LOCK_FILE).exists() and not leftovers(disk.path)


def test_a_tune_rung_on_a_full_disk_names_the_tune_command_to_resume(small_disk, no_ray):
    """`orchestrate tune` runs each rung through run_sweep with its own resume command."""
    disk = small_disk(64 << 10)
    disk.fill()
    resume = f"orchestrate tune sweep.yaml --out {disk.path} --resume"
    opts = SweepOptions(out_dir=disk.path / "rung0", resume=True, resume_command=resume)
    with pytest.raises(WriteRefused) as info:
        run_sweep(parse_spec(SWEEP, "sweep.yaml"), opts, plan=lambda classes: [])
    assert str(info.value).endswith(f"Free space and resume with: {resume}")


@pytest.mark.parametrize(
    ("n", "text"),
    [
        (0, "0 B"),
        (1023, "1023 B"),
        (1024, "1.0 KiB"),
        (40 * 1024 + 300, "40 KiB"),
        (int(3.25 * 2**20), "3.2 MiB"),
    ],
)
def test_sizes_are_written_for_a_person(n, text):
    assert format_size(n) == text
