"""No orphans: a sweep driver killed with SIGKILL in the middle of a compile takes every job
process with it within 10 s: the Ray worker running `execute_job`, the job process
(`workers.bench`) and all it started (Inductor's `g++` and `cc1plus`, and a grandchild that
ignores its parent, standing in for a compiler that would run on for minutes).

Only processes of this test are looked at: those whose environment names its scratch directory
(every job process and descendant has its compile caches there), and their Ray worker."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time

import psutil
import pytest

from tests.integration.conftest import one_job_sweep, start_sweep

pytestmark = pytest.mark.integration

SWEEP = one_job_sweep("it-no-orphans", "python:tests.faulty:compile_with_child", "inductor: {}")
LIMIT_S = 10.0
COMPILERS = {"g++", "c++", "cc1plus", "as", "ld", "collect2"}


def _marked(marker: str) -> list[psutil.Process]:
    """Live processes whose environment mentions `marker` (ours: other users' are unreadable)."""
    found = []
    for p in psutil.process_iter(["name"]):
        with contextlib.suppress(psutil.Error):
            if p.status() != psutil.STATUS_ZOMBIE and any(marker in v for v in p.environ().values()):
                found.append(p)
    return found


def _cmdline(p: psutil.Process) -> str:
    """What `p` runs; "" for one that has just ended (a g++ may end between a listing and a read)."""
    with contextlib.suppress(psutil.Error):
        return " ".join(p.cmdline())
    return ""


def _name(p: psutil.Process) -> str:
    with contextlib.suppress(psutil.Error):
        return p.name()
    return ""


def _parent(p: psutil.Process) -> psutil.Process | None:
    with contextlib.suppress(psutil.Error):
        return p.parent()
    return None


def _alive(procs: list[psutil.Process]) -> list[psutil.Process]:
    alive = []
    for p in procs:  # is_running() compares the start time too: a reused pid is not ours
        with contextlib.suppress(psutil.Error):
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                alive.append(p)
    return alive


def test_a_driver_killed_mid_compile_leaves_no_job_process(sweep_file, tmp_path):
    sweep = sweep_file(SWEEP)
    out, scratch = tmp_path / "out", tmp_path / "scratch"
    scratch.mkdir()
    marker = str(scratch)
    driver = start_sweep(sweep, out, scratch, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 300
        compiling: list[psutil.Process] = []
        while time.monotonic() < deadline and driver.poll() is None and not compiling:
            compiling = [p for p in _marked(marker) if p.info["name"] in COMPILERS]
            time.sleep(0.1)
        assert driver.poll() is None, f"the sweep ended before it was killed: {driver.communicate()[1]}"
        assert compiling, "no g++ of the job was seen in 300 s"

        procs = _marked(marker)
        workers = {_parent(p) for p in procs if "workers.bench" in _cmdline(p)} - {None}
        procs += [w for w in workers if _name(w).startswith("ray::")]
        names = sorted(_name(p) for p in procs)
        assert any(n.startswith("ray::") for n in names), names  # the Ray worker (execute_job)
        assert "co-job-guard" in names, names  # the job process's guard
        cmdlines = [_cmdline(p) for p in _alive(procs)]
        assert any("co-test-grandchild" in c for c in cmdlines), cmdlines
        assert any("-m workers.bench" in c for c in cmdlines), cmdlines

        os.kill(driver.pid, signal.SIGKILL)
        killed = time.monotonic()
        driver.wait()
        left = _alive(procs) + [p for p in _marked(marker) if p not in procs]
        while left and time.monotonic() - killed < LIMIT_S + 20:
            time.sleep(0.05)
            left = _alive(procs) + [p for p in _marked(marker) if p not in procs]
        gone_after = time.monotonic() - killed
        print(
            f"the last of {len(procs)} job processes ({', '.join(names)}) was gone {gone_after:.2f} s after SIGKILL"
        )
        assert not left, f"still running {gone_after:.0f} s after the driver's SIGKILL: {left}"
        assert gone_after < LIMIT_S, f"the job processes took {gone_after:.1f} s to go"
    finally:
        if driver.poll() is None:
            driver.kill()
            driver.wait()
        for p in _marked(marker):  # a job left behind would hold cores for later tests
            with contextlib.suppress(psutil.Error):
                p.kill()
