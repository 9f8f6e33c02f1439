"""The shared compile cache as a trust boundary, with real sweeps through the CLI, real compiles
and real redis-servers: while a sweep runs, a client without its password gets NOAUTH for every
command and `ps` shows no secret; a server stopped mid-sweep (SIGSTOP) costs the jobs their
sharing, not their time limits, and the driver does not wait for it; entries planted by a writer
without the fleet's secret are rejected and counted, never unpickled; an entry swapped for
another valid one costs a retry without the cache, never the result; a fleet's TLS server with a
user and a password from the environment works. (Without compiling: tests/fleet/test_cache_trust.py.)"""

from __future__ import annotations

import base64
import json
import os
import pickle
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest

from compiler.cache_access import SECRET_ENV
from compiler.cache_link import CacheLink
from orchestrator.fleet import cache
from store.runlog import read_runs
from store.schema import read_results
from tests.integration.conftest import ROOT, orchestrate
from tests.integration.test_shared_cache import TWINS
from tests.redis_servers import needs_redis, needs_tls, password_server, tls_binary, tls_server

pytestmark = [pytest.mark.integration, needs_redis]


def _sizes(sizes: str, config: str) -> str:
    """TWINS' model at `sizes` batch sizes, with one config."""
    return TWINS.replace("batch_sizes: [2]", f"batch_sizes: {sizes}").replace(
        "  first: {}\n  second: {}", f"  {config}"
    )


# Three quick jobs (Dynamo's eager backend: the cache's part is the job's connection, not a compile).
EAGER = _sizes("[1, 2, 4]", "eager-backend: {backend: eager}")
# Two Inductor jobs: two FX graphs in the cache, one per batch size.
GRAPHS = _sizes("[1, 2]", "default: {}")

STARTED = re.compile(r"shared compile cache: started redis-server \S+ from .* on unix://(\S+) \(")


class Evil:
    """A pickle that, once loaded, leaves a marker file: what a planted entry would run."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"id > {self.marker}",))


def _rows(out) -> dict[int, dict]:
    return {r["batch_size"]: r for r in read_results(out).to_pylist()}


def _lines(stream, seen: list[str], found: threading.Event) -> None:
    for line in stream:
        seen.append(line)
        if STARTED.search(line):
            found.set()


def _wait_for_job_process(driver: psutil.Process, timeout_s: float = 120) -> psutil.Process:
    """The driver's first job process (its private Ray's workers are its descendants): another
    test's sweep may run job processes beside it."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for p in driver.children(recursive=True):
            try:
                if "workers.bench" in " ".join(p.cmdline()):
                    return p
            except psutil.Error:
                continue
        time.sleep(0.05)
    raise AssertionError("no job process started")


def test_a_sweeps_cache_is_closed_to_others_and_a_hung_server_costs_only_sharing(sweep_file, tmp_path):
    """(a) While the sweep runs: a client without the password gets NOAUTH for every command, and
    no process's command line holds the password or the key. (c) Then the server is stopped
    (SIGSTOP): every job is ok and says the cache was unavailable, the driver says so once, the
    makespan stays within the jobs' own time plus 30 s, and the driver ends at once after."""
    import redis
    from redis.backoff import NoBackoff
    from redis.retry import Retry

    out, scratch = tmp_path / "out", tmp_path / "scratch"
    cmd = [sys.executable, "-m", "orchestrator", "sweep", str(sweep_file(EAGER)), "--out", str(out)]
    cmd += ["--scratch", str(scratch), "--shared-cache", "--cpus-per-job", "2"]
    t0 = time.monotonic()
    driver = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    seen: list[str] = []
    started = threading.Event()
    reader = threading.Thread(target=_lines, args=(driver.stderr, seen, started), daemon=True)
    reader.start()
    try:
        assert started.wait(120), "".join(seen)
        socket_path = STARTED.search("".join(seen))[1]
        anonymous = redis.Redis(unix_socket_path=socket_path, socket_timeout=2, retry=Retry(NoBackoff(), 0))
        for command in (("PING",), ("GET", "k"), ("SET", "k", "v"), ("KEYS", "*"), ("CONFIG", "GET", "*")):
            with pytest.raises(redis.AuthenticationError):
                anonymous.execute_command(*command)
        [server] = [p for p in psutil.Process(driver.pid).children() if p.name() == "redis-server"]

        job = _wait_for_job_process(psutil.Process(driver.pid))
        given = json.loads(job.environ()[SECRET_ENV])  # what its runner gave it (root reads any environ)
        listing = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
        assert given["password"] and given["key"]
        assert given["password"] not in listing and given["key"] not in listing

        server.suspend()  # SIGSTOP: it accepts connections and never answers
        stopped_at = time.monotonic()
        driver.wait(timeout=600)
        ended = time.monotonic()
    finally:
        if driver.poll() is None:
            driver.kill()
    reader.join(timeout=10)
    said = "".join(seen)
    assert driver.returncode == 0, said[-3000:]
    rows = _rows(out)
    assert sorted(rows) == [1, 2, 4] and {r["status"] for r in rows.values()} == {"ok"}, said[-3000:]
    for row in rows.values():
        assert row["compile_cache"] == "unavailable", row["notes"]
        assert "shared cache unavailable" in row["notes"], row["notes"]
    warnings = [line for line in said.splitlines() if line.startswith("warning: shared compile cache:")]
    assert len(warnings) == 1 and "stopped answering" in warnings[0], said
    [run] = read_runs(out)
    assert run["dispatch_s"] <= sum(r["wall_s"] for r in rows.values()) + 30, (run["dispatch_s"], rows)
    assert ended - stopped_at <= run["dispatch_s"] + 60, said  # Ray's stop and the server's kill included
    assert not psutil.pid_exists(server.pid) or server.status() == psutil.STATUS_ZOMBIE
    assert time.monotonic() - t0 < 600


def test_planted_and_swapped_entries_never_decide_a_result(sweep_file, tmp_path, monkeypatch):
    """(b) A writer who holds the server's password but not the fleet's secret overwrites an entry
    the jobs read (at the key layout of the installed torch, learnt from a first sweep) with a
    pickle that would leave a marker file: it is rejected before it is unpickled, the job compiles
    cold, counts it in cache_rejected, and is ok (a seal made up without the secret:
    tests/fleet/test_cache_trust.py). (d) A holder of the secret seals the other batch size's valid
    graph under the second key: that job's compile fails on it, runs again without the cache, and
    is ok, its row naming the rejected entry."""
    marker = tmp_path / "marker"
    with password_server(tmp_path) as server:
        monkeypatch.setenv(cache.PASSWORD_ENV, server.password)
        monkeypatch.setenv(cache.SECRET_ENV, "the-fleet-secret")
        flags = ["--shared-cache", "--cache-redis", server.url, "--cpus-per-job", "1"]
        sweep = sweep_file(GRAPHS)
        orchestrate("sweep", str(sweep), "--out", str(tmp_path / "first"), *flags)
        first = _rows(tmp_path / "first")
        assert {r["fx_cache_misses"] for r in first.values()} == {1}
        client = server.access().client()  # the server's password: what the writer has
        keys = sorted(client.keys(b"co:*:pt2:fx-graph-v1::*"))
        assert len(keys) == 2, keys
        plain = json.dumps(
            {"data": base64.b64encode(pickle.dumps(Evil(marker))).decode(), "time_taken_ms": 1}
        )
        # (d) the secret's holder: the first graph's valid entry, sealed under the second key
        fleet = CacheLink(server.access("the-fleet-secret"), first[1]["cache_namespace"])
        valid = fleet.get(keys[0].decode().removeprefix(fleet.namespace))
        assert valid is not None
        fleet.put(keys[1].decode().removeprefix(fleet.namespace), valid)
        # (b) the writer without the secret: torch's own entry format
        client.set(keys[0], plain.encode())
        orchestrate("sweep", str(sweep), "--out", str(tmp_path / "second"), *flags)
    rows = _rows(tmp_path / "second")
    assert {r["status"] for r in rows.values()} == {"ok"}, [r["error"] for r in rows.values()]
    assert not marker.exists()
    for row in rows.values():
        assert row["cache_rejected"] == 1 and row["fx_cache_hits"] == 0, row["notes"]
        assert row["fx_cache_misses"] == 1, row["notes"]
        # on a GPU the Triton configs the first sweep sealed are still served; the graphs never are
        assert row["compile_from_cache"] is bool(row["autotune_cache_hits"]), row
    notes = sorted(r["notes"] for r in rows.values())
    [rejected] = [n for n in notes if "shared cache: 1 entry rejected (" in n]
    assert "not sealed: 1" in rejected, notes
    [retried] = [r for r in rows.values() if "run again without the cache, it succeeded" in r["notes"]]
    assert "the process failed after the cache handed it an entry (compile_error: " in retried["notes"]
    assert retried["compile_cache"] == "off"  # what was measured: a cold compile, without the cache


@needs_tls()
def test_a_fleets_tls_server_with_a_user_and_a_password_from_the_environment(
    sweep_file, tmp_path, monkeypatch
):
    """`--cache-redis rediss://USER@HOST:PORT?ssl_ca_certs=CA` with the password in
    $ORCHESTRATE_CACHE_PASSWORD, against a redis-server that speaks TLS only, with a self-signed
    certificate and an ACL user: the second of two equal configs is served the first's graph."""
    with tls_server(tmp_path, tls_binary()) as server:
        monkeypatch.setenv(cache.PASSWORD_ENV, server.password)
        out = tmp_path / "out"
        proc = orchestrate(
            "sweep", str(sweep_file(TWINS)), "--out", str(out), "--shared-cache", "--cache-redis", server.url
        )
        assert server.password not in proc.stdout + proc.stderr
        rows = sorted(read_results(out).to_pylist(), key=lambda r: r["fx_cache_hits"])
        assert [r["status"] for r in rows] == ["ok", "ok"], [r["error"] for r in rows]
        assert {r["compile_cache"] for r in rows} == {"shared"}
        assert [(r["fx_cache_hits"], r["compile_from_cache"]) for r in rows] == [(0, False), (1, True)]
        link = CacheLink(server.access(), rows[0]["cache_namespace"])
        [key] = server.access().client().keys(b"co:*")
        assert link.get(key.decode().removeprefix(link.namespace)) is not None  # sealed with the derived key

        monkeypatch.setenv(cache.PASSWORD_ENV, "not-the-password")
        refused = orchestrate(
            "sweep",
            str(sweep_file(TWINS)),
            "--out",
            str(tmp_path / "no"),
            "--shared-cache",
            "--cache-redis",
            server.url,
            check=False,
        )
    assert refused.returncode == 2 and "not-the-password" not in refused.stdout + refused.stderr
    assert refused.stderr.startswith(
        f"error: --cache-redis {server.url}: the server refused the credentials ("
    )
