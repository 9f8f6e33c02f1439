"""One writer per output directory: `<out>/.orchestrate.lock`.

Two drivers writing the same output would both skip the same finished jobs and both run the rest
(two rows per job), and each deletes the other's half-written part files on start. So a sweep
takes the lock before it reads anything, and a second one is refused with a message that names
the first (pid, host, start time, command).

A killed driver cannot release its lock, so a lock is taken over when its holder is gone: on the
same host at once (the holder's pid is not running, or is a different process that reused the
pid); from another host when its heartbeat, rewritten every `HEARTBEAT_S` while the holder runs,
is older than `STALE_S`.

Locally the lock file is created with O_EXCL, which one process wins. On an object store there
is no exclusive create in `pyarrow.fs`: the lock is written, read back after a moment, and kept
only if it still holds our token. Two drivers starting within that moment on the same URI could
both proceed; runs started seconds apart are refused as locally.

Every command that writes into a location holds its lock (`holding`): `sweep` and `nightly` on
OUT, `tune` on OUT for its whole run, `presets` on OUT while it writes, `export` on DEST. A lock
also covers what lies inside its directory: taking `X/rung0` is refused while another live
driver holds `X`, but allowed to the process that holds `X` itself (a tune's per-rung sweeps
nest under the tune's own lock). The same location twice is refused even within one process.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, TextIO

from store.layout import LOCK_FILE
from store.storage import Location, StorageError, Target, redact, removed_on_failure, resolve

HEARTBEAT_S = 30.0
STALE_S = 120.0
"""A lock from another host whose heartbeat is older than this is left by a dead driver."""
MAX_LOCK_BYTES = 2**20
"""A lock file larger than this is not one of ours (they are a few hundred bytes): not read."""
SETTLE_S = 1.0
"""On an object store: wait this long before reading the lock back to see who won."""
AGAIN = "Wait for it to finish, or pass another --out."
"""What a refused command can do instead (`acquire`'s `again`)."""

_held: dict[str, str] = {}
"""The directories whose lock this process holds (`_key`) -> the lock's token."""
_held_mutex = threading.Lock()


class OutputLocked(StorageError):
    """The output directory is in use by another live driver; the message names it."""


def _create_time(pid: int) -> float | None:
    import psutil

    try:
        return psutil.Process(pid).create_time()
    except (psutil.Error, OSError):
        return None


@dataclass
class OutputLock:
    """Held from `acquire` to `release` (or use it as a context manager)."""

    loc: Location
    token: str
    info: dict[str, Any]
    _beat: float = 0.0

    @classmethod
    def acquire(cls, out: Target, command: list[str] | str | None = None, again: str = AGAIN) -> OutputLock:
        """Take the lock of `out`, or raise `OutputLocked` naming its live holder: of `out`, or of
        a directory around it that this process does not hold itself. `again` ends the message:
        what the refused command can do instead."""
        out = resolve(out)
        loc = out.join(LOCK_FILE)
        _check_enclosing(out, again)
        pid = os.getpid()
        info = {
            "token": uuid.uuid4().hex,
            "pid": pid,
            "pid_started": _create_time(pid),
            "host": socket.gethostname(),
            "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "heartbeat": time.time(),
            "command": redact(" ".join(command) if isinstance(command, list) else (command or "")),
        }
        for _ in range(3):  # a stale lock moved aside, then one more try; a race lost, once more
            holder = _read(loc)
            if holder is not None:
                why = _stale(holder, loc)
                if why is None:
                    raise OutputLocked(_busy_message(out, holder, again))
                _take_over(loc, holder)
            if _create(loc, info):
                lock = cls(loc, info["token"], info, time.monotonic())
                with _held_mutex:
                    _held[_key(out)] = lock.token
                if holder is not None:
                    lock.taken_over = f"took over the lock of {_who(holder)}: {why}"
                return lock
        raise OutputLocked(_busy_message(out, _read(loc) or {}, again))

    taken_over: str | None = None
    """Why an earlier holder's lock was replaced (its driver is gone), for the log."""

    def refresh(self) -> None:
        """Rewrite the heartbeat, at most every `HEARTBEAT_S` (call it often)."""
        if time.monotonic() - self._beat < HEARTBEAT_S:
            return
        self._beat = time.monotonic()
        self.info["heartbeat"] = time.time()
        with contextlib.suppress(OSError):
            holder = _read(self.loc)
            if holder is None or holder.get("token") == self.token:
                self.loc.write_text(json.dumps(self.info))

    def release(self) -> None:
        with _held_mutex:
            for key in [k for k, token in _held.items() if token == self.token]:
                del _held[key]
        with contextlib.suppress(OSError, ValueError):
            holder = _read(self.loc)
            if holder is not None and holder.get("token") == self.token:
                self.loc.fs.delete_file(self.loc.path)

    def __enter__(self) -> OutputLock:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


@contextlib.contextmanager
def holding(
    out: Target, command: list[str] | str | None = None, again: str = AGAIN, stream: TextIO | None = None
) -> Iterator[OutputLock]:
    """Hold the lock of `out` for the block (`OutputLock.acquire`, `command` defaulting to this
    process's argv), its heartbeat rewritten by a thread however long the block runs; a takeover
    of a dead holder's lock is noted on `stream` (stderr)."""
    lock = OutputLock.acquire(out, sys.argv if command is None else command, again)
    if lock.taken_over:
        print(f"note: {resolve(out)}: {lock.taken_over}", file=stream or sys.stderr)
    stop = threading.Event()

    def beat() -> None:
        while not stop.wait(HEARTBEAT_S / 3):  # refresh() writes at most every HEARTBEAT_S
            lock.refresh()

    thread = threading.Thread(target=beat, name="output-lock-heartbeat", daemon=True)
    thread.start()
    try:
        yield lock
    finally:
        stop.set()
        thread.join(timeout=HEARTBEAT_S)  # not left running into interpreter exit (a write mid-way)
        lock.release()


def _key(out: Location) -> str:
    """One name per directory, however it was spelled (a relative or absolute path, a URI)."""
    return os.path.abspath(out.path) if out.is_local else f"{out.fs.type_name}:{out.path.rstrip('/')}"


def _enclosing(out: Location) -> list[Location]:
    """The directories around `out`, nearest first (a local path made absolute first)."""
    if out.is_local:
        return Location(out.fs, os.path.abspath(out.path)).parents()
    return out.parents()


def _check_enclosing(out: Location, again: str) -> None:
    """Refuse `out` while a live driver other than this process holds a directory around it."""
    for parent in _enclosing(out):
        with _held_mutex:
            if _key(parent) in _held:  # our own lock: what lies inside is ours to write
                return
        try:
            holder = _read(parent.join(LOCK_FILE))
        except OSError:  # a parent we may not read (an object-store policy on a prefix): no lock of ours
            continue
        if holder is not None and _stale(holder, parent.join(LOCK_FILE)) is None:
            raise OutputLocked(_busy_message(parent, holder, again, inside=out))


def _read(loc: Location) -> dict[str, Any] | None:
    """The holder's record; None if there is no lock; {} for a lock file that is not ours;
    `StorageError` for a lock that is no regular file (a folder; a FIFO, whose open would wait)."""
    import pyarrow.fs as pafs

    info = loc.fs.get_file_info(loc.path)
    if info.type not in (pafs.FileType.File, pafs.FileType.NotFound):
        what = "a folder" if info.type == pafs.FileType.Directory else "not a regular file"
        raise StorageError(f"{loc}: {what}, not a lock this tool writes; move it out of the output")
    if info.size is not None and info.size > MAX_LOCK_BYTES:
        return {}
    try:
        text = loc.read_bytes().decode("utf-8", "replace")
    except FileNotFoundError:
        return None
    except OSError:
        if not loc.exists():
            return None
        raise
    try:
        data = json.loads(text)
    except (ValueError, RecursionError):
        return {}
    return data if isinstance(data, dict) else {}


def _mtime(loc: Location) -> float | None:
    info = loc.fs.get_file_info(loc.path)
    return info.mtime.timestamp() if info.mtime is not None else None


def _stale(holder: dict[str, Any], loc: Location) -> str | None:
    """Why `holder`'s lock is left over from a dead driver, or None while it may be alive."""
    if holder.get("host") == socket.gethostname() and isinstance(holder.get("pid"), int):
        started = _create_time(holder["pid"])
        if started is None:
            return f"pid {holder['pid']} is not running"
        if holder.get("pid_started") is not None and abs(started - holder["pid_started"]) > 1.0:
            return f"pid {holder['pid']} is now another process"
        return None
    beat = holder.get("heartbeat")
    if not isinstance(beat, (int, float)):
        beat = _mtime(loc)  # a lock file we cannot parse: judge by its age
    if beat is None:
        return None
    age = time.time() - beat
    return f"no heartbeat for {age:.0f} s (over {STALE_S:g} s)" if age > STALE_S else None


def _take_over(loc: Location, holder: dict[str, Any]) -> None:
    """Remove a stale lock; a concurrent taker may have removed it first, which is fine."""
    with contextlib.suppress(FileNotFoundError):
        if loc.is_local:
            aside = loc.local_path.with_name(f"{LOCK_FILE}.stale-{uuid.uuid4().hex[:8]}")
            os.rename(loc.local_path, aside)  # only one taker's rename succeeds
            aside.unlink(missing_ok=True)
        else:
            loc.fs.delete_file(loc.path)


def _create(loc: Location, info: dict[str, Any]) -> bool:
    """Create the lock file holding `info`; False when another driver got there first."""
    data = json.dumps(info).encode()
    if loc.is_local:
        path = loc.local_path
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            return False
        with removed_on_failure(path), os.fdopen(fd, "wb") as f:  # a full disk leaves no empty lock
            f.write(data)
        return True
    if loc.exists():
        return False
    loc.write_bytes(data)
    time.sleep(SETTLE_S)
    return (_read(loc) or {}).get("token") == info["token"]


def _who(holder: dict[str, Any]) -> str:
    if not holder:
        return "an unreadable lock file"
    return (
        f"pid {holder.get('pid', '?')} on {holder.get('host', '?')} (started {holder.get('started_at', '?')})"
    )


def _busy_message(
    out: Location, holder: dict[str, Any], again: str = AGAIN, inside: Location | None = None
) -> str:
    command = holder.get("command")
    return (
        (f"{inside} lies inside {out}, which" if inside is not None else f"{out}")
        + f" is in use by another orchestrate driver: {_who(holder)}"
        + (f", running `{command}`" if command else "")
        + f". {again} If it was killed, its lock ({LOCK_FILE}) is "
        f"taken over automatically: at once on {holder.get('host') or 'its host'}, from other hosts after "
        f"{STALE_S:g} s without its heartbeat."
    )


def held_by_live_driver(out: Target) -> bool:
    """Whether a driver that may still be alive holds the lock of `out` (so a part it has written
    may not be in its commit ledger yet: `store.reader`)."""
    out = resolve(out)
    with _held_mutex:
        if _key(out) in _held:  # this process's own lock (`presets`, a tune reading its rounds):
            return False  # nothing else writes there, so an unlisted part is no one's in flight
    loc = out.join(LOCK_FILE)
    holder = _read(loc)
    return holder is not None and _stale(holder, loc) is None
