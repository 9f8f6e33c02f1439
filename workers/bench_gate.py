"""The gate of a job process started ahead (`workers.ahead`), on the job process's side.

A later process of a job may start while the one before it still times the model: it imports,
builds the model and its inputs on the host, pinned to cores of its own (`AHEAD_AFFINITY_ENV`),
then waits here, before it touches the device or makes its first compute call. The runner opens
the gate when the process before it has ended: it writes the time it did so (its clock, seconds
since the epoch) and a newline into the pipe whose read end is `GATE_FD_ENV`. The process then
moves every one of its threads onto the job's own cores (`workers.affinity.AFFINITY_ENV`) and
goes on as any other process of the job. A gate closed without that line means the runner
dropped the process (the one before it failed, the job was cancelled): it exits at once.
"""

from __future__ import annotations

import os
from contextlib import suppress

GATE_FD_ENV = "CO_GATE_FD"
"""The read end of the pipe a process started ahead waits on (set only for such a process)."""


def gate_fd() -> int | None:
    """The gate's file descriptor, in a process started ahead; None in any other."""
    value = os.environ.get(GATE_FD_ENV, "")
    return int(value) if value.isdigit() else None


def wait_at_gate(fd: int) -> float | None:
    """Block until the runner opens the gate; the time it opened it, or None where it closed
    the gate without opening it (or wrote something that is no time)."""
    data = b""
    try:
        while not data.endswith(b"\n"):
            chunk = os.read(fd, 64)
            if not chunk:
                return None
            data += chunk
    finally:
        with suppress(OSError):
            os.close(fd)
    try:
        return float(data)
    except ValueError:
        return None


def pin_every_thread(cpus: set[int]) -> bool:
    """Move every thread of this process (the main one, torch's intra-op pool, any other) onto
    `cpus`: `os.sched_setaffinity(0, ...)` moves the calling thread only, and the threads started
    while the process was built keep the cores they were started on. Threads created later
    inherit the calling thread's set. False where the calling thread could not be moved."""
    for tid in os.listdir("/proc/self/task"):
        with suppress(OSError, ValueError):  # a thread that ended meanwhile
            os.sched_setaffinity(int(tid), cpus)
    try:
        os.sched_setaffinity(0, cpus)
    except OSError:
        return False
    return True
