"""Signed exports: an HMAC-SHA256 of `manifest.json` with a key the exporting and the serving side
share, written beside it as `manifest.sig`.

Why: the manifest's sha256 list makes a damaged or swapped file fail, but nothing says who wrote
the manifest itself. Whoever can write to the export's location can write a new manifest with
the sha256 of their own bundle (pickles, and code Inductor runs) or package (a compiled library),
and `compile_tuned` then runs that code in the serving process. With a key named on the serving
side (`compile_tuned(..., trusted_key_file=...)` or `$ORCHESTRATE_EXPORT_KEY_FILE`), an export is
used only if its manifest's signature verifies with that key; the manifest's sha256 list then
vouches for every other file.

`manifest.sig` is JSON: `algorithm` (`hmac-sha256`), `key_id` (the first 8 hex digits of the
key's sha256: which key signed, never the key) and `signature` (hex). The MAC covers a fixed
label and the manifest's exact bytes. A key is a file's bytes, surrounding white space stripped,
at least 16 bytes (`python -c 'import secrets; print(secrets.token_hex(32))' > export.key`). The key
never appears in a message, a log, a file of the export or `Applied`.

HMAC is symmetric: a serving node that holds the key could sign too. Keep the key readable only
by the exporting job and the serving processes, never by whoever can write the export's location.
A signature says the key's holder wrote this manifest, not that it is the newest one: someone
who can write the location can put back an older export signed with the same key.

This module imports neither torch, Ray nor the orchestrator package."""

from __future__ import annotations

import hashlib
import hmac
import json
import os
from pathlib import Path
from typing import Any

from compiler.serving.files import MANIFEST, ExportError, ExportFiles

SIGNATURE = "manifest.sig"
KEY_ENV = "ORCHESTRATE_EXPORT_KEY_FILE"
"""Environment variable: the key file, for `orchestrate export` (sign) and `compile_tuned` (verify)
where neither names one."""
ALGORITHM = "hmac-sha256"
MIN_KEY_BYTES = 16
_MAX_FILE = 64 * 1024
"""A key file or a signature is a few dozen bytes: a larger one is not one."""
_LABEL = b"compile-orchestrator export manifest\n"
"""What the MAC covers ahead of the manifest: a key used for something else signs nothing here."""
_MAKE_ONE = "python -c 'import secrets; print(secrets.token_hex(32))' > FILE"


class SignatureError(ExportError):
    """The serving side names a key and the export is not signed with it: nothing in the export is
    trusted. `compile_tuned` raises it whatever `strict` says."""


def key_id(key: bytes) -> str:
    """Which key: the first 8 hex digits of its sha256 (says nothing useful about the key)."""
    return hashlib.sha256(key).hexdigest()[:8]


def read_key(path: str | os.PathLike[str]) -> bytes:
    """The key in the file `path`; ExportError (naming the file, never its content) otherwise."""
    try:
        with open(path, "rb") as f:
            raw = f.read(_MAX_FILE + 1)
    except OSError as exc:
        raise ExportError(f"{path}: cannot read the export key ({exc.strerror or exc})") from None
    key = raw.strip()
    if len(raw) > _MAX_FILE or len(key) < MIN_KEY_BYTES:
        size = f"over {_MAX_FILE}" if len(raw) > _MAX_FILE else str(len(key))
        raise ExportError(
            f"{path}: {size} bytes is not an export key (at least {MIN_KEY_BYTES}, a few dozen); make one with "
            f"{_MAKE_ONE}"
        )
    return key


def named_key(key: bytes | None = None, key_file: str | os.PathLike[str] | None = None) -> bytes | None:
    """The key a caller names: `key` itself, else the file `key_file`, else the file
    `$ORCHESTRATE_EXPORT_KEY_FILE`; None where none is named."""
    if key is not None and key_file is not None:
        raise ExportError("give the export key or its file, not both")
    if key is not None:
        if not isinstance(key, bytes):
            raise TypeError(
                f"the export key is bytes, not {type(key).__name__} (for a file, name it as the key file)"
            )
        if len(key) < MIN_KEY_BYTES:
            raise ExportError(f"an export key of {len(key)} bytes is too short (at least {MIN_KEY_BYTES})")
        return key
    path = key_file if key_file is not None else os.environ.get(KEY_ENV) or None
    return None if path is None else read_key(path)


def sign(manifest: bytes, key: bytes) -> bytes:
    """The text of `manifest.sig` for the manifest's exact bytes."""
    doc = {"algorithm": ALGORITHM, "key_id": key_id(key), "signature": _mac(manifest, key), "signs": MANIFEST}
    return (json.dumps(doc, indent=1, sort_keys=True) + "\n").encode()


def verify(export: ExportFiles, manifest: bytes, key: bytes) -> str:
    """Check `manifest` (the bytes of `export`'s manifest, not yet parsed) against the export's
    `manifest.sig` with `key`: the key's id, or SignatureError saying what is wrong and what to do."""
    where, trusted = export.where(SIGNATURE), key_id(key)
    raw = export.unlisted(SIGNATURE, _MAX_FILE)
    if raw is None:
        raise SignatureError(
            f"{where}: missing: the export is not signed, and this process trusts only exports signed with key "
            f"{trusted}; export it with `orchestrate export ... --sign-key-file FILE` (that key's file)"
        )
    doc = _parse(raw)
    if doc is None:
        raise SignatureError(f"{where}: not a signature this code reads; sign the export again")
    if doc["algorithm"] != ALGORITHM:
        raise SignatureError(f"{where}: algorithm {doc['algorithm'][:40]!r}, this code verifies {ALGORITHM}")
    if doc["key_id"] != trusted:
        raise SignatureError(
            f"{where}: signed with key {doc['key_id'][:16]}, this process trusts key {trusted}; name the key the "
            "export was signed with, or export it again signed with this one"
        )
    if not hmac.compare_digest(doc["signature"], _mac(manifest, key)):
        raise SignatureError(
            f"{where}: the signature does not match {export.where(MANIFEST)}: the manifest was changed after it "
            "was signed, so nothing in this export is trusted; export it again, signed"
        )
    return trusted


def _mac(manifest: bytes, key: bytes) -> str:
    return hmac.new(key, _LABEL + manifest, hashlib.sha256).hexdigest()


def _parse(raw: bytes) -> dict[str, str] | None:
    try:
        doc: Any = json.loads(raw)
    except ValueError:
        return None
    fields = ("algorithm", "key_id", "signature")
    if not isinstance(doc, dict) or not all(isinstance(doc.get(k), str) for k in fields):
        return None
    return {k: doc[k] for k in fields}


def write_signature(dest: Path, manifest: bytes, key: bytes | None) -> None:
    """`dest/manifest.sig` for `manifest` with `key`, durably; without a key, no signature there
    (one an earlier, interrupted try left would sign another manifest)."""
    from compiler import durable

    if key is None:
        (dest / SIGNATURE).unlink(missing_ok=True)
        return
    durable.write_bytes(dest / SIGNATURE, sign(manifest, key))
