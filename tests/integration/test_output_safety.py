"""A real sweep's output under abuse: a second driver on the same --out, SIGKILL then --resume,
damaged part files and run.json, strays, bad flags and a read-only copy. Row counts, job ids and
the bytes of every good file are compared before and after each case: nothing good is lost, and
no job whose rows are intact runs again."""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from orchestrator.cli import main
from store.schema import read_results
from tests.integration.conftest import bench_processes, orchestrate, planned_count, start_sweep

pytestmark = [
    pytest.mark.integration,
    # the CLI names stray files itself; the tests' own reads of such outputs need not
    pytest.mark.filterwarnings("ignore::store.integrity.StrayFileWarning"),
]

# The held model's jobs (planned after the MLP's, and run after them) build only once the test
# removes its hold file: the sweep is surely still running when the test kills it, however fast
# the MLP's jobs and however slow the second driver's refusal on a loaded machine. What is tested
# is the output, not Inductor: no config compiles C++ (an Inductor job took 4-5 s more), and
# every driver runs two jobs at a time, one core each.
SWEEP = """\
name: it-resume
models:
  - {id: python:workers.toy:mlp, name: mlp}
  - {id: python:tests.faulty:held, name: held}
batch_sizes: [1, 2]
configs:
  dynamo: {backend: eager}
  aot: {backend: aot_eager}
measure: {warmup: 1, iterations: 3, flops: false}
"""
PLANNED = 8
ONE_CORE_A_JOB = ("--cpus-per-job", "1")


@pytest.fixture(scope="module")
def killed_and_resumed(tmp_path_factory):
    """A sweep SIGKILLed mid-run (a second driver refused while it ran), then resumed: the
    output, and what each step printed."""
    root = tmp_path_factory.mktemp("safety")
    sweep = root / "sweep.yaml"
    sweep.write_text(SWEEP)
    out, scratch = root / "out", root / "scratch"
    scratch.mkdir()
    assert planned_count(sweep) == PLANNED

    hold = root / "hold"
    hold.touch()
    driver = start_sweep(
        sweep,
        out,
        scratch,
        *ONE_CORE_A_JOB,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=dict(os.environ, CO_TEST_HOLD=str(hold)),
    )
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and driver.poll() is None:
        if read_results(out, columns=["job_id"]).num_rows >= 2:
            break
        time.sleep(0.5)
    assert driver.poll() is None, "the sweep finished before it could be killed; make it longer"
    # a second driver on the same output while the first runs: refused, and nothing written
    second = orchestrate("sweep", str(sweep), "--out", str(out), "--resume", check=False)
    before_kill = read_results(out, columns=["job_id"]).num_rows
    assert 2 <= before_kill < PLANNED
    os.kill(driver.pid, signal.SIGKILL)
    driver.wait()

    # The job that was running dies with its Ray worker instead of running on as an orphan.
    deadline = time.monotonic() + 30
    while bench_processes(str(scratch)) and time.monotonic() < deadline:
        time.sleep(0.5)
    orphans = bench_processes(str(scratch))
    hold.unlink()  # the resume's held jobs build at once (its driver has no CO_TEST_HOLD anyway)
    # before resuming: the rows the killed driver left, and two more kinds of damage that must
    # cost nothing: run.json gone, a stray file among the parts
    left = rows_by_job(out)
    (out / "run.json").unlink()
    (out / "results" / "hardware=cpu" / "copy of part.parquet.bak").write_bytes(b"x")

    resumed = orchestrate(
        "sweep", str(sweep), "--out", str(out), "--resume", "--scratch", str(scratch), *ONE_CORE_A_JOB
    )
    return {
        "sweep": sweep,
        "out": out,
        "driver_pid": driver.pid,
        "second": second,
        "before_kill": before_kill,
        "left": left,
        "orphans": orphans,
        "resumed": resumed,
    }


def test_sigkill_then_resume_gives_exactly_the_planned_rows(killed_and_resumed):
    k = killed_and_resumed
    assert not k["orphans"], "a job process outlived the killed driver"
    assert f"{PLANNED} jobs planned" in k["resumed"].stderr
    table = read_results(k["out"])
    ids = table.column("job_id").to_pylist()
    assert len(ids) == PLANNED and len(set(ids)) == PLANNED
    assert set(table.column("status").to_pylist()) == {"ok"}
    assert len(set(table.column("run_id").to_pylist())) == 2  # rows from before and after the kill
    # with run.json deleted and a stray file added: the rows left by the killed driver are
    # untouched and their jobs did not run again; the stray was named and left in place
    left = k["left"]
    assert (
        f"{PLANNED} jobs planned, {len(left)} already done, {PLANNED - len(left)} to run"
        in k["resumed"].stderr
    )
    after = rows_by_job(k["out"])
    assert all(repr(after[job_id]) == repr(row) for job_id, row in left.items())
    assert "copy of part.parquet.bak: not a part file" in k["resumed"].stderr
    assert (k["out"] / "results" / "hardware=cpu" / "copy of part.parquet.bak").exists()
    assert (k["out"] / "run.json").exists()


def test_a_second_driver_on_the_same_output_is_refused_naming_the_first(killed_and_resumed):
    k = killed_and_resumed
    second = k["second"]
    assert second.returncode == 2
    [line] = second.stderr.strip().splitlines()
    assert line.startswith(
        f"error: {k['out']} is in use by another orchestrate driver: pid {k['driver_pid']}"
    )
    assert f"on {socket.gethostname()}" in line and "sweep.yaml" in line
    # the killed driver's lock did not stick: the resume took it over and said so
    assert f"took over the lock of pid {k['driver_pid']}" in k["resumed"].stderr
    assert f"pid {k['driver_pid']} is not running" in k["resumed"].stderr


# --- damage on copies of that output ---------------------------------------------------------------


def snapshot(out: Path) -> dict[str, str]:
    """sha256 of every file under `out`, by relative path."""
    return {
        str(p.relative_to(out)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(out.rglob("*"))
        if p.is_file()
    }


def rows_by_job(out: Path) -> dict[str, dict]:
    rows = read_results(out).to_pylist()
    assert len(rows) == len({r["job_id"] for r in rows}), "a job_id has two rows"
    return {r["job_id"]: r for r in rows}


def parts(out: Path) -> list[Path]:
    return sorted((out / "results").glob("hardware=*/part-*.parquet"))


@pytest.fixture
def copy(killed_and_resumed, tmp_path):
    dest = tmp_path / "out"
    shutil.copytree(killed_and_resumed["out"], dest)
    return dest


def test_damaged_parts_and_run_json_are_named_then_quarantined_and_only_their_jobs_rerun(
    killed_and_resumed, copy, capsys
):
    before = rows_by_job(copy)
    assert len(before) == PLANNED
    # two part files, each with the rows of one or more jobs (two jobs at a time, and the sink
    # writes what finished together as one part); every job is cheap to rerun: no C++ compile
    truncated, flipped = parts(copy)[:2]
    lost = {
        *pq.read_table(truncated).column("job_id").to_pylist(),
        *pq.read_table(flipped).column("job_id").to_pylist(),
    }
    truncated.write_bytes(truncated.read_bytes()[:300])
    data = bytearray(flipped.read_bytes())
    data[40] ^= 0x01
    flipped.write_bytes(bytes(data))
    (copy / "results" / "NOTES.txt").write_text("rerun on the new driver")
    damaged = snapshot(copy)

    # readers name the damaged files and the fix, and change nothing
    for command in (["report", str(copy)], ["presets", str(copy)]):
        assert main(command) == 2
        *warnings, err = capsys.readouterr().err.strip().splitlines()
        assert len(warnings) == 2 and all(w.startswith("warning: ignoring ") for w in warnings), (
            warnings,
            err,
        )
        assert err.startswith(f"error: {copy}: damaged part file(s): "), err
        assert truncated.name in err and flipped.name in err and "--resume" in err
    # so does a sweep that was not asked to resume
    sweep = killed_and_resumed["sweep"]
    assert main(["sweep", str(sweep), "--out", str(copy)]) == 2
    assert truncated.name in capsys.readouterr().err
    assert snapshot(copy) == damaged
    # a run.json cut off mid-write is named first, before any part is read
    (copy / "run.json").write_text('{"runs": [{"run_id": ')
    damaged = snapshot(copy)
    for command in (["report", str(copy)], ["presets", str(copy)]):
        assert main(command) == 2
        [err] = capsys.readouterr().err.strip().splitlines()
        assert err.startswith(f"error: {copy}/run.json: damaged") and "--resume" in err, err
    assert snapshot(copy) == damaged

    resumed = orchestrate("sweep", str(sweep), "--out", str(copy), "--resume", *ONE_CORE_A_JOB)
    for name in (truncated.name, flipped.name):
        assert (
            f"results/hardware=cpu/{name} is damaged" in resumed.stderr
            and "its jobs run again" in resumed.stderr
        )
    assert f"{copy}/run.json: damaged" in resumed.stderr and "a new run.json starts now" in resumed.stderr
    assert f"ignoring {copy}/results/NOTES.txt" in resumed.stderr
    assert f"{PLANNED} jobs planned, {PLANNED - len(lost)} already done, {len(lost)} to run" in resumed.stderr

    after = rows_by_job(copy)
    assert set(after) == set(before)  # every job has exactly one row again
    for job_id, row in before.items():
        if job_id in lost:
            assert after[job_id]["run_id"] != row["run_id"]  # measured again
        else:
            assert repr(after[job_id]) == repr(row)  # untouched: not rerun, not rewritten (repr: NaN == NaN)
    [stamp] = os.listdir(copy / "quarantine")
    quarantined = copy / "quarantine" / stamp
    for path in (truncated, flipped):
        rel = path.relative_to(copy)
        assert snapshot(quarantined)[str(rel)] == damaged[str(rel)]  # moved whole, not deleted
    assert (quarantined / "run.json").read_text() == '{"runs": [{"run_id": '
    assert (copy / "results" / "NOTES.txt").read_text() == "rerun on the new driver"  # left alone
    assert main(["report", str(copy)]) == 0
    assert "warning: ignoring" in capsys.readouterr().err


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_bad_flags_read_only_and_file_outputs_leave_a_real_output_as_it_was(
    killed_and_resumed, copy, capsys, no_ray
):
    sweep = str(killed_and_resumed["sweep"])
    before, files = rows_by_job(copy), snapshot(copy)
    resume = ["sweep", sweep, "--out", str(copy), "--resume"]
    for flags in (
        ["--cpus-per-job", "0"],
        ["--max-attempts", "-1"],
        ["--timeout-cap", "abc"],
        ["--address", f"127.0.0.1:{closed_port()}"],
    ):
        assert main([*resume, *flags]) == 2, flags
        err = capsys.readouterr().err
        assert len(err.strip().splitlines()) == 1 and err.startswith("error: --"), err
    # bad sweep files (the fuzz test's hand-made cases) pointed at this output
    from tests.spec.test_bad_files import CASES, _materialize

    for name in ("a NUL byte", "an alias bomb", "batch size 2^40", "a directory"):
        bad = _materialize(copy.parent, name, CASES[name])
        assert main(["sweep", str(bad), "--out", str(copy), "--resume"]) == 2, name
        err = capsys.readouterr().err
        assert err.startswith(f"error: {bad}") and "Traceback" not in err, err
    # --out naming one of the output's own files
    part = parts(copy)[0]
    assert main(["sweep", sweep, "--out", str(part), "--resume"]) == 2
    assert "is a regular file, not a directory" in capsys.readouterr().err
    assert snapshot(copy) == files and repr(rows_by_job(copy)) == repr(before)

    # a read-only copy: resuming is refused in one line; reading it still works
    if os.geteuid() != 0:
        pytest.skip("the read-only half needs a read-only mount (root); the fast tier covers mode 555")
    ro = copy.parent / "ro"
    ro.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", str(ro)], check=True)
    try:
        shutil.copytree(copy, ro / "out")
        subprocess.run(["mount", "-o", "remount,ro", str(ro)], check=True)
        assert main(["sweep", sweep, "--out", str(ro / "out"), "--resume"]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"error: {ro / 'out'}: cannot write there (") and "Read-only file system" in err
        assert main(["report", str(ro / "out")]) == 0  # the table, and a warning for report.md
        assert "warning: could not write" in capsys.readouterr().err
        assert repr(rows_by_job(ro / "out")) == repr(before) and snapshot(ro / "out") == files
    finally:
        with contextlib.suppress(OSError):
            subprocess.run(["umount", str(ro)], check=False)
