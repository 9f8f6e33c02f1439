"""Access to the shared compile cache's Redis server, and the seal on every entry in it.

The shared cache holds what Inductor unpickles (compiled FX graphs) and what steers its kernel
choices (autotune timings and configs), so it is a trust boundary twice over:

- **Who may talk to the server.** A `CacheAccess` names the server by a URL that never holds its
  password (`redis://`, `rediss://` with TLS, `unix://` for a socket) and carries the password
  apart, left out of every printed form (`repr`, `str`, errors). The driver's embedded server
  listens on a unix socket only its user can open and asks for a random password; a fleet's own
  server is named with `--cache-redis` and its password comes from an environment variable or a
  file.
- **What may be used from it.** Every entry the project's jobs write is sealed: an HMAC-SHA256
  over the entry's key and bytes, keyed by the fleet's secret (`CacheAccess.key`), before the
  bytes. A reader checks the seal before anything is decoded (`unseal`): an entry without one, with
  a wrong one, or moved under another key is a miss, counted, never unpickled. Whoever holds the
  secret can write entries every job trusts (that is what the secret is for); whoever can only
  reach the server (or holds its password but not the secret) can at most delete entries.

The access travels to a job process through its environment (`to_env`, read and removed by
`from_env` before anything else runs in it), never its command line, and never into rows, logs
or errors. This module imports neither torch nor Ray; `redis` only when a client is made.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import struct
from dataclasses import dataclass, field, replace
from typing import Any
from urllib.parse import urlsplit

TIMEOUT_S = 2.0
"""Connect and read timeout of every cache call, in seconds: a server that has not answered by
then is treated as gone for the rest of the process (`compiler.cache_backend.CacheLink`)."""
URL_ENV = "CO_SHARED_CACHE"
"""The server's URL in a job process's environment (set by the runner; no password in it)."""
SECRET_ENV = "CO_SHARED_CACHE_SECRET"
"""The password and the entry key, as JSON, in a job process's environment; the process removes
it from its environment first thing (`from_env`), so nothing it starts inherits it."""
OFF_ENV = "CO_SHARED_CACHE_OFF"
"""Why the driver stopped using the cache, in a job process's environment: the job does not
connect, and its row says so."""
SEAL = b"co-hmac-v1:"
"""The start of every sealed entry, before its 32-byte HMAC."""
_KEY_CONTEXT = b"compile-orchestrator shared compile cache entries v1"


@dataclass(frozen=True)
class CacheAccess:
    """How a process reaches the shared cache, and the key that seals its entries."""

    url: str
    """`redis://[user@]host:port[/db][?options]`, `rediss://...` (TLS; `ssl_ca_certs=PATH` among
    the options for a private CA) or `unix:///path/to/socket`: never a password."""
    password: str | None = field(default=None, repr=False)
    key: bytes = field(default=b"", repr=False)
    """The fleet's secret for sealing entries (`seal`)."""
    off: str | None = None
    """Why the driver stopped using the cache mid-run (None: in use): jobs then do not connect."""

    def __str__(self) -> str:
        return self.url

    def stopped(self, why: str) -> CacheAccess:
        """The same access, no longer to be used, and why."""
        return replace(self, off=why)

    def client(self, timeout_s: float = TIMEOUT_S) -> Any:
        """A `redis.Redis` for this server: `timeout_s` to connect and to read, and no retries of
        its own (redis-py retries a failed call by default: each retry would cost another
        timeout)."""
        import redis
        from redis.backoff import NoBackoff
        from redis.retry import Retry

        return redis.Redis.from_url(
            self.url,
            password=self.password,
            socket_connect_timeout=timeout_s,
            socket_timeout=timeout_s,
            retry=Retry(NoBackoff(), 0),
            health_check_interval=0,
        )

    def to_env(self, env: dict[str, str]) -> None:
        """Put this access into a job process's environment (`from_env` reads it there)."""
        env[URL_ENV] = self.url
        env[SECRET_ENV] = json.dumps({"password": self.password, "key": self.key.hex()})
        if self.off:
            env[OFF_ENV] = self.off
        else:
            env.pop(OFF_ENV, None)


def clear_env(env: dict[str, str]) -> None:
    """No shared cache for the process of this environment."""
    for name in (URL_ENV, SECRET_ENV, OFF_ENV):
        env.pop(name, None)


def from_env(environ: Any) -> CacheAccess | None:
    """The access `to_env` put into `environ` (None: no shared cache), taken out of it: the
    secret is removed at once, so that the compilers, linkers and compile workers this process
    starts never inherit it."""
    url = environ.get(URL_ENV)
    raw = environ.pop(SECRET_ENV, None)
    if not url:
        return None
    try:
        secret = json.loads(raw or "{}")
        return CacheAccess(
            url, secret.get("password"), bytes.fromhex(secret.get("key") or ""), environ.get(OFF_ENV)
        )
    except (ValueError, TypeError, AttributeError):
        return CacheAccess(url, off="its credentials did not reach this job process intact")


def derive_key(secret: bytes | str) -> bytes:
    """The entry key derived from a secret (a server's password where the fleet names no secret of
    its own): an HMAC of a fixed context, so the key is never the password itself."""
    raw = secret.encode() if isinstance(secret, str) else secret
    return hmac.new(raw, _KEY_CONTEXT, hashlib.sha256).digest()


def _mac(key: bytes, name: bytes, payload: bytes) -> bytes:
    return hmac.new(key, struct.pack(">I", len(name)) + name + payload, hashlib.sha256).digest()


def seal(key: bytes, name: bytes | str, payload: bytes) -> bytes:
    """`payload` as stored under `name`: `SEAL`, the HMAC of the name and the payload, then the
    payload."""
    name = name.encode() if isinstance(name, str) else name
    return SEAL + _mac(key, name, payload) + payload


def unseal(key: bytes, name: bytes | str, stored: bytes) -> tuple[bytes | None, str | None]:
    """The payload of an entry read under `name`, or None and why it is not to be used: no seal
    (written by something else than this project's jobs), or a seal that does not verify (another
    key, another entry's bytes, or bytes moved from another key)."""
    name = name.encode() if isinstance(name, str) else name
    if not isinstance(stored, bytes) or not stored.startswith(SEAL) or len(stored) < len(SEAL) + 32:
        return None, "not sealed"
    mac, payload = stored[len(SEAL) : len(SEAL) + 32], stored[len(SEAL) + 32 :]
    if not hmac.compare_digest(mac, _mac(key, name, payload)):
        return None, "its seal does not verify"
    return payload, None


def printable_url(text: str) -> str:
    """`text` with any password in it replaced by `***`, for messages."""
    try:
        parts = urlsplit(text)
    except ValueError:
        return "(an address that is not a URL)"
    if parts.password is None:
        return text
    user = parts.username or ""
    host = parts.netloc.rpartition("@")[2]
    return parts._replace(netloc=f"{user}:***@{host}").geturl()
