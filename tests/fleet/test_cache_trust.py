"""Who may reach the shared compile cache and what may be used from it, without compiling: the
seal on every entry, the credentials of a named server (never echoed), the embedded server that
only its user can open, a link that a dead or hung server takes down in one timeout, and the
driver's check that stops sending the cache to jobs. Real redis-servers throughout. (With real
compiles and sweeps: tests/integration/test_cache_trust.py.)"""

from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
import time

import psutil
import pytest

from compiler.cache_access import SEAL, CacheAccess, derive_key, printable_url, seal, unseal
from compiler.cache_link import CacheLink
from orchestrator.fleet import cache
from tests.redis_servers import needs_redis, needs_tls, password_server, tls_binary, tls_server


def test_a_seal_binds_the_bytes_the_key_and_the_secret():
    key, other = derive_key("fleet secret"), derive_key("another fleet")
    sealed = seal(key, "co:cpu:abc:pt2:fx-graph-v1::k1:c1", b"payload")
    assert sealed.startswith(SEAL) and sealed.endswith(b"payload")
    assert unseal(key, "co:cpu:abc:pt2:fx-graph-v1::k1:c1", sealed) == (b"payload", None)
    assert unseal(key, "co:cpu:abc:pt2:fx-graph-v1::k2:c1", sealed) == (None, "its seal does not verify")
    assert unseal(other, "co:cpu:abc:pt2:fx-graph-v1::k1:c1", sealed) == (None, "its seal does not verify")
    tampered = sealed[:-1] + b"X"
    assert unseal(key, "co:cpu:abc:pt2:fx-graph-v1::k1:c1", tampered)[0] is None
    assert unseal(key, "k", b'{"data": "gASV..."}') == (None, "not sealed")  # torch's own format
    assert unseal(key, "k", SEAL + b"short") == (None, "not sealed")
    assert derive_key("pw") != b"pw" and len(derive_key("pw")) == 32


def test_credentials_come_from_files_or_the_environment_and_are_never_echoed(tmp_path):
    secret_file, password_file = tmp_path / "secret", tmp_path / "password"
    secret_file.write_text("the-fleet-secret\n")
    password_file.write_text("from-the-file\n")
    env = {cache.PASSWORD_ENV: "from-the-env", cache.SECRET_ENV: "env-secret"}
    access = cache.named_access("rediss://user@h:6380", str(password_file), str(secret_file), environ=env)
    assert access.password == "from-the-file" and access.key == derive_key("the-fleet-secret")
    access = cache.named_access("h:6379", environ=env)
    assert access.url == "redis://h:6379" and access.password == "from-the-env"
    assert access.key == derive_key("env-secret")
    access = cache.named_access("h:6379", environ={cache.PASSWORD_ENV: "only-a-password"})
    assert access.key == derive_key("only-a-password")  # the seal's key derived from it
    for printed in (repr(access), str(access)):
        assert "only-a-password" not in printed and access.key.hex() not in printed
    with pytest.raises(cache.CacheAddressError, match="no password and no secret"):
        cache.named_access("h:6379", environ={})
    with pytest.raises(cache.CacheAddressError, match="cannot read the password"):
        cache.named_access("h:6379", str(tmp_path / "missing"), environ={})
    for url in ("redis://:hunter2@h:6379", "rediss://user:hunter2@h:6380/0"):
        with pytest.raises(cache.CacheAddressError) as refused:
            cache.named_access(url, environ=env)
        assert "hunter2" not in str(refused.value) and ":***@h:" in str(refused.value)
        assert "visible to every user in `ps`" in str(refused.value)
    assert printable_url("redis://u:pw@h:1/0") == "redis://u:***@h:1/0"


@needs_redis
def test_a_wrong_or_missing_password_is_refused_without_echoing_it(tmp_path):
    with password_server(tmp_path, "right-password") as server:
        assert cache.check_access(server.access()) is not None
        for wrong in ("wrong-password", None):
            with pytest.raises(cache.CacheAddressError) as refused:
                cache.check_access(CacheAccess(server.url, wrong, b"k"))
            text = str(refused.value)
            assert text.startswith(f"--cache-redis {server.url}: the server refused the credentials (")
            assert "check the password" in text, text
            assert "right-password" not in text and "wrong-password" not in text


@needs_redis
def test_the_embedded_server_is_this_users_alone(tmp_path):
    import redis
    from redis.backoff import NoBackoff
    from redis.retry import Retry

    with cache.embedded_redis(str(tmp_path)) as server:
        path = server.access.url.removeprefix("unix://")
        assert oct(os.stat(path).st_mode & 0o777) == "0o700"
        assert oct(os.stat(os.path.dirname(path)).st_mode & 0o777) == "0o700"
        args = psutil.Process(server.proc.pid).cmdline()
        assert server.access.password not in " ".join(args) and len(args) <= 2, args
        assert not [c for c in psutil.net_connections("tcp") if c.pid == server.proc.pid]  # no TCP port
        once = Retry(NoBackoff(), 0)  # redis-py's own retries would only make each refusal slower
        anonymous = redis.Redis(unix_socket_path=path, socket_timeout=2, protocol=2, retry=once)
        for command in (("PING",), ("GET", "k"), ("SET", "k", "v"), ("KEYS", "*"), ("CONFIG", "GET", "*")):
            with pytest.raises(redis.AuthenticationError, match="NOAUTH|Authentication required"):
                anonymous.execute_command(*command)
        with pytest.raises(redis.AuthenticationError):
            redis.Redis(unix_socket_path=path, password="guess", socket_timeout=2, retry=once).ping()
        assert server.access.client().ping()
        if os.geteuid() == 0:  # another user of the machine cannot even open the socket
            done = subprocess.run(
                [
                    "setpriv",
                    "--reuid=nobody",
                    "--regid=nogroup",
                    "--clear-groups",
                    sys.executable,
                    "-c",
                    f"import socket; s = socket.socket(socket.AF_UNIX); s.connect({path!r})",
                ],
                capture_output=True,
                text=True,
            )
            assert done.returncode != 0 and "PermissionError" in done.stderr, done.stderr


@needs_redis
def test_a_hung_server_costs_a_link_one_timeout_and_the_driver_one_line(tmp_path):
    with cache.embedded_redis(str(tmp_path)) as server:
        stream = io.StringIO()
        live = cache.CacheLive(server.access, stream, server)
        link = CacheLink(server.access, "co:cpu:abc:")
        link.put("k", b"v")
        assert link.get("k") == b"v" and link.served == 1
        os.kill(server.proc.pid, signal.SIGSTOP)
        try:
            t0 = time.monotonic()
            assert link.get("k") is None
            assert time.monotonic() - t0 < 4 and link.down.startswith("GET: TimeoutError")
            t0 = time.monotonic()
            assert link.get("k") is None and link.hash_items("h") == {}  # down: no more waiting
            assert time.monotonic() - t0 < 0.05
            live.check()
            live.check()  # said once
            assert live.off is not None and live.access.off == live.off
            [line] = stream.getvalue().splitlines()
            assert line.startswith(f"warning: shared compile cache: {server.access.url} stopped answering (")
            assert line.endswith("; the jobs sent from now on compile without it")
        finally:
            os.kill(server.proc.pid, signal.SIGCONT)


@needs_redis
def test_the_driver_says_when_its_embedded_server_dies(tmp_path):
    stream = io.StringIO()
    with cache.shared_cache(True, None, str(tmp_path), stream) as live:
        live.server.proc.kill()
        live.server.proc.wait()
        live.check()
        assert live.access.off == "the embedded redis-server killed by signal 9"
    said = stream.getvalue().splitlines()
    assert said[-1] == (
        "warning: shared compile cache: the embedded redis-server killed by signal 9; "
        "the jobs sent from now on compile without it"
    )


@needs_redis
def test_a_stopped_embedded_server_does_not_hold_the_end_of_the_run(tmp_path):
    """A run whose server hangs (SIGSTOP) ends at once: no snapshot is taken from it, and it is
    killed rather than asked to stop (a stopped process does not act on SIGTERM)."""
    from store.storage import resolve

    stream = io.StringIO()
    t0 = time.monotonic()
    with cache.shared_cache(True, None, str(tmp_path), stream, keep=resolve(tmp_path / "out")) as live:
        os.kill(live.server.proc.pid, signal.SIGSTOP)
        live.check()
    assert time.monotonic() - t0 < 10, stream.getvalue()
    assert live.server.proc.returncode == -signal.SIGKILL
    assert "snapshot not written" not in stream.getvalue()


@needs_tls()
def test_a_tls_server_with_a_user_and_a_password_from_the_environment(tmp_path):
    with tls_server(tmp_path, tls_binary()) as server:
        env = {cache.PASSWORD_ENV: server.password}
        access = cache.check_access(cache.named_access(server.url, environ=env))
        link = CacheLink(access, "co:cpu:abc:")
        link.put("k", b"over TLS")
        assert link.get("k") == b"over TLS"
        plain = CacheAccess(server.url.replace("rediss://", "redis://").split("?")[0], server.password)
        with pytest.raises(cache.CacheAddressError):  # the server speaks TLS only
            cache.check_access(plain, timeout_s=2)
        with pytest.raises(cache.CacheAddressError) as refused:
            cache.check_access(cache.named_access(server.url, environ={cache.PASSWORD_ENV: "nope"}))
        assert "nope" not in str(refused.value) and server.password not in str(refused.value)
