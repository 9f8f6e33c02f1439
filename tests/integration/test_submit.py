"""`orchestrate submit/status/logs` against a real Ray cluster started by `ray start --head`.

The cluster runs with Ray's token authentication on (RAY_AUTH_MODE=token, a fresh random token
in RAY_AUTH_TOKEN), so the test also shows the token passing through: refused without it,
accepted with it, and the job's own driver connecting with it.

The cluster is this test's alone: its own ports and --temp-dir, `ray start --block` in a new
session, stopped by signalling that session. `ray stop` is never used, since it stops every
Ray on the machine, including one another test or person may be running.
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from store.schema import read_results

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
SWEEP = "sweeps/smoke.yaml"
ONLY = "*/mlp/bs1/*/default"  # one job of the smoke sweep: the MLP at batch 1, Inductor default


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _ray_cli() -> list[str]:
    ray = shutil.which("ray")
    return [ray] if ray else [sys.executable, "-m", "ray.scripts.scripts"]


def _base_env() -> dict[str, str]:
    env = {
        k: v for k, v in os.environ.items() if not k.startswith(("RAY_ADDRESS", "RAY_API_SERVER", "RAY_AUTH"))
    }
    return {**env, "PYTHONUNBUFFERED": "1"}


def _wait_ready(address: str, token: str, proc: subprocess.Popen, log: Path, timeout_s: float = 90) -> None:
    """Until the Jobs API answers (the dashboard serves /api/version before its job agent is up)."""
    deadline = time.monotonic() + timeout_s
    request = urllib.request.Request(f"{address}/api/jobs/", headers={"Authorization": f"Bearer {token}"})
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"ray start exited with {proc.returncode}:\n{log.read_text()}")
        try:
            with urllib.request.urlopen(request, timeout=5) as r:
                if r.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.5)
    raise AssertionError(f"the Jobs API at {address} did not answer in {timeout_s}s:\n{log.read_text()}")


def _stop(proc: subprocess.Popen) -> None:
    """SIGTERM to `ray start --block` drains and stops every process it started; then make sure."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=60)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)  # anything of that session still alive
    proc.wait()


@pytest.fixture(scope="module")
def ray_head():
    token = secrets.token_hex(32)
    temp_dir = tempfile.mkdtemp(prefix="ray-submit-it-")  # short: Ray's socket paths must fit 107 bytes
    ports = {name: _free_port() for name in ("gcs", "dashboard", "client", "agent")}
    address = f"http://127.0.0.1:{ports['dashboard']}"
    cluster_env = {**_base_env(), "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": token}
    # On SIGTERM, `ray start --block` first drains the node for up to 30 s (for Serve); nothing
    # here needs draining, so stop at once.
    cluster_env["RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S"] = "0"
    log = Path(temp_dir) / "ray-start.log"
    cmd = [
        *_ray_cli(),
        "start",
        "--head",
        "--block",
        f"--port={ports['gcs']}",
        f"--dashboard-port={ports['dashboard']}",
        "--dashboard-host=127.0.0.1",
        f"--ray-client-server-port={ports['client']}",
        f"--dashboard-agent-listen-port={ports['agent']}",
        "--include-dashboard=true",
        "--num-cpus=2",
        "--disable-usage-stats",
        f"--temp-dir={temp_dir}",
    ]
    with open(log, "w") as out:
        proc = subprocess.Popen(
            cmd, cwd=temp_dir, env=cluster_env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    try:
        _wait_ready(address, token, proc, log)
        yield {"address": address, "env": cluster_env, "gcs": f"127.0.0.1:{ports['gcs']}"}
    finally:
        _stop(proc)
        shutil.rmtree(temp_dir, ignore_errors=True)


def orchestrate(env: dict[str, str], *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "orchestrator", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _status(env: dict[str, str], job_id: str, address: str) -> tuple[str, str]:
    proc = orchestrate(env, "status", job_id, "--address", address)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.split("\n", 1)[0].rsplit(" ", 1)[-1], proc.stdout


@pytest.mark.slow  # a tier of its own, after the default one (docs/testing.md)
def test_submit_status_logs_and_results_with_token_auth(ray_head, tmp_path):
    address, env = ray_head["address"], ray_head["env"]

    # Without the token (and with a wrong one) the cluster refuses; the error says what to set.
    # The three refusals are independent commands: at once, as three users' would be.
    no_token = _base_env()
    with ThreadPoolExecutor(max_workers=3) as pool:
        refused, wrong, joined = pool.map(
            lambda call: orchestrate(*call),
            [
                (no_token, "submit", SWEEP, "--only", ONLY, "--address", address, "--no-wait"),
                ({**env, "RAY_AUTH_TOKEN": "0" * 64}, "status", "raysubmit_x", "--address", address),
                # a sweep joining the cluster's GCS without the token: the same line, no traceback
                (
                    no_token,
                    "sweep",
                    SWEEP,
                    "--only",
                    ONLY,
                    "--address",
                    ray_head["gcs"],
                    "--out",
                    str(tmp_path / "x"),
                ),
            ],
        )
    assert refused.returncode == 2 and "requires a token" in refused.stderr, refused.stderr
    assert wrong.returncode == 2 and "rejected the token" in wrong.stderr, wrong.stderr
    assert joined.returncode == 2 and "requires a token" in joined.stderr, joined.stderr[-3000:]
    assert "Traceback" not in joined.stderr, joined.stderr[-3000:]

    out = tmp_path / "out"  # absolute, and the head is this machine: every node sees it
    sub = orchestrate(
        env, "submit", SWEEP, "--only", ONLY, "--out", str(out), "--address", address, "--no-wait"
    )
    assert sub.returncode == 0, sub.stdout + sub.stderr
    job_id = re.search(r"\b(raysubmit_\w+)", sub.stdout).group(1)
    assert f"orchestrate status {job_id} --address {address}" in sub.stdout

    follow = subprocess.Popen(
        [sys.executable, "-m", "orchestrator", "logs", job_id, "--follow", "--address", address],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:  # --follow ends by itself with the job: no status polls beside the job on the 2 cores
        followed, follow_err = follow.communicate(timeout=300)
    finally:
        if follow.poll() is None:
            follow.kill()
    state, text = _status(env, job_id, address)
    assert state == "SUCCEEDED", text + orchestrate(env, "logs", job_id, "--address", address).stdout
    assert follow.returncode == 0, follow_err
    assert "--address auto" in text and f"--out {out}" in text and "sweeps/smoke.yaml" in text
    assert "Running entrypoint" in followed and "done in" in followed

    logs = orchestrate(env, "logs", job_id, "--address", address)
    assert logs.returncode == 0 and "done in" in logs.stdout and "1 ok" in logs.stdout

    table = read_results(out)
    rows = table.to_pylist()
    assert len(rows) == 1 and {r["status"] for r in rows} == {"ok"}, rows
    assert {(r["model"], r["batch_size"], r["config"]) for r in rows} == {("mlp", 1, "default")}

    # Without --no-wait, submit follows the job to its end and exits with its outcome; --resume
    # passes through, so this second job finds the row and runs nothing.
    again = orchestrate(
        env, "submit", SWEEP, "--only", ONLY, "--out", str(out), "--resume", "--address", address
    )
    assert again.returncode == 0, again.stdout + again.stderr
    assert "1 already done, 0 to run" in again.stdout and re.search(
        r"job raysubmit_\w+: SUCCEEDED", again.stdout
    )
    assert read_results(out).num_rows == 1
