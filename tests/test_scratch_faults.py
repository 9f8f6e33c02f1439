"""A job's scratch that vanishes, fills up or turns read-only under a running job is the
harness's failure (`harness_error`, which `--resume` runs again), told from the model's own
failures by what the runner can check once the process has ended (`workers.scratch`,
`workers.outcome`); and no error that goes into a row keeps a terminal's colour codes.

Real job processes (the runner without Ray), a real tmpfs that fills up (root only: skipped
elsewhere), and the rules on the texts processes leave."""

from __future__ import annotations

import dataclasses
import errno
import json
import os
import re
import shutil
import threading
import time
from pathlib import Path

import pytest

from compiler.config import CompileConfig
from compiler.job import Job, MeasureSpec, ModelSpec
from orchestrator.fleet.scheduler import _short
from orchestrator.fleet.summary import SweepSummary, unfinished
from orchestrator.tune.summary import TuneSummary
from store.rows import failure_row
from tests.integration.conftest import bench_processes
from workers import scratch
from workers.runner import run_job
from workers.text import plain

RAY_ERROR = (
    "RayTaskError(ValueError): \x1b[36mray::execute_job()\x1b[39m (pid=5828, ip=192.0.2.2)\n"
    '  File "<string>", line 6, in f\nValueError: boom'
)


def _job(factory: str, overrides: dict | None = None) -> Job:
    return Job(
        sweep="scratch-faults",
        hardware="cpu",
        device="cpu",
        model=ModelSpec(id=f"python:tests.faulty:{factory}", name=factory, overrides=overrides or {}),
        batch_size=2,
        dtype="fp32",
        config=CompileConfig(name="c", backend="eager"),
        measure=MeasureSpec(warmup=1, iterations=3, flops=False),
        timeout_s=120.0,
    )


def _wait_for(found, what: str, seconds: float = 60.0):
    deadline = time.monotonic() + seconds
    while not (value := found()):
        assert time.monotonic() < deadline, f"no {what} within {seconds} s"
        time.sleep(0.05)
    return value


def _phase(result: Path) -> str | None:
    try:
        return json.loads(result.read_text()).get("phase")
    except (OSError, ValueError):
        return None


def test_a_scratch_removed_under_a_running_job_is_a_harness_error(tmp_path, monkeypatch):
    hold = tmp_path / "hold"
    hold.touch()
    monkeypatch.setenv("CO_TEST_HOLD", str(hold))  # the job waits in its build until it is gone
    root = tmp_path / "scratch"
    got: dict = {}
    runner = threading.Thread(target=lambda: got.update(run_job(_job("held"), 1, str(root))))
    runner.start()
    try:
        [where] = _wait_for(lambda: list(root.glob("job-*")), "job scratch")
        _wait_for(lambda: _phase(where / "result.json") == "build", "job process in its build")
        assert bench_processes(str(where))
        shutil.rmtree(where)  # as a cleaner of /tmp would, under the running job
    finally:
        hold.unlink()
        runner.join(120)
    assert got["status"] == "harness_error", got.get("error")
    # the process wrote its result again (which makes the directory anew); the job's file and its
    # log, which the runner put there, stay gone
    assert re.match(
        rf"the job's (scratch {where} vanished|(file|log) {where}/\S+ vanished from its scratch {where}) "
        r"while the job ran.*; --resume runs it again",
        got["error"],
    ), got["error"]


@pytest.mark.parametrize(
    ("code", "path", "status", "cause"),
    [
        (errno.ENOENT, "/nonexistent/co-weights.bin", "runtime_error", None),
        (errno.ENOSPC, "/nonexistent/co-out.bin", "runtime_error", None),
        (errno.ENOENT, "$TORCHINDUCTOR_CACHE_DIR/ab/kernel.py", "harness_error", "lost a file"),
        (errno.ENOSPC, "$TORCHINDUCTOR_CACHE_DIR/ab/kernel.so", "harness_error", "ran out of space"),
    ],
    ids=["enoent-elsewhere", "enospc-elsewhere", "enoent-in-scratch", "enospc-in-scratch"],
)
def test_an_os_error_is_the_harness_s_only_in_the_job_s_scratch(code, path, status, cause, tmp_path):
    root = tmp_path / "scratch"
    result = run_job(_job("os_error", {"errno": code, "path": path}), 1, str(root))
    assert result["status"] == status, result.get("error")
    message = f"[Errno {code}] {os.strerror(code)}"
    assert message in result["error"]
    if cause is None:  # the model's own failure: a result, never run again
        assert re.match(rf"\w+Error: {re.escape(message)}: '{path}'\n", result["error"]), result["error"]
    else:
        assert re.match(
            rf"the job's scratch {root}/job-\w+-\w+ {cause} \(\w+Error: \[Errno {code}\] .*\) while the job "
            rf"ran: runtime_error: \w+Error: {re.escape(message)}: '{root}/job-.*'; --resume runs it again",
            result["error"],
        ), result["error"]


def test_a_crash_s_output_tail_keeps_no_colour_codes():
    result = run_job(_job("colourful_crash"), 1)
    assert result["status"] == "crash"
    assert result["error"].startswith("job process exited with code 3 in phase 'build'"), result["error"]
    assert "error: the model gave up" in result["error"]
    assert "\x1b" not in result["error"]


def test_plain_strips_terminal_escapes_and_leaves_text_alone():
    assert plain(RAY_ERROR).startswith("RayTaskError(ValueError): ray::execute_job() (pid=5828")
    assert plain("\x1b]8;;http://x\x07link\x1b]8;;\x07 \x1b[2K\x1b(Bdone\x9b0m") == "link done"
    text = "[Errno 28] No space left on device: '/tmp/x' — 100% ~[]"
    assert plain(text) is text


def test_ray_errors_and_every_row_s_error_lose_their_colours():
    assert "\x1b" not in _short(RuntimeError(RAY_ERROR))
    cut = _short(RuntimeError("\x1b[31m" + "x" * 3000 + "\x1b[0m"), limit=100)
    assert "\x1b" not in cut and len(cut) == 105  # cut on the plain text: head, "\n...\n", tail
    row = failure_row(_job("held"), "harness_error", "the job's Ray task raised: " + RAY_ERROR, run_id="r")
    assert row["error"] == "the job's Ray task raised: " + plain(RAY_ERROR)


def test_a_full_or_read_only_scratch_is_told_by_its_filesystem(small_disk):
    disk = small_disk(4 << 20)
    where = disk.path / "job-abc"
    where.mkdir()
    assert scratch.failed(where, ["RuntimeError: the model's own failure"]) is None
    filler = disk.fill(leave=8 << 10)
    assert re.fullmatch(
        rf"the job's scratch {where} filled up \(\d+(\.\d)? KiB free of 4\.0 MiB\)", scratch.failed(where, [])
    ), scratch.failed(where, [])
    filler.unlink()
    disk.read_only()
    try:
        assert scratch.failed(where, []) == f"the job's scratch {where} turned read-only"
    finally:
        disk.read_only(False)


def test_errno_messages_count_only_where_they_name_the_scratch(tmp_path):
    where = tmp_path / "job-abc"
    where.mkdir()
    command = f"g++ {where}/inductor/ab/cab.cpp -shared -o {where}/inductor/ab/cab.so"
    ld = "/usr/bin/ld: final link failed: No space left on device"
    # a compiler that wrote into the scratch: its command names it, its error line does not
    assert "ran out of space" in scratch.failed(where, [f"CppCompileError: {command}\n{ld}"])
    assert scratch.failed(where, [f"{ld}\nin /data/out"]) is None  # nothing names the scratch
    lost = f"FileNotFoundError: [Errno 2] No such file or directory: '{where}/inductor/x.py'"
    assert "lost a file" in scratch.failed(where, ["", lost])
    # a missing file elsewhere, in a text that names the scratch (a compiled frame): the model's
    elsewhere = f"File \"{where}/inductor/ab/cab.py\", line 3\nFileNotFoundError: [Errno 2] No such file or directory: '/data/w.bin'"
    assert scratch.failed(where, [elsewhere]) is None
    assert scratch.failed(where, [f"No space left on device: '{where}-other/x'"]) is None  # another job's
    ro = f"OSError: [Errno 30] Read-only file system: '{where}/result.json'"
    assert "turned read-only" in scratch.failed(where, [ro])


def test_a_vanished_scratch_or_file_is_told_by_what_is_gone(tmp_path):
    made = scratch.make(_job("held"), str(tmp_path / "not" / "yet"), "job")
    files = [made.job_file, made.log_file]
    made.log_file.touch()
    assert scratch.vanished(made.path, files) is None
    made.log_file.unlink()
    assert scratch.vanished(made.path, files) == (
        f"the job's log {made.log_file} vanished from its scratch {made.path}"
    )
    shutil.rmtree(made.path)
    assert scratch.vanished(made.path, files) == f"the job's scratch {made.path} vanished"


def test_a_run_s_summary_says_what_is_unfinished_and_how_to_resume():
    resume = "orchestrate sweep s.yaml --out runs/s --resume"
    done = SweepSummary("r", None, 3, 0, {"ok": 3}, 1.0, 1.0, {"cpu": 1}, resume)
    assert done.harness_errors == 0 and done.unfinished() is None
    left = dataclasses.replace(done, counts={"ok": 1, "harness_error": 2})
    assert left.harness_errors == 2
    assert left.unfinished() == unfinished(2, resume)
    assert left.unfinished().endswith(f"Run them again with:\n  {resume}")
    tune = TuneSummary(None, 1, 1, 0, 0, 0, {}, 1.0, {}, resume_command="orchestrate tune t.yaml --resume")
    assert tune.unfinished() is None
    tune.harness_errors = {"rung0": 1, "confirm": 2}
    assert tune.unfinished().startswith(unfinished(3, "orchestrate tune t.yaml --resume"))
    assert "(1 in rung0, 2 in confirm; the presets were decided without them)" in tune.unfinished()
