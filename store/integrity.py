"""Damaged output directories: which files of a table are its parts, which are damaged, which
are strays, and moving damaged ones aside (quarantine) instead of deleting them.

A table folder holds `hardware=<class>/part-<uuid>.parquet` files written whole by the sink.
Anything else found there is classified, never guessed at:

- names starting with `.` or `_` (a write in progress, `_SUCCESS` markers): skipped silently,
  except a `_….parquet` file (a part renamed out of sight) and a folder named like a part, which
  are strays;
- any other file that is not `hardware=<class>/<name>.parquet`, and any FIFO, socket or device
  (never opened: a FIFO would wait): a *stray* (a note someone left,
  a copy in the wrong folder), ignored with a warning that names it;
- a part that fails the strict reader (`store.reader`: not in the commit ledger,
  bytes that differ from it, a page whose CRC fails, columns of the wrong name or type, rows that
  break the table's rules): *damaged*, *foreign* or *missing*. Readers refuse to answer from an
  incomplete table and name the file; `orchestrate sweep --resume` moves it to
  `<out>/quarantine/<time>/` and runs its jobs again (their rows went with it).

Part files are written with page checksums (`write_page_checksum`), and read with verification,
so a flipped bit in a data page is found, not read as a wrong latency.
"""

from __future__ import annotations

import re
import time
import warnings
from dataclasses import dataclass

from store.layout import QUARANTINE_DIR
from store.storage import Location, StorageError

PART_DIR_RE = re.compile(r"^hardware=[^/]+$")
MAX_REASON_CHARS = 200


class OutputWarning(UserWarning):
    """A problem in an output directory that is worked around (the CLI prints it as one line)."""


class StrayFileWarning(OutputWarning):
    """A file in a table folder that this tool did not write; it is ignored."""


@dataclass(frozen=True)
class DamagedFile:
    loc: Location
    rel: str
    """Its path inside the output directory, e.g. results/hardware=cpu/part-1f2e.parquet."""
    reason: str
    kind: str = "damaged"
    """damaged (bytes or rows wrong), foreign (not in the commit ledger), missing (listed, gone)."""


class DamagedOutputError(StorageError):
    """A table with part files that fail the strict reader (`store.reader`); the
    message names them and the fix."""

    def __init__(self, out: Location, damaged: list[DamagedFile], fix: str):
        self.out = out
        self.damaged = damaged
        names = "; ".join(f"{d.rel} ({d.kind}: {d.reason})" for d in damaged[:5])
        more = f" and {len(damaged) - 5} more" if len(damaged) > 5 else ""
        super().__init__(f"{out}: damaged part file(s): {names}{more}. {fix}")


class LinkedFolderError(StorageError):
    """A table folder, or a partition folder in it, that is a symbolic link."""


def refuse_linked(table_dir: Location) -> None:
    """`LinkedFolderError` where `table_dir` (local) or a folder in it is a symbolic link: through
    it a reader would answer with another output's rows, and `--resume` would move that output's
    files into this one's quarantine. (A link to the whole output is fine: it is one output.)"""
    if not table_dir.is_local:
        return
    path = table_dir.local_path
    links = [path] if path.is_symlink() else []
    if not links and path.is_dir():
        links = sorted(p for p in path.iterdir() if p.is_symlink() and p.is_dir())
    if links:
        raise LinkedFolderError(
            f"{links[0]} is a symbolic link to {links[0].resolve()}: an output's tables are folders of its "
            "own (a report through the link would show another output's rows, and --resume would move its "
            "files); replace the link with a copy (cp -rL), or link the whole output instead"
        )


def list_parts(table_dir: Location, sizes: dict[str, int] | None = None) -> tuple[list[Location], list[str]]:
    """(the part files under `table_dir`, the stray files as paths relative to it), sorted;
    `LinkedFolderError` where it or a folder in it is a symbolic link. `sizes`, if given, gets each
    part's size in bytes by its path (from the listing: no request per file on an object store)."""
    import pyarrow.fs as pafs

    refuse_linked(table_dir)
    if not table_dir.is_dir():
        return [], []
    root = table_dir.path.rstrip("/")
    infos = table_dir.fs.get_file_info(pafs.FileSelector(root, recursive=True))
    parts, strays = [], []
    for info in sorted(infos, key=lambda i: i.path):
        rel = info.path[len(root) :].lstrip("/")
        pieces = rel.split("/")
        if info.type == pafs.FileType.Directory and len(pieces) == 2 and pieces[1].endswith(".parquet"):
            strays.append(rel)  # a folder where a part belongs: its rows are not there
            continue
        if info.type in (pafs.FileType.Directory, pafs.FileType.NotFound):
            continue
        if any(p.startswith((".", "_")) for p in pieces[:-1]) or pieces[-1].startswith("."):
            continue
        if pieces[-1].startswith("_") and not pieces[-1].endswith(".parquet"):
            continue  # a `_SUCCESS` marker; a `_…parquet` is a part hidden by a rename: a stray
        if info.type != pafs.FileType.File:  # a FIFO, socket or device: never opened (a FIFO waits)
            strays.append(rel)
        elif (
            len(pieces) == 2
            and PART_DIR_RE.match(pieces[0])
            and pieces[1].endswith(".parquet")
            and pieces[1][0] != "_"
        ):
            parts.append(table_dir.join(*pieces))
            if sizes is not None and info.size is not None:
                sizes[parts[-1].path] = info.size
        else:
            strays.append(rel)
    return parts, strays


def warn_strays(table_dir: Location, strays: list[str]) -> None:
    for rel in strays:
        warnings.warn(
            f"ignoring {table_dir.join(rel)}: not a part file this tool writes (those are "
            "hardware=<class>/<name>.parquet); move it out of the output directory",
            StrayFileWarning,
            stacklevel=3,
        )


def quarantine(out: Location, rels: list[str], stamp: str | None = None) -> list[tuple[str, Location]]:
    """Move the files `rels` (relative to `out`) to `out/quarantine/<stamp>/`, keeping their
    relative paths; return (rel, new location) for each. Nothing is deleted."""
    stamp = stamp or time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    moved = []
    for rel in rels:
        src = out.join(*rel.split("/"))
        dest = out.join(QUARANTINE_DIR, stamp, *rel.split("/"))
        if dest.is_local:
            dest.local_path.parent.mkdir(parents=True, exist_ok=True)
        dest.fs.move(src.path, dest.path)
        moved.append((rel, dest))
    return moved
