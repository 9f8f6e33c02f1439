"""An embedded server's autotune work kept in the output (`OUT/shared-cache.parquet`) and loaded into
the next run's server.

An embedded server dies with its run, and its autotune work with it, unless the run keeps a
snapshot: `snapshot` writes the server's autotune entries (the GEMM/conv timings and Triton's best
configs; not the FX graphs, which are large, cost seconds to rebuild, and are pickles) as Parquet
rows, and `restore` loads them into the next server. A tune cut at a deadline and resumed
elsewhere (on another node of its class) so keeps the minutes of max-autotune benchmarking it had
done.

Each server seals its entries with a key of its own (`orchestrator.fleet.cache_server`), so the
file holds what the entries say, not their seals: `snapshot` keeps only entries whose seal
verifies with this server's key (what this run's jobs wrote or the driver loaded), and `restore`
seals what it loads with the next server's key, after checking that each entry is one of the two
kinds of autotune data, plain JSON that nothing unpickles (`kept_kind`). An FX-graph entry, or
anything else, in a snapshot file is left out, never sealed.
"""

from __future__ import annotations

import json
import re
from typing import Any

from compiler.cache_access import CacheAccess, seal, unseal
from compiler.cache_link import field_name
from compiler.shared_cache import GEMM_KEY
from store.storage import Location

_NAMESPACE = r"co:[A-Za-z0-9_.-]+:[0-9a-f]{12}:"
_GEMM = re.compile(_NAMESPACE + re.escape(GEMM_KEY))
_TRITON = re.compile(_NAMESPACE + r"pt2:[0-9a-f]{16,}::[^:]+:c1")
"""Inductor's Triton autotune entries (`RemoteAutotuneCache`): `pt2:<cache id>::<key>:c1` with a
hex digest for the cache id. The caches whose entries are pickles have named ids (`fx-graph-v1`)."""


def kept_kind(key: bytes, field: bytes | None, value: bytes) -> str | None:
    """Why an entry may not go from a snapshot into a server, or None: a GEMM timing (a field of
    the namespace's `gemm-autotune` hash: a JSON list of four keys, a JSON number) or a Triton
    autotune config (a string under a hex cache id: a JSON object)."""
    try:
        name = key.decode()
        data = json.loads(value)
        if field is None:
            if _TRITON.fullmatch(name) and isinstance(data, dict):
                return None
            return "not a Triton autotune entry"
        parts = json.loads(field)
        number = isinstance(data, (int, float)) and not isinstance(data, bool)
        if _GEMM.fullmatch(name) and isinstance(parts, list) and len(parts) == 4 and number:
            return None
        return "not a GEMM autotune timing"
    except (UnicodeDecodeError, ValueError):
        return "not JSON"


def _entries(client: Any, key_for_seals: bytes) -> list[tuple[bytes, bytes | None, bytes]]:
    """The server's autotune entries whose seals verify, unsealed: (key, field or None, value)."""
    entries: list[tuple[bytes, bytes | None, bytes]] = []
    for key in sorted(client.scan_iter(match="co:*", count=1000)):
        kind = client.type(key)
        if kind == b"string":
            value, _ = unseal(key_for_seals, key, client.get(key) or b"")
            if value is not None and kept_kind(key, None, value) is None:
                entries.append((key, None, value))
        elif kind == b"hash":
            for f, stored in sorted(client.hgetall(key).items()):
                value, _ = unseal(key_for_seals, field_name(key, f.decode(errors="replace")), stored)
                if value is not None and kept_kind(key, f, value) is None:
                    entries.append((key, f, value))
    return entries


def snapshot(access: CacheAccess, file: Location, unchanged: bytes | None = None) -> bytes | None:
    """Write the server's autotune entries (those `kept_kind` admits, whose seals verify) to `file`
    as Parquet rows (key, field, value; field null for a string). Returns the bytes written, or
    `unchanged` itself when the table equals it (nothing written); None when there was nothing
    to keep."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    client = access.client()
    try:
        entries = _entries(client, access.key)
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


def restore(access: CacheAccess, file: Location) -> tuple[int, int]:
    """Seal the entries of a `snapshot` file with this server's key and put them into it: (entries
    loaded, entries left out because `kept_kind` refused them)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = pq.read_table(pa.BufferReader(file.read_bytes())).to_pylist()
    client = access.client()
    loaded = 0
    try:
        pipe = client.pipeline(transaction=False)
        for row in rows:
            key, field, value = row["key"], row["field"], row["value"]
            if kept_kind(key, field, value) is not None:
                continue
            if field is None:
                pipe.set(key, seal(access.key, key, value))
            else:
                pipe.hset(key, field, seal(access.key, field_name(key, field.decode()), value))
            loaded += 1
        pipe.execute()
    finally:
        client.close()
    return loaded, len(rows) - loaded
