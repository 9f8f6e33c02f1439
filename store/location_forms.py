"""The forms a location takes on the command line, checked once, at the edge, without I/O.

`--out`, `--dest`, `--history`, `--baseline`, `--prune-from` and the `OUT` of `report`,
`presets`, `kernels` and `export` all accept the same forms:

- a local path (`runs/smoke`, `/data/runs/x`, `./name:with:colons`);
- `file:///ABSOLUTE/PATH` (three slashes, no host, no `?query`);
- `s3://BUCKET/PREFIX` and `gs://BUCKET/PREFIX`, with the options `pyarrow.fs` reads from the
  query (`?region=`, `?endpoint_override=HOST:PORT&scheme=http`, ...), and the other
  `pyarrow.fs` schemes of `SCHEMES`.

Refused, with one line that says what to write instead: a scheme without `//` (`file:/x`,
`s3:bucket`: pyarrow would take it for a local path, or fail on it), a `#fragment` (no
filesystem has one), a query on `file://` (it would be dropped silently), an unknown scheme, and a
local path longer than the system allows (PATH_MAX bytes, or NAME_MAX bytes for one name).

This module reads no file and contacts nothing; `storage` builds on it. `check_form(text)` is
what `storage.resolve` runs first; `arg` is the same check as an argparse
type, so a bad form is refused while the flags are parsed, before anything runs.
"""

from __future__ import annotations

import argparse
import os
import re
from urllib.parse import urlsplit, urlunsplit

SCHEMES = ("file", "s3", "gs", "gcs", "abfs", "abfss", "hdfs", "viewfs")
"""URI schemes accepted for outputs: the `pyarrow.fs` filesystems that every node can reach."""
BUCKET_SCHEMES = ("s3", "gs", "gcs")
_EXAMPLES = "s3://BUCKET/PREFIX, gs://BUCKET/PREFIX or file:///ABSOLUTE/PATH"


class StorageError(ValueError):
    """An output location that cannot be used; the message names it and says what to do."""


def is_uri(target: object) -> bool:
    return isinstance(target, str) and "://" in target


def redact(text: str) -> str:
    """`text` with the secret of a URI's `user:secret@` part replaced by `***`."""
    if not is_uri(text):
        return text
    parts = urlsplit(text)
    userinfo, at, host = parts.netloc.rpartition("@")
    if not at or ":" not in userinfo:
        return text
    netloc = f"{userinfo.split(':', 1)[0]}:***@{host}"
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))


def check_uri(uri: str) -> None:
    """Refuse a URI that no filesystem could serve (unknown scheme, no bucket, relative file://),
    without contacting anything; `StorageError` says what to write instead."""
    shown = redact(uri)
    scheme = uri.split("://", 1)[0].lower()
    if scheme not in SCHEMES:
        raise StorageError(
            f"{shown}: unknown filesystem scheme {scheme + '://'!r}; write results to a local path or "
            f"a URI such as {_EXAMPLES} (schemes: {', '.join(s + '://' for s in SCHEMES)})"
        )
    netloc = urlsplit(uri).netloc
    if scheme in BUCKET_SCHEMES and not netloc.rpartition("@")[2]:
        raise StorageError(f"{shown}: no bucket in the URI; write {scheme}://BUCKET/PREFIX")
    if scheme == "file" and netloc:
        raise StorageError(
            f"{shown}: a file:// URI takes an absolute path and no host: file:///ABSOLUTE/PATH "
            "(three slashes), or pass the path itself"
        )


PATH_MAX = 4096
"""Bytes in a path, its terminating NUL included (Linux)."""
NAME_MAX = 255
"""Bytes in one name of a path (ext4, xfs, tmpfs, ...)."""
_SCHEME_LIKE = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*):")
_SHOWN = 80


def shown(text: str) -> str:
    """`text` for an error line: secrets redacted, the middle of a very long one elided."""
    text = redact(text)
    return text if len(text) <= _SHOWN else f"{text[:40]}...{text[-30:]} ({len(text)} characters)"


def printable(text: str) -> str:
    """User input echoed in an error line: as it is, or as a Python literal where it holds a control
    character (a newline would split the one line)."""
    return text if text.isprintable() else repr(text)


def check_form(text: str) -> None:
    """Refuse, with `StorageError`, a location written in a form this tool does not read."""
    if not text.strip():
        raise StorageError("an empty path: give a directory (e.g. runs/NAME) or a URI (s3://bucket/prefix)")
    if "\x00" in text:
        raise StorageError(f"{shown(text)!r}: a path cannot hold a NUL character")
    if is_uri(text):
        _check_uri_form(text)
        return
    scheme = _SCHEME_LIKE.match(text)
    if scheme:
        name = scheme.group(1).lower()
        if name in SCHEMES:
            fix = "file:///ABSOLUTE/PATH (three slashes)" if name == "file" else f"{name}://BUCKET/PREFIX"
            if name not in BUCKET_SCHEMES and name != "file":
                fix = f"{name}://HOST/PATH"
            raise StorageError(
                f"{shown(text)}: '{name}:' without '//' is no URI this tool reads: write {fix}"
            )
        raise StorageError(
            f"{shown(text)}: looks like a URI with the unknown scheme {name + ':'!r}; for a local path "
            f"whose first name holds ':', write ./{shown(text)}"
        )
    _check_path_length(text)


def _check_uri_form(uri: str) -> None:
    check_uri(uri)
    try:
        parts = urlsplit(uri)
    except ValueError as exc:  # an unbalanced [ in the host, ...
        raise StorageError(f"{shown(uri)}: not a URI ({exc})") from None
    if parts.fragment or uri.endswith("#"):
        raise StorageError(
            f"{shown(uri)}: a '#fragment' means nothing to a filesystem (it would be dropped); remove it"
        )
    if parts.scheme.lower() == "file" and (parts.query or "?" in uri):
        raise StorageError(
            f"{shown(uri)}: a file:// URI takes no '?query' (it would be dropped); remove it, or pass the path"
        )
    if parts.scheme.lower() == "file":
        _check_path_length(parts.path)


def _check_path_length(path: str) -> None:
    try:
        raw = os.fsencode(os.path.abspath(path))
    except (UnicodeError, ValueError) as exc:
        raise StorageError(f"{shown(path)}: not a path this system can name ({exc})") from None
    if len(raw) >= PATH_MAX:
        raise StorageError(
            f"{shown(path)}: the path is {len(raw)} bytes long; this system allows {PATH_MAX - 1}: pick a "
            "shorter one"
        )
    longest = max(raw.split(b"/"), key=len)
    if len(longest) > NAME_MAX:
        raise StorageError(
            f"{shown(path)}: one of its names is {len(longest)} bytes long; a file system allows {NAME_MAX}: "
            "pick a shorter name"
        )


def arg(text: str) -> str:
    """An argparse type: a location in a form `check_form` accepts (returned as given)."""
    try:
        check_form(text)
    except StorageError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


arg.__name__ = "location"
