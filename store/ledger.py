"""The commit ledger of an output: which part files the sink committed, with their digests.

`<out>/_ledger/<time>-<id>.jsonl` holds one JSON line per committed part file::

    {"part": "results/hardware=cpu/part-1f2e.parquet", "sha256": "...", "rows": 1, "job_ids": ["..."]}

Each `ResultSink` appends to a segment of its own, after the parts it lists are durable: locally
the lines are appended to the file and fsynced (the folder too when the file is new); on an object
store (s3://, gs://), which cannot append, the segment is PUT again whole. A crash between a part
and its line leaves an unlisted part, which the strict reader (`store.reader`) names
and `sweep --resume` moves into quarantine (its job runs again), like rows never written.

A line that does not parse (a torn last line after a power cut) lists nothing; the folder name
starts with `_`, so Parquet readers and the part listing skip it.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass

from store.layout import LEDGER_DIR
from store.storage import Location, StorageError

SEGMENT_SUFFIX = ".jsonl"
MAX_SEGMENT_BYTES = 256 * 2**20
"""A segment larger than this is not read (no sink writes one; 10k one-row commits are ~2 MiB)."""


@dataclass(frozen=True)
class Entry:
    """One committed part file."""

    part: str
    """Its path inside the output, e.g. results/hardware=cpu/part-1f2e.parquet."""
    sha256: str
    rows: int
    job_ids: tuple[str, ...]
    segment: str = ""
    """The ledger segment that lists it (its name inside `_ledger/`)."""

    def line(self) -> str:
        record = {"part": self.part, "sha256": self.sha256, "rows": self.rows, "job_ids": list(self.job_ids)}
        return json.dumps(record, sort_keys=True) + "\n"


def entry(part: str, data: bytes, rows: int, job_ids: Iterable[str]) -> Entry:
    """The ledger entry of a part whose file holds `data`."""
    return Entry(part, hashlib.sha256(data).hexdigest(), rows, tuple(sorted(set(job_ids))))


@dataclass
class Ledger:
    """What the segments of `<out>/_ledger/` list."""

    entries: dict[str, list[Entry]]
    """Part path -> its entries (one, unless a repair listed it again in a new segment)."""
    segments: list[Location]
    unreadable: list[str]
    """Segment lines that could not be read, as `segment:line` (they list nothing)."""


def ledger_dir(out: Location) -> Location:
    return out.join(LEDGER_DIR)


class NotALedgerError(StorageError):
    """`<out>/_ledger` is there but is not a folder: which parts were committed is unknown."""


def not_a_folder(out: Location) -> str | None:
    """What `<out>/_ledger` is when it exists but is not a folder (a regular file, ...), else None."""
    import pyarrow.fs as pafs

    folder = ledger_dir(out)
    kind = folder.fs.get_file_info(folder.path).type
    if folder.is_local and folder.local_path.is_symlink():  # another output's ledger, or none
        return "a symbolic link to a missing target" if kind == pafs.FileType.NotFound else "a symbolic link"
    if kind in (pafs.FileType.NotFound, pafs.FileType.Directory):
        return None
    return "a regular file" if kind == pafs.FileType.File else "not a regular file or folder"


def load(out: Location) -> Ledger | None:
    """The ledger of `out`, or None when it has none (an output written before ledgers);
    `NotALedgerError` when `_ledger` is something else than a folder."""
    import pyarrow.fs as pafs

    folder = ledger_dir(out)
    what = not_a_folder(out)
    if what:
        raise NotALedgerError(
            f"{folder}: {what}, not the folder of the commit ledger (which lists the part files committed, "
            "with their digests), so no part can be checked against it"
        )
    if not folder.is_dir():
        return None
    infos = folder.fs.get_file_info(pafs.FileSelector(folder.path, recursive=False))
    ledger = Ledger({}, [], [])
    for info in sorted(infos, key=lambda i: i.base_name):
        if info.type != pafs.FileType.File or not info.base_name.endswith(SEGMENT_SUFFIX):
            continue
        segment = folder.join(info.base_name)
        ledger.segments.append(segment)
        if info.size is not None and info.size > MAX_SEGMENT_BYTES:
            ledger.unreadable.append(f"{info.base_name}: {info.size} bytes, larger than any sink writes")
            continue
        for n, line in enumerate(segment.read_bytes().split(b"\n"), 1):
            if not line.strip():
                continue
            try:
                found = _parse(line, info.base_name)
            except (ValueError, TypeError, KeyError, RecursionError):  # nested too deeply: not ours
                ledger.unreadable.append(f"{info.base_name}:{n}")
                continue
            ledger.entries.setdefault(found.part, []).append(found)
    return ledger


def _parse(line: bytes, segment: str) -> Entry:
    record = json.loads(line)
    part, sha, rows, ids = record["part"], record["sha256"], record["rows"], record["job_ids"]
    if not (isinstance(part, str) and isinstance(sha, str) and type(rows) is int and isinstance(ids, list)):
        raise ValueError("not a ledger entry")
    if not all(isinstance(i, str) for i in ids):
        raise ValueError("job_ids are not strings")
    return Entry(part, sha, rows, tuple(ids), segment)


def fsync_path(path: str | os.PathLike[str]) -> None:
    """fsync a local file or directory by its path (a directory: its entries are durable)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class LedgerWriter:
    """Appends entries to a new segment of `<out>/_ledger/` (created on the first append)."""

    def __init__(self, out: Location, label: str = ""):
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
        name = f"{stamp}-{label + '-' if label else ''}{uuid.uuid4().hex[:12]}{SEGMENT_SUFFIX}"
        self.segment = ledger_dir(out).join(name)
        self._text: list[str] = []

    def append(self, entries: list[Entry]) -> None:
        """List `entries` durably: when this returns, a power cut does not unlist them."""
        if not entries:
            return
        text = "".join(e.line() for e in entries)
        if not self.segment.is_local:  # no append on an object store: the segment again, whole
            self._text.append(text)
            self.segment.write_bytes("".join(self._text).encode())
            return
        path = self.segment.local_path
        new = not path.exists()
        if new:
            path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            data = memoryview(text.encode())
            while data:
                data = data[os.write(fd, data) :]
            os.fsync(fd)
        finally:
            os.close(fd)
        if new:
            fsync_path(path.parent)
            fsync_path(path.parent.parent)
