"""A job process's guard (`compiler.env.guard_process_group`): when the job process dies, even of
SIGKILL, its whole process group goes with it, descendants that ignore their parent included; a
process that does not lead a group of its own gets no guard. And a runner killed outright (as a
driver running `export` or a Ray worker may be) leaves no job process behind."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parents[1]

LEADER = """
import subprocess, sys, time
from compiler.env import guard_process_group
print(guard_process_group(), flush=True)
subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)", sys.argv[1]])
print("started", flush=True)
time.sleep(600)
"""

RUNNER = """
import sys
from tests.test_runner_faults import _job
from workers.runner import run_job
run_job(_job("hang_with_child", timeout_s=600.0), threads=1, scratch_root=sys.argv[1])
"""


def _with_marker(marker: str) -> list[psutil.Process]:
    found = []
    for p in psutil.process_iter(["cmdline"]):
        if marker in " ".join(p.info["cmdline"] or []) and p.status() != psutil.STATUS_ZOMBIE:
            found.append(p)
    return found


def _others_with_marker(marker: str, pids: tuple[int, ...], seconds: float = 5.0) -> list[psutil.Process]:
    """The processes with `marker` other than `pids`, once there are any (at most `seconds`): a
    process just started can be missing from one listing of a loaded machine (seen once in a
    fresh-clone CI run)."""
    deadline = time.monotonic() + seconds
    while True:
        found = [p for p in _with_marker(marker) if p.pid not in pids]
        if found or time.monotonic() > deadline:
            return found
        time.sleep(0.05)


def _gone_within(procs: list[psutil.Process], seconds: float) -> float | None:
    """Seconds until every one of `procs` is gone; None if some outlive `seconds`."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < seconds:
        if not [p for p in procs if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]:
            return time.monotonic() - t0
        time.sleep(0.02)
    return None


def _killed(victim: subprocess.Popen, procs: list[psutil.Process], marker: str, seconds: float) -> float:
    """SIGKILL `victim`; seconds until every one of `procs` was gone (at most `seconds`). Whatever
    is left of the test's processes (`marker`) is killed after."""
    try:
        os.kill(victim.pid, signal.SIGKILL)
        took = _gone_within(procs, seconds)
        assert took is not None, f"outlived their killed ancestor: {[p for p in procs if p.is_running()]}"
        return took
    finally:
        victim.kill()
        victim.wait()
        for p in _with_marker(marker):
            p.kill()


def _start(code: str, marker: str, **kwargs) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.Popen(
        [sys.executable, "-c", code, marker], cwd=REPO, env=env, stdout=subprocess.PIPE, text=True, **kwargs
    )


def test_the_guard_takes_the_group_along_when_its_leader_is_killed():
    marker = f"co-guard-{uuid.uuid4().hex}"
    leader = _start(LEADER, marker, start_new_session=True)
    try:
        guard = int(leader.stdout.readline())
        assert leader.stdout.readline().strip() == "started"
        grandchild = _others_with_marker(marker, (leader.pid, guard))
        assert len(grandchild) == 1
        assert psutil.Process(guard).name() == "co-job-guard"
    except BaseException:
        leader.kill()
        raise
    assert _killed(leader, [*grandchild, psutil.Process(guard)], marker, 5.0) < 1.0


def test_no_guard_for_a_process_that_shares_its_parents_group():
    marker = f"co-guard-{uuid.uuid4().hex}"
    proc = _start(LEADER, marker)  # our process group: killing it would kill the test
    try:
        assert proc.stdout.readline().strip() == "None"
        assert proc.stdout.readline().strip() == "started"
    finally:
        proc.kill()
        proc.wait()
        for p in _with_marker(marker):
            p.kill()


def test_a_killed_runner_leaves_no_job_process(tmp_path):
    """The runner (here a plain process, as `export`'s driver is; in a sweep, a Ray worker)
    killed with SIGKILL while its job runs: the job process, its guard and the grandchild that
    the job's model started are all gone within 2 s."""
    marker = f"co-test-{uuid.uuid4().hex}"
    os.environ["CO_TEST_MARKER"] = marker  # hang_with_child names its grandchild with it
    try:
        runner = _start(RUNNER, str(tmp_path))
    finally:
        del os.environ["CO_TEST_MARKER"]
    try:
        deadline = time.monotonic() + 120  # torch's import on a busy 2-core machine
        while not _with_marker(marker) and time.monotonic() < deadline:
            time.sleep(0.1)
        [grandchild] = _with_marker(marker)
        job = [p for p in psutil.Process(runner.pid).children() if "workers.bench" in " ".join(p.cmdline())]
        assert len(job) == 1
        procs = [grandchild, *job[0].children(recursive=True), job[0]]
        assert "co-job-guard" in {p.name() for p in procs}
    except BaseException:
        runner.kill()
        raise
    assert _killed(runner, procs, marker, 10.0) < 2.0
