"""How a run stops before its work is done: Ctrl-C, SIGTERM (a scheduler stopping it) and
`--deadline` all raise `KeyboardInterrupt` in the driver, whose one path cancels the running jobs,
keeps every finished row and prints the command that resumes."""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from contextlib import contextmanager


class DeadlineReached(KeyboardInterrupt):
    """The run's --deadline passed: it stops as on Ctrl-C (running jobs cancelled, every finished
    row kept, the resume command printed)."""


def check_deadline(deadline: float | None) -> None:
    """Raise `DeadlineReached` once `deadline` (a `time.monotonic()` value) has passed."""
    if deadline is not None and time.monotonic() >= deadline:
        raise DeadlineReached


@contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """Treat SIGTERM (a scheduler stopping us) like Ctrl-C: cancel, flush, say how to resume."""

    def handler(signum, frame):
        raise KeyboardInterrupt

    try:
        previous = signal.signal(signal.SIGTERM, handler)
    except ValueError:  # not the main thread
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
