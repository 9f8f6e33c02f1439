"""Where a sweep's output lives: a local path or a `pyarrow.fs` URI (s3://, gs://, file://).

Every reader and writer of an output directory goes through a :class:`Location`, a filesystem
and a path inside it, so the rest of the code does not care which one it has::

    out = checked("s3://bucket/runs/smoke?region=eu-west-1")   # or "runs/smoke", Path(...)
    out.join("run.json").write_text(...)

A string containing ``://`` is a URI and goes to ``pyarrow.fs.FileSystem.from_uri``, which reads
options from its query (``?region=``, ``?endpoint_override=HOST:PORT&scheme=http`` for an
S3-compatible store) and credentials from the environment (``AWS_ACCESS_KEY_ID``, ``AWS_PROFILE``,
``AWS_ENDPOINT_URL``, ``GOOGLE_APPLICATION_CREDENTIALS``, ...); anything else is a local path.
Joined paths keep the URI's query, so ``s3://b/p?region=x`` + ``results`` is
``s3://b/p/results?region=x`` on the same filesystem.

Writes are whole files that appear complete or not at all: locally a dot-file renamed into
place; on an object store one PUT (there is no rename, and an object is never visible half
written).
"""

from __future__ import annotations

import contextlib
import errno
import os
import posixpath
import re
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Union
from urllib.parse import urlsplit, urlunsplit

from store.layout import OUTPUT_MARKS, RESULTS_DIR, RUN_FILE, TABLE_DIRS, TUNE_MARKS
from store.location_forms import (  # noqa: F401  (callers import these from here)
    _SCHEME_LIKE,
    BUCKET_SCHEMES,
    SCHEMES,
    StorageError,
    check_form,
    check_uri,
    is_uri,
    redact,
)
from workers.text import format_size  # noqa: F401  (callers import it from here too)

if TYPE_CHECKING:
    import pyarrow.fs as pafs

PROBE_RETRY_LIMIT_S = 1.0
"""How long the up-front check of a gs:// location retries before it reports the failure. A healthy
bucket answers the first try; without credentials Google's client takes about 1.8 s to give up at
1 s (11 s at 5 s, under load), and the probe is the only place that waits for it: the sweep's own
filesystem keeps the default retries."""
MAX_REASON_CHARS = 600

_HINTS = {
    "s3": "check the bucket name and the credentials (AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, "
    "AWS_PROFILE, ~/.aws/credentials or an instance role); add ?region=REGION to skip the region "
    "lookup; for an S3-compatible store give its endpoint, in the URI "
    "(?endpoint_override=HOST:PORT&scheme=http) or as AWS_ENDPOINT_URL=http://HOST:PORT",
    "gs": "check the bucket name and the credentials (GOOGLE_APPLICATION_CREDENTIALS, or "
    "`gcloud auth application-default login`)",
    "abfs": "write abfs://CONTAINER@ACCOUNT.dfs.core.windows.net/PATH and check the credentials "
    "(AZURE_STORAGE_ACCOUNT_KEY, AZURE_CLIENT_ID with AZURE_TENANT_ID and AZURE_CLIENT_SECRET, or `az login`)",
}
_HINTS["gcs"] = _HINTS["gs"]
_HINTS["abfss"] = _HINTS["abfs"]
_MANGLED = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:/[^/]")


REFUSED_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS})
"""A write refused because the filesystem is full, over quota or read-only."""


def is_refused_write(exc: BaseException) -> bool:
    """`exc` is a write the output's filesystem refused for lack of space or a read-only mount
    (Python's and `pyarrow.fs`'s OSErrors both carry the errno)."""
    return isinstance(exc, OSError) and exc.errno in REFUSED_ERRNOS


class WriteRefused(StorageError):
    """A write to the output refused because its filesystem is full (ENOSPC, EDQUOT) or read-only
    (EROFS). A sweep stops on it as on Ctrl-C (`orchestrator.fleet.driver`), then raises it
    again with `stopped`: one line that says what was saved and how to resume."""

    def __init__(
        self, where: Location, cause: OSError, needed: int | None = None, message: str | None = None
    ):
        self.where = where
        self.cause = cause
        self.needed = needed
        """Bytes the refused write needed (the encoded part file), when known."""
        super().__init__(message or f"{self.reason} writing {where}")

    @classmethod
    def of(cls, exc: OSError, out: Location) -> WriteRefused:
        """For an OSError of a write under `out`: names the file when the error does."""
        where = Location(out.fs, os.fspath(exc.filename)) if exc.filename and out.is_local else out
        return cls(where, exc)

    @property
    def reason(self) -> str:
        return os.strerror(self.cause.errno or errno.EIO).lower()

    def stopped(self, saved: str, resume: str) -> WriteRefused:
        """This error as the one line a stopped sweep prints: `saved` says what was written and
        what was not; the space needed and free, where known; the command that resumes."""
        if self.cause.errno == errno.EROFS:
            space, fix = "", "Make it writable"
        else:
            free = free_bytes(self.where)
            known = []
            if self.needed:
                known.append(f"the part being written needed about {format_size(self.needed)}")
            if free is not None:
                known.append(f"{format_size(free)} free")
            space, fix = (f"; {', '.join(known)}" if known else ""), "Free space"
        message = f"{self.reason} writing {self.where}: {saved}{space}. {fix} and resume with: {resume}"
        return WriteRefused(self.where, self.cause, self.needed, message)


@contextlib.contextmanager
def refusal_stops(out: Location, saved: str, resume: str) -> Iterator[None]:
    """A write under `out` that the filesystem refuses (full, read-only) raises
    `WriteRefused.stopped(saved, resume)`, one line; any other error passes as it is."""
    try:
        yield
    except OSError as exc:
        if not is_refused_write(exc):
            raise
        raise WriteRefused.of(exc, out).stopped(saved, resume) from None


def free_bytes(loc: Location) -> int | None:
    """Free space of the filesystem holding `loc` (a local path; None elsewhere or if unknown)."""
    if not loc.is_local:
        return None
    with contextlib.suppress(OSError):
        existing = next(p for p in [loc.local_path, *loc.local_path.parents] if p.exists())
        return shutil.disk_usage(existing).free
    return None


@contextlib.contextmanager
def removed_on_failure(tmp: Path) -> Iterator[Path]:
    """Remove the temporary file `tmp` when the block writing it fails (a full disk, Ctrl-C)."""
    try:
        yield tmp
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
        raise


@dataclass(frozen=True)
class Location:
    """A file or directory on a `pyarrow.fs` filesystem."""

    fs: pafs.FileSystem
    path: str
    """The path inside `fs`: a local path as given, or `bucket/prefix` (no scheme, no query)."""
    uri: str | None = None
    """The URI this came from (joined down to `path`, query kept); None for a local path."""

    @property
    def is_local(self) -> bool:
        import pyarrow.fs as pafs

        return isinstance(self.fs, pafs.LocalFileSystem)

    @property
    def local_path(self) -> Path:
        if not self.is_local:
            raise ValueError(f"{self} is not on the local filesystem")
        return Path(self.path)

    @property
    def target(self) -> Path | str:
        """What to hand back to a user: a `Path` for a local path, else the URI."""
        return Path(self.path) if self.uri is None else self.uri

    def __str__(self) -> str:
        return self.path if self.uri is None else redact(self.uri)

    def join(self, *parts: str) -> Location:
        if self.uri is None:
            return Location(self.fs, str(Path(self.path, *parts)))
        split = urlsplit(self.uri)
        uri = urlunsplit(split._replace(path=posixpath.join(split.path or "/", *parts)))
        return Location(self.fs, posixpath.join(self.path, *parts), uri)

    def parents(self) -> list[Location]:
        """Enclosing directories, nearest first (as `pathlib.PurePath.parents`)."""
        if self.uri is None:
            return [Location(self.fs, str(p)) for p in Path(self.path).parents]
        found, loc = [], self
        while "/" in loc.path.strip("/"):
            split = urlsplit(loc.uri or "")
            parent = Location(
                self.fs,
                posixpath.dirname(loc.path.rstrip("/")),
                urlunsplit(split._replace(path=posixpath.dirname(split.path.rstrip("/")))),
            )
            found.append(parent)
            loc = parent
        return found

    def subdirectories(self) -> list[str]:
        """Names of the directories directly inside this one, sorted ([] if it does not exist)."""
        import pyarrow.fs as pafs

        if not self.is_dir():
            return []
        infos = self.fs.get_file_info(pafs.FileSelector(self.path, recursive=False))
        return sorted(i.base_name for i in infos if i.type == pafs.FileType.Directory)

    def exists(self) -> bool:
        import pyarrow.fs as pafs

        return self.fs.get_file_info(self.path).type != pafs.FileType.NotFound

    def is_dir(self) -> bool:
        import pyarrow.fs as pafs

        return self.fs.get_file_info(self.path).type == pafs.FileType.Directory

    def is_file(self) -> bool:
        import pyarrow.fs as pafs

        return self.fs.get_file_info(self.path).type == pafs.FileType.File

    def read_bytes(self) -> bytes:
        if self.is_local:
            return self.local_path.read_bytes()
        with self.fs.open_input_stream(self.path) as f:
            return f.read()

    def read_text(self) -> str:
        return self.read_bytes().decode()

    def write_bytes(self, data: bytes) -> None:
        """Write the whole file so that readers see the old one or the new one, never a part,
        and the new one survives a power cut once this returns: `compiler.durable.write_bytes`
        (locally a dot-file beside it, fsynced, renamed into place, the directory fsynced;
        elsewhere one PUT, which an object store applies whole)."""
        from compiler import durable

        durable.write_bytes(self.path, data, filesystem=self.fs)

    def write_text(self, text: str) -> None:
        self.write_bytes(text.encode())


Target = Union[str, "os.PathLike[str]", Location]
"""An output location as callers give it: a path, a URI string, or a resolved `Location`."""


def resolve(target: Target) -> Location:
    """The `Location` of a local path or URI. Nothing is read or written; for s3:// without
    ?region= or an endpoint, `pyarrow` asks AWS for the bucket's region.

    Raises `StorageError` for a URI that cannot be used, naming it and the fix."""
    if isinstance(target, Location):
        return target
    import pyarrow.fs as pafs
    from pyarrow.lib import ArrowException

    if isinstance(target, str):
        check_form(target)  # the forms a user may write: one line for any other
    if not is_uri(target):
        text = os.fspath(target)
        if isinstance(target, os.PathLike) and _MANGLED.match(text):
            raise StorageError(
                f"{text}: looks like a URI that went through pathlib.Path, which turns '//' into '/'; "
                "pass the URI as a string"
            )
        if _SCHEME_LIKE.match(str(Path(text))):  # ./name:x, which pyarrow would take for a URI
            text = os.path.abspath(text)
        return Location(pafs.LocalFileSystem(), text)
    uri = str(target)
    try:
        with _quiet_azure(uri):
            fs, path = pafs.FileSystem.from_uri(uri)
    except (OSError, ValueError, ArrowException) as exc:
        raise StorageError(_cannot_use(uri, "cannot open it", exc)) from None
    return Location(fs, path.rstrip("/") or path, uri)


def check_access(loc: Location) -> None:
    """Fail now, with the fix, if the bucket of `loc` is missing or cannot be reached (for a
    local path: if it cannot even be looked up, as a path too long or through a file)."""
    from pyarrow.lib import ArrowException

    if loc.is_local:
        try:
            loc.fs.get_file_info(loc.path)
        except (OSError, ValueError, ArrowException) as exc:
            reason = getattr(exc, "strerror", None) or " ".join(str(exc).split())[:MAX_REASON_CHARS]
            raise StorageError(f"{loc}: cannot use this path ({reason}); pick another") from None
        if loc.local_path.is_symlink() and not loc.local_path.exists():  # nothing can be made there
            raise StorageError(f"{loc}: a symbolic link to a missing target, or a loop of them; pick another")
        return

    uri = loc.uri or ""
    scheme = urlsplit(uri).scheme.lower()
    bucket = loc.path.split("/", 1)[0]
    try:
        with _quiet_azure(uri):
            _probe(loc, uri, scheme, bucket)
    except (OSError, ValueError, ArrowException) as exc:
        if isinstance(exc, StorageError):
            raise
        raise StorageError(_cannot_use(uri, "cannot reach it", exc)) from None


def _probe(loc: Location, uri: str, scheme: str, bucket: str) -> None:
    """Look `loc` (and its bucket) up; a bucket that does not exist is a `StorageError`."""
    import pyarrow.fs as pafs

    fs = _probing_fs(uri) or loc.fs
    if scheme in BUCKET_SCHEMES and fs.get_file_info(bucket).type == pafs.FileType.NotFound:
        raise StorageError(
            f"{loc}: bucket {bucket!r} does not exist, or these credentials cannot see it; create "
            f"it first (e.g. `aws s3 mb s3://{bucket}` or `gcloud storage buckets create gs://{bucket}`)"
            " or fix the name"
        )
    fs.get_file_info(loc.path)


@contextlib.contextmanager
def _quiet_azure(uri: str) -> Iterator[None]:
    """For abfs://: the Azure SDK's credential chain runs `az` in a shell, which writes to this
    process's stderr (`az: not found`): point fd 2 at /dev/null for the block."""
    if not uri.lower().startswith(("abfs://", "abfss://")):
        yield
        return
    saved = os.dup(2)
    try:
        with open(os.devnull, "wb") as null:
            os.dup2(null.fileno(), 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def check_writable(loc: Location) -> None:
    """Fail now, with the fix, if nothing can be written under `loc` (a read-only directory or
    bucket, credentials that may read but not write): a probe file is written and removed."""
    import uuid

    from pyarrow.lib import ArrowException

    name = f".write-probe-{uuid.uuid4().hex[:12]}"
    try:
        if loc.is_local:  # probe the nearest existing directory: create nothing
            existing = next(
                p for p in [loc.local_path, *loc.local_path.parents] if p.exists() or p.is_symlink()
            )
            if not existing.exists():  # creating a folder under it fails: ELOOP, or ENOENT
                raise StorageError(
                    f"{loc}: {existing} is a symbolic link to a missing target, or a loop of them; pick another path"
                )
            if not existing.is_dir():
                what = "a regular file" if existing.is_file() else "a device, FIFO or socket"
                raise StorageError(
                    f"{loc}: {'it' if existing == loc.local_path else existing} is {what}, not a "
                    "directory; an output is a directory (created if missing): pick another path"
                )
            (existing / name).write_bytes(b"")
            (existing / name).unlink()
        else:
            probe = loc.join(name)
            probe.write_bytes(b"")
            probe.fs.delete_file(probe.path)
    except StorageError:
        raise
    except (OSError, ValueError, ArrowException) as exc:
        scheme = (loc.uri or "").split("://", 1)[0].lower()
        hint = _HINTS.get(scheme, "pick a directory you can write to, or fix its permissions")
        reason = " ".join(str(exc).split())[:MAX_REASON_CHARS]
        raise StorageError(f"{loc}: cannot write there ({reason}); {hint}") from None


def checked(target: Target) -> Location:
    """`resolve(target)`, then `check_access`: a location that can be read and written now."""
    loc = resolve(target)
    check_access(loc)
    return loc


def _probing_fs(uri: str) -> pafs.FileSystem | None:
    """For gs://: the filesystem with a short retry limit, so that missing credentials fail the
    check in seconds (Google's client otherwise retries for minutes); None: use the location's."""
    split = urlsplit(uri)
    if split.scheme.lower() not in ("gs", "gcs") or "retry_limit_seconds=" in split.query:
        return None
    import pyarrow.fs as pafs

    query = "&".join(q for q in (split.query, f"retry_limit_seconds={PROBE_RETRY_LIMIT_S:g}") if q)
    return pafs.FileSystem.from_uri(urlunsplit(split._replace(query=query)))[0]


def _cannot_use(uri: str, what: str, exc: BaseException) -> str:
    scheme = uri.split("://", 1)[0].lower()
    reason = " ".join(str(exc).split())
    if len(reason) > MAX_REASON_CHARS:
        reason = reason[:MAX_REASON_CHARS] + " ..."
    hint = _HINTS.get(scheme, "check the URI and the credentials of that filesystem")
    return f"{redact(uri)}: {what} ({reason}); {hint}"


def check_own_output(loc: Location, kind: str = "sweep") -> None:
    """Refuse, before anything is written, an output directory that exists, holds something, and
    is no orchestrate output (`/`, a home directory, a source tree): a sweep would scatter
    `results/`, `run.json` and a lock among someone else's files. Nor is a tune's output a
    sweep's, or (`kind="tune"`) a sweep's a tune's: their files would mix in one folder."""
    import pyarrow.fs as pafs
    from pyarrow.lib import ArrowException

    try:
        if not loc.is_dir():
            return
        names = {i.base_name for i in loc.fs.get_file_info(pafs.FileSelector(loc.path, recursive=False))}
        tables = any(_partitioned(loc.join(n)) for n in names & set(TABLE_DIRS))
    except (OSError, ValueError, ArrowException) as exc:
        raise StorageError(f"{loc}: cannot list it ({' '.join(str(exc).split())[:200]})") from None
    other = (
        names & set(TUNE_MARKS)
        if kind == "sweep"
        else ({RUN_FILE} & names) | ({RESULTS_DIR} if tables else set())
    )
    if other:
        what = "tune's" if kind == "sweep" else "sweep's"
        raise StorageError(
            f"{loc}: holds a {what} output ({', '.join(sorted(other))}), which a {kind} must not write into: "
            f"give the {kind} an --out of its own (nothing was written)"
        )
    if not names or names & set(OUTPUT_MARKS) or tables:
        return
    some = ", ".join(sorted(names)[:3]) + (", ..." if len(names) > 3 else "")
    raise StorageError(
        f"{loc}: a directory that holds other files ({some}) and is no orchestrate output; write "
        "results to a new or empty directory (nothing was written)"
    )


def _partitioned(table: Location) -> bool:
    """`table` is a folder of this tool's Parquet table: it holds a `hardware=` partition."""
    return any(name.startswith("hardware=") for name in table.subdirectories())
