"""A job's scratch directory on its node: made for the job (`make`), and looked at again once a
process of the job has ended (`vanished`, and for a failed process `failed`).

The scratch holds the job's file, its processes' results and logs, and their private compile
caches (`workers.runner.job_environment`). A scratch that fills up, turns read-only or vanishes
under a running job fails the job for a reason of the node, not of the model: such a failure is
`harness_error`, which `--resume` runs again. They decide from what can be checked once the
process has ended, never from the model's own word alone:

- `vanished`: the scratch directory, the job's file or the process's log is gone (whatever the
  process reported: a later process would compile against a cache that is gone);
- `failed`, for a process that failed: the scratch's filesystem is read-only, or full (`statvfs`: under `FULL_BELOW` free, or no inode
  left);
- the process's error or the tail of its log holds an errno message of space or of a read-only
  filesystem (`No space left on device`, `Disk quota exceeded`, `Read-only file system`) that
  names a path under the scratch, or that stands in a text naming the scratch (a compiler whose
  command wrote there: `ld: final link failed: No space left on device`); or
  `No such file or directory` naming a path under the scratch.

A model whose own code fails on a path elsewhere (`FileNotFoundError: /data/weights.bin`) keeps
its own status.
"""

from __future__ import annotations

import errno
import json
import os
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from compiler.job import Job
from workers.text import format_size

FULL_BELOW = 1 << 20
"""Free bytes under which a scratch's filesystem counts as full once a process has failed."""

SPACE_ERRORS = (errno.ENOSPC, errno.EDQUOT, errno.EROFS)
"""Errno codes whose message fails a job for its scratch's filesystem where the message names the
scratch or stands in a text that does; `ENOENT`'s only where it names a path under the scratch."""


@dataclass(frozen=True)
class Scratch:
    """A job's scratch directory and the files the runner put there."""

    path: Path
    job_file: Path
    log_file: Path
    """The first process's log (a later process of the job has a log of its own beside it)."""


def make(job: Job, scratch_root: str | None, prefix: str) -> Scratch:
    """A fresh scratch directory for `job`'s processes, under `scratch_root` (created if this node
    lacks it) or the temporary directory, holding `job.json`. OSError where it cannot be made."""
    if scratch_root:  # a path on this node, which may not have it yet
        Path(scratch_root).mkdir(parents=True, exist_ok=True)
    path = Path(tempfile.mkdtemp(prefix=f"{prefix}-{job.job_id[:12]}-", dir=scratch_root))
    job_file = path / "job.json"
    job_file.write_text(json.dumps(job.to_dict()))
    return Scratch(path, job_file, path / "log.txt")


def unmade(scratch_root: str | None, exc: OSError) -> dict[str, Any]:
    """The result of a job whose scratch directory could not be made: the harness's failure."""
    where = scratch_root or tempfile.gettempdir()
    return {
        "status": "harness_error",
        "error": f"the job's scratch directory could not be made under {where} on this node: "
        f"{type(exc).__name__}: {exc} (--scratch must name a writable directory)",
    }


def vanished(scratch: Path, files: list[Path]) -> str | None:
    """Why a job process lost its scratch `scratch` while it ran, in words ("the job's scratch
    /x/job-abc vanished"); None where it did not. `files`: what the runner put there for the
    process (the job's file, its log), which nothing of the job removes. A process writing its
    result makes the directory again: the files it did not write tell the loss."""
    if not scratch.is_dir():
        return f"the job's scratch {scratch} vanished"
    for path in files:
        if not path.exists():
            return f"the job's {_what(path)} {path} vanished from its scratch {scratch}"
    return None


def failed(scratch: Path, texts: list[str]) -> str | None:
    """Why a job process that failed did so for its scratch `scratch`, in words ("the job's
    scratch /x/job-abc filled up (8 KiB free of 64 MiB)"): its filesystem full or read-only now,
    or an errno message of the scratch's in `texts` (what the process said: its error, the tail of
    its log); None where nothing says so."""
    return _filesystem(scratch) or _said(scratch, texts)


def _what(path: Path) -> str:
    return "file" if path.suffix == ".json" else "log"


def _filesystem(scratch: Path) -> str | None:
    """The scratch's filesystem read-only, or full, by `statvfs`."""
    try:
        st = os.statvfs(scratch)
    except OSError:
        return None
    if st.f_flag & os.ST_RDONLY:
        return f"the job's scratch {scratch} turned read-only"
    free, size = st.f_bavail * st.f_frsize, st.f_blocks * st.f_frsize
    if free < FULL_BELOW:
        return f"the job's scratch {scratch} filled up ({format_size(free)} free of {format_size(size)})"
    if st.f_files and not st.f_favail:
        return f"the job's scratch {scratch} ran out of inodes (0 of {st.f_files} free)"
    return None


def _under(scratch: Path) -> re.Pattern[str]:
    """A path under `scratch` (or the scratch itself), as it or its resolved form is written."""
    roots = {str(scratch), os.path.realpath(scratch)}
    alternatives = "|".join(re.escape(r) for r in sorted(roots, key=len, reverse=True))
    return re.compile(rf"(?:{alternatives})(?=$|[/\s'\":,;)\]])")


def _said(scratch: Path, texts: list[str]) -> str | None:
    """An errno message of the scratch's in what the process said (see the module's docstring)."""
    under = _under(scratch)
    for text in texts:
        names_scratch = bool(under.search(text))
        for line in text.splitlines():
            for code, what in _SAID.items():
                if os.strerror(code) in line and (
                    under.search(line) or (code in SPACE_ERRORS and names_scratch)
                ):
                    return f"the job's scratch {scratch} {what} ({line.strip()[:300]})"
    return None


_SAID = {
    errno.ENOSPC: "ran out of space",
    errno.EDQUOT: "ran out of its disk quota",
    errno.EROFS: "turned read-only",
    errno.ENOENT: "lost a file",
}
"""What each errno message in a process's words says happened to its scratch."""
