"""One process's link to the shared compile cache: every read and write of its entries.

A `CacheLink` is what a job process (and each of its compile workers) talks to the server
through. It prefixes every key with the job's namespace (`co:<class>:<stack hash>:`), seals what
it writes and checks the seal of what it reads (`compiler.cache_access`): an entry that fails the
check is a miss, counted in `rejected`, and its bytes go no further. Every call has a short
connect and read timeout (`cache_access.TIMEOUT_S`) and no retries; the first call that fails
takes the link down for the rest of the process (`down`, with why), so a server that dies or
hangs costs the process one timeout and its sharing, never its compile.

This module imports neither torch nor Ray (`redis` when the first call is made).
"""

from __future__ import annotations

import contextlib
import threading
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from compiler.cache_access import CacheAccess, seal, unseal


@dataclass
class CacheLink:
    access: CacheAccess
    namespace: str
    """The prefix of every key this link reads and writes."""
    down: str | None = None
    """Why the link stopped being used (None: up)."""
    rejected: Counter[str] = field(default_factory=Counter)
    """Entries read but not used, by why (`unseal`'s reasons)."""
    served: int = 0
    """Entries read that passed the check and were handed on."""
    misses: int = 0
    """Reads of a key the server did not hold."""
    on_first_serve: Any = None
    """Called once, when the first entry is handed on (the job process records it at once: a
    compile that then crashes must still say the cache had a part in it)."""
    _client: Any = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def _call(self, what: str, fn: Any) -> Any:
        """`fn(client)`, or None once the link is down (taking it down if this call fails)."""
        if self.down is not None:
            return None
        try:
            with self._lock:  # one connection, used by Inductor's threads and this process's
                if self._client is None:
                    self._client = self.access.client()
                return fn(self._client)
        except Exception as exc:  # redis.RedisError, OSError, ssl errors: the server, never the job
            self.lose(f"{what}: {type(exc).__name__}: {exc}")
            return None

    def lose(self, why: str) -> None:
        """Stop using the cache in this process (the first reason is kept)."""
        if self.down is None:
            self.down = why
        client, self._client = self._client, None
        if client is not None:
            with contextlib.suppress(Exception):  # closing a broken connection: nothing more to lose
                client.close()

    def ping(self) -> str | None:
        """None if the server answers (authenticated), else why not; a failure takes the link down."""
        self._call("PING", lambda c: c.ping())
        return self.down

    def _full(self, key: str) -> bytes:
        return (self.namespace + key).encode()

    def _take(self, name: bytes, stored: Any, use: bool = True) -> bytes | None:
        """The payload of `stored` read under `name` if its seal verifies (counted as `used` where
        `use`), else None (a miss, or a rejection counted by why)."""
        if stored is None:
            self.misses += 1
            return None
        payload, why = unseal(self.access.key, name, stored)
        if payload is None:
            self.rejected[why or "rejected"] += 1
            return None
        if use:
            self.used()
        return payload

    def used(self, n: int = 1) -> None:
        """`n` entries were handed on to torch (`on_first_serve` at the first)."""
        first = self.served == 0
        self.served += n
        if first and n and self.on_first_serve is not None:
            with contextlib.suppress(Exception):
                self.on_first_serve()

    def get(self, key: str) -> bytes | None:
        """The payload stored under the namespaced `key`, if sealed by the fleet's secret for
        that key; else None (a miss)."""
        name = self._full(key)
        return self._take(name, self._call("GET", lambda c: c.get(name)))

    def put(self, key: str, payload: bytes) -> None:
        name = self._full(key)
        self._call("SET", lambda c: c.set(name, seal(self.access.key, name, payload)))

    def hash_items(self, key: str) -> dict[str, bytes]:
        """The fields of the hash at the namespaced `key` whose values are sealed for that field;
        not counted as used (the caller counts those it uses: `used`)."""
        name = self._full(key)
        entries = self._call("HGETALL", lambda c: c.hgetall(name)) or {}
        found: dict[str, bytes] = {}
        for raw_field, stored in entries.items():
            text = raw_field.decode(errors="replace") if isinstance(raw_field, bytes) else str(raw_field)
            payload = self._take(field_name(name, text), stored, use=False)
            if payload is not None:
                found[text] = payload
        return found

    def hash_put(self, key: str, mapping: dict[str, bytes]) -> bool:
        """Seal and write `mapping` into the hash at the namespaced `key`; whether it was written."""
        name = self._full(key)
        sealed = {f: seal(self.access.key, field_name(name, f), v) for f, v in mapping.items()}
        return self._call("HSET", lambda c: c.hset(name, mapping=sealed)) is not None

    def counts(self) -> dict[str, Any]:
        """What this link did, as plain data (a compile worker reports it to its job process)."""
        return {
            "served": self.served,
            "misses": self.misses,
            "rejected": dict(self.rejected),
            "down": self.down,
        }

    def add(self, counts: dict[str, Any]) -> None:
        """Count what another link reported (`counts`) as this one's: a compile worker's."""
        self.served += int(counts.get("served") or 0)
        self.misses += int(counts.get("misses") or 0)
        self.rejected.update({str(k): int(v) for k, v in (counts.get("rejected") or {}).items()})
        if counts.get("down") and self.down is None:
            self.down = f"in a compile worker: {counts['down']}"

    def rejections(self) -> str | None:
        """The entries rejected so far, in words, or None."""
        if not self.rejected:
            return None
        total = sum(self.rejected.values())
        parts = ", ".join(f"{why}: {n}" for why, n in sorted(self.rejected.items()))
        return f"{total} entr{'y' if total == 1 else 'ies'} rejected ({parts})"


def field_name(key: bytes, field_text: str) -> bytes:
    """What a hash field's seal covers: the hash's key and the field's name."""
    return key + b"\x00" + field_text.encode()
