"""Every command that writes into a location holds its lock: while a real sweep runs into OUT,
`tune --out OUT`, `export --dest OUT`, `presets OUT` and a sweep into a directory inside OUT are
each refused with one `error:` line naming the sweep's driver (pid, host, command) and exit 2,
before they write anything."""

from __future__ import annotations

import contextlib
import signal
import socket
import subprocess
import time

import pytest

from tests.integration.conftest import bench_processes, one_job_sweep, orchestrate, start_sweep

pytestmark = pytest.mark.integration

SWEEP = one_job_sweep("it-location-locks", "python:tests.faulty:hang", "dynamo: {backend: eager}")


def _files(root) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


def test_tune_export_presets_and_a_nested_sweep_are_refused_while_a_sweep_holds_the_location(
    sweep_file, tmp_path
):
    sweep = sweep_file(SWEEP)
    out, scratch = tmp_path / "out", tmp_path / "scratch"
    scratch.mkdir()
    driver = start_sweep(sweep, out, scratch, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and driver.poll() is None and not bench_processes(str(scratch)):
            time.sleep(0.5)
        assert driver.poll() is None and bench_processes(str(scratch)), driver.communicate()
        before = _files(out)
        held_by = f"is in use by another orchestrate driver: pid {driver.pid} on {socket.gethostname()}"

        refused = {
            "tune": orchestrate(
                "tune", str(sweep), "--out", str(out), "--scratch", str(scratch), check=False
            ),
            "export": orchestrate(
                "export", str(tmp_path / "src"), "--hardware", "cpu", "--dest", str(out), check=False
            ),
            "presets": orchestrate("presets", str(out), check=False),
            "sweep inside": orchestrate("sweep", str(sweep), "--out", str(out / "inner"), check=False),
        }
        # a tune never writes into a sweep's output, held or not: that is what it is told first
        [line] = refused.pop("tune").stderr.strip().splitlines()
        assert (
            line.startswith(f"error: {out}: holds a sweep's output (") and "which a tune must not" in line
        ), line
        for what, proc in refused.items():
            assert proc.returncode == 2, (what, proc.stdout, proc.stderr)
            [line] = proc.stderr.strip().splitlines()  # one line, no traceback
            start = (
                f"error: {out / 'inner'} lies inside {out}, which "
                if what == "sweep inside"
                else f"error: {out} "
            )
            assert line.startswith(start + held_by), (what, line)
            assert f"running `{' '.join(driver.args[1:4])}" in line or "sweep.yaml" in line, (what, line)
        assert "pass another --dest" in refused["export"].stderr
        assert "Run `orchestrate presets` once it has finished" in refused["presets"].stderr
        assert _files(out) == before  # nothing written: no rung0, tune.json, presets, bundles, inner/
        assert driver.poll() is None  # the sweep runs on
    finally:
        driver.send_signal(signal.SIGKILL)
        driver.wait()
        deadline = time.monotonic() + 30
        while bench_processes(str(scratch)) and time.monotonic() < deadline:
            time.sleep(0.2)
        for p in bench_processes(str(scratch)):
            with contextlib.suppress(Exception):
                p.kill()
