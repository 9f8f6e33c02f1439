"""Progress of a sweep on stderr: counts per status, running jobs, elapsed time and an ETA.

On a terminal, with `rich` installed, a live view (`orchestrator.fleet.live_view`): the running
jobs, each with its time since it was sent, above a status line whose times and ETA move (redrawn
4 times a second), and every finished job printed above them as it ends. On a terminal without
rich (or where the view fails), one status line is redrawn in place; otherwise (CI, a log file)
one line is printed per finished job, so a log shows every job's outcome as it happens.
"""

from __future__ import annotations

import sys
import threading
import time
from collections import Counter
from typing import TYPE_CHECKING, Any, TextIO

if TYPE_CHECKING:
    from rich.console import Console

    from orchestrator.fleet.live_view import LiveView


def format_duration(seconds: float | None) -> str:
    if seconds is None:
        return "--"
    seconds = int(round(seconds))
    h, rem = divmod(seconds, 3600)
    m, s = divmod(rem, 60)
    return f"{h}h{m:02d}m{s:02d}s" if h else f"{m}m{s:02d}s" if m else f"{s}s"


class Progress:
    """`live`: None (the default) draws the live view where `stream` is a terminal, and prints a
    line per finished job elsewhere; True redraws one status line in place on any stream; False
    prints lines. `console`: a rich console to draw the live view on instead (tests)."""

    def __init__(
        self,
        total: int,
        already_done: int = 0,
        stream: TextIO | None = None,
        live: bool | None = None,
        console: Console | None = None,
    ):
        self.total = total
        self.already_done = already_done
        self.stream = stream or sys.stderr
        self.live = _isatty(self.stream) if live is None else live
        self.counts: Counter[str] = Counter()
        self.started = time.monotonic()
        self._last_draw = 0.0
        self._lock = threading.Lock()
        """Guards `counts` and `_jobs`, which the live view's thread reads; never held while the
        view is called (the view's own lock is taken the other way round)."""
        self._jobs: dict[Any, tuple[str, float]] = {}
        """Running jobs: their key (the name, or a token for a job started without one) -> (name,
        when it started)."""
        self._phases: dict[str, str] = {}
        """What a running job does, by name, as its task last said (`set_phase`)."""
        self._view: LiveView | None = None
        if console is not None or (live is None and self.live):
            self._view = _live_view(self, console)
            self.live = self.live or self._view is not None

    @property
    def done(self) -> int:
        return sum(self.counts.values())

    @property
    def running(self) -> int:
        return len(self._jobs)

    def eta_s(self) -> float | None:
        """Remaining time, extrapolated from this run's completion rate."""
        return self._eta(self.done, time.monotonic())

    def _eta(self, done: int, now: float) -> float | None:
        if not done:
            return None
        return (now - self.started) / done * (self.total - self.already_done - done)

    def status_line(self) -> str:
        finished = self.already_done + self.done
        width = len(str(self.total))
        counts = " ".join(f"{s}={n}" for s, n in sorted(self.counts.items())) or "no results yet"
        elapsed = time.monotonic() - self.started
        return (
            f"[{finished:>{width}}/{self.total}] {counts} | running {self.running} | "
            f"elapsed {format_duration(elapsed)} | ETA {format_duration(self.eta_s())}"
        )

    def running_jobs(self) -> list[tuple[str, float]]:
        """The running jobs as (name, seconds since each started), the oldest first."""
        now = time.monotonic()
        with self._lock:
            jobs = sorted(self._jobs.values(), key=lambda job: job[1])
        return [(name, now - t0) for name, t0 in jobs]

    def phase(self, name: str) -> str:
        """What the running job `name` does, as its task last said ("running" until it says)."""
        with self._lock:
            return self._phases.get(name, "running")

    def set_phase(self, name: str, phase: str) -> None:
        """The running job `name` now does `phase` (its process's phase: imports, compile, timing,
        ...; or what it waits for); ignored once it has finished."""
        with self._lock:
            if name in self._jobs:
                self._phases[name] = phase

    @property
    def shows_phases(self) -> bool:
        """Whether the jobs' phases are shown (the live view is): else nobody need read them."""
        return self._view is not None

    def live_status(self) -> str:
        """The live view's status line: the counts, the jobs running and waiting, the elapsed time
        and an ETA, which before the first result says how long the first job has been running."""
        with self._lock:
            counts = sorted(self.counts.items())
            done, running = sum(n for _, n in counts), len(self._jobs)
            oldest = min((t0 for _, t0 in self._jobs.values()), default=None)
        now = time.monotonic()
        finished = self.already_done + done
        queued = max(0, self.total - finished - running)
        eta = f"ETA {format_duration(self._eta(done, now))}"
        if not done and oldest is not None:
            eta += f" (first job running {format_duration(now - oldest)})"
        text = " ".join(f"{s}={n}" for s, n in counts) or "no results yet"
        return (
            f"[{finished:>{len(str(self.total))}}/{self.total}] {text} | running {running} | "
            f"queued {queued} | elapsed {format_duration(now - self.started)} | {eta}"
        )

    def started_job(self, job: Any = None) -> None:
        """A job was sent: `job` (a `Job`, or its name) is shown running from now. A job started
        again (a retry after its node failed) starts its time again."""
        name = getattr(job, "name", job)
        with self._lock:
            key = name if name is not None else object()
            self._jobs[key] = (name or "(a job)", time.monotonic())
            self._phases.pop(name, None)
        self._draw()

    def finished_job(self, name: str, status: str, seconds: float | None) -> None:
        with self._lock:
            self._phases.pop(name, None)
            if self._jobs.pop(name, None) is None:  # never shown by name: one started without it
                unnamed = next((k for k in self._jobs if not isinstance(k, str)), None)
                if unnamed is not None:
                    del self._jobs[unnamed]
            self.counts[status] += 1
        took = f" in {seconds:.1f}s" if seconds is not None else ""
        if self._view is not None and self._view_ok(self._view.print_finished(status, name, took)):
            return
        if self.live:
            self._draw(force=True)
        else:
            print(f"{status:>13} {name}{took}  {self.status_line()}", file=self.stream, flush=True)

    def message(self, text: str) -> None:
        """A line of its own above the live status line (a warning the user must see)."""
        if self._view is not None and self._view_ok(self._view.print_message(text)):
            return
        prefix = "\r\033[K" if self.live else ""
        print(prefix + text, file=self.stream, flush=True)
        self._draw(force=True)

    def tick(self) -> None:
        """Between results: the one-line view's times move (the live view redraws itself)."""
        if self._view is None:
            self._draw()

    def _view_ok(self, printed: bool) -> bool:
        """Whether the live view printed; where it failed it is given up, and the progress goes on
        as lines of the log view (the terminal's state is not known any more)."""
        if printed:
            return True
        self._view, self.live = None, False
        return False

    def _draw(self, force: bool = False) -> None:
        now = time.monotonic()
        if self._view is None and self.live and (force or now - self._last_draw >= 0.5):
            self._last_draw = now
            print("\r\033[K" + self.status_line(), end="", file=self.stream, flush=True)

    def close(self) -> None:
        view, self._view = self._view, None
        if view is not None:
            view.close()
            return
        if self.live:
            print(file=self.stream, flush=True)
            self.live = False


def _isatty(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # a closed stream, a file-like object without isatty
        return False


def _live_view(progress: Progress, console: Console | None) -> LiveView | None:
    """The live view of `progress` on `console` (else on its stream, where that is a terminal);
    None where rich is not installed or the view cannot start (the one-line view is drawn)."""
    try:
        from orchestrator.fleet.live_view import LiveView, terminal_console
    except ImportError:  # rich comes with the fleet's environment, but the core does not need it
        return None
    try:
        console = console or terminal_console(progress.stream)
        if console is None:
            return None

        def running() -> list[tuple[str, str, str]]:
            return [(name, format_duration(s), progress.phase(name)) for name, s in progress.running_jobs()]

        return LiveView(console, running, progress.live_status)
    except Exception:  # the view must never stop a sweep
        return None
