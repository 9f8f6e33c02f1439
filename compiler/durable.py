"""One durable, atomic way to write a file: readers see the old file or the whole new one, and once
the call returns the new one survives a crash or a power cut.

On a local filesystem: the bytes go to a temporary file beside the target (`.<name>.<pid>-<hex>.tmp`,
so that two writers never share one, and a stray one left by a killed process is a dot-file),
which is fsynced, renamed onto the target, and then the directory is fsynced, so that the rename
itself is on disk. A rename without the fsyncs can leave, after a power cut, an empty file behind
a valid name. On a `pyarrow.fs` filesystem that is not local (S3, GCS, ...): one
`open_output_stream`, which an object store applies whole when it is closed (one PUT, or one
completed multipart upload); a store gives no more than that.

Every writer of results, presets, manifests, packages and bundles goes through here. This module
imports neither Ray nor the orchestrator (a serving process uses it through `compiler.serving`).
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any

_DIR_FSYNC_UNSUPPORTED = {errno.EINVAL, errno.ENOTSUP, errno.EBADF, errno.EACCES}
"""What fsync of a directory may answer on a filesystem that cannot sync one (some network and
FUSE filesystems): the rename is then as durable as that filesystem makes it."""


def write_bytes(path: str | os.PathLike[str], data: bytes, *, filesystem: Any = None) -> None:
    """Write `data` as the whole of `path` (parent directories created), durably and atomically.

    `filesystem`: a `pyarrow.fs.FileSystem` that `path` is in; a local one (or None) takes the
    local route, any other one write."""
    if filesystem is not None and not _is_local(filesystem):
        with filesystem.open_output_stream(str(path)) as f:
            f.write(data)
        return
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(path) as tmp:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)  # umask applies, as for open()
        with open(fd, "wb") as f:
            f.write(data)  # (fsynced by `commit`)


def write_text(path: str | os.PathLike[str], text: str, *, filesystem: Any = None) -> None:
    write_bytes(path, text.encode(), filesystem=filesystem)


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike[str], suffix: str = "") -> Iterator[Path]:
    """A temporary path beside `path`, for a writer that wants a file name (torch's package
    writer wants one ending in `.pt2`: `suffix`). When the block ends normally the file there is
    committed onto `path` (`commit`); when it raises, the file is removed."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}-{secrets.token_hex(4)}.tmp{suffix}")
    try:
        yield tmp
        commit(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
        raise


def commit(tmp: str | os.PathLike[str], path: str | os.PathLike[str]) -> None:
    """Make the finished file `tmp` durable and rename it onto `path` (same directory), then make
    the rename durable."""
    fd = os.open(tmp, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    fsync_dir(Path(path).parent)


def fsync_dir(directory: str | os.PathLike[str]) -> None:
    """fsync a directory, so that the entries created or renamed in it are on disk."""
    try:
        fd = os.open(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError as exc:
        if exc.errno in _DIR_FSYNC_UNSUPPORTED:
            return
        raise
    try:
        os.fsync(fd)
    except OSError as exc:
        if exc.errno not in _DIR_FSYNC_UNSUPPORTED:
            raise
    finally:
        os.close(fd)


def _is_local(filesystem: Any) -> bool:
    import pyarrow.fs as pafs

    return isinstance(filesystem, pafs.LocalFileSystem)
