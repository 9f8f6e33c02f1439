"""Progress of a sweep on stderr: counts per status, running jobs, elapsed time and an ETA.

On a terminal one line is redrawn in place (at most every 0.5 s); otherwise (CI, a log file)
one line is printed per finished job, so a log shows every job's outcome as it happens.
"""

from __future__ import annotations

import sys
import time
from collections import Counter
from typing import TextIO


def format_duration(seconds: float | None) -> str:
    if seconds is None:
        return "--"
    seconds = int(round(seconds))
    h, rem = divmod(seconds, 3600)
    m, s = divmod(rem, 60)
    return f"{h}h{m:02d}m{s:02d}s" if h else f"{m}m{s:02d}s" if m else f"{s}s"


class Progress:
    def __init__(
        self, total: int, already_done: int = 0, stream: TextIO | None = None, live: bool | None = None
    ):
        self.total = total
        self.already_done = already_done
        self.stream = stream or sys.stderr
        self.live = self.stream.isatty() if live is None else live
        self.counts: Counter[str] = Counter()
        self.running = 0
        self.started = time.monotonic()
        self._last_draw = 0.0

    @property
    def done(self) -> int:
        return sum(self.counts.values())

    def eta_s(self) -> float | None:
        """Remaining time, extrapolated from this run's completion rate."""
        if not self.done:
            return None
        remaining = self.total - self.already_done - self.done
        return (time.monotonic() - self.started) / self.done * remaining

    def status_line(self) -> str:
        finished = self.already_done + self.done
        width = len(str(self.total))
        counts = " ".join(f"{s}={n}" for s, n in sorted(self.counts.items())) or "no results yet"
        elapsed = time.monotonic() - self.started
        return (
            f"[{finished:>{width}}/{self.total}] {counts} | running {self.running} | "
            f"elapsed {format_duration(elapsed)} | ETA {format_duration(self.eta_s())}"
        )

    def started_job(self) -> None:
        self.running += 1
        self._draw()

    def finished_job(self, name: str, status: str, seconds: float | None) -> None:
        self.running = max(0, self.running - 1)
        self.counts[status] += 1
        if self.live:
            self._draw(force=True)
        else:
            took = f" in {seconds:.1f}s" if seconds is not None else ""
            print(f"{status:>13} {name}{took}  {self.status_line()}", file=self.stream, flush=True)

    def message(self, text: str) -> None:
        """A line of its own above the live status line (a warning the user must see)."""
        prefix = "\r\033[K" if self.live else ""
        print(prefix + text, file=self.stream, flush=True)
        self._draw(force=True)

    def _draw(self, force: bool = False) -> None:
        now = time.monotonic()
        if self.live and (force or now - self._last_draw >= 0.5):
            self._last_draw = now
            print("\r\033[K" + self.status_line(), end="", file=self.stream, flush=True)

    def close(self) -> None:
        if self.live:
            print(file=self.stream, flush=True)
