"""The live view of a sweep on a terminal, drawn with `rich` (`orchestrator.fleet.progress` uses it
where stderr is a terminal and rich is installed; else it redraws its one status line).

The region at the bottom of the terminal holds the running jobs, oldest first, each with the time
since the driver sent it and what it does (its process's phase, or the GPU it waits for, as its
task says through Ray's key-value store: `workers.task.phase_key`), and the status line under them (counts, elapsed time, the ETA). It is
redrawn `REFRESH_HZ` times a second by a thread of its own, so the times move between results.
Finished jobs and messages are printed above it, where they stay and scroll.

Nothing here may stop a sweep: any error of rich or of the terminal ends the view (`broken`), and
the progress goes on as lines of the log view.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, TextIO

from rich.console import Console, Group
from rich.text import Text

if TYPE_CHECKING:
    from rich.live import Live

REFRESH_HZ = 4.0
MAX_ROWS = 20
"""Running jobs listed at most (fewer on a short terminal); the rest are counted in one line."""
GOOD = {"ok"}
HARNESS = {"harness_error", "hardware_lost", "unsupported"}


def status_style(status: str) -> str:
    """The colour of a finished job's status: green for ok, yellow where the harness or the hardware
    decided it (run again, or not runnable), red where the model's job failed."""
    return "green" if status in GOOD else "yellow" if status in HARNESS else "red"


def terminal_console(stream: TextIO) -> Console | None:
    """A console on `stream` for the live view; None where it cannot draw one (not a terminal, or a
    dumb one: TERM=dumb)."""
    console = Console(file=stream, force_jupyter=False, soft_wrap=False)
    if not console.is_terminal or console.is_dumb_terminal:
        return None
    return console


class LiveView:
    """The running jobs and the status line as a rich `Live` region on `console`.

    `running()` returns the running jobs as (name, time running as text, what it does), oldest first; `status()`
    the status line. Both are called from the refresh thread: they must be safe to call from another
    thread than the one that records the jobs."""

    def __init__(
        self,
        console: Console,
        running: Callable[[], list[tuple[str, str, str]]],
        status: Callable[[], str],
        refresh_hz: float = REFRESH_HZ,
    ):
        from rich.live import Live

        self.console = console
        self._running = running
        self._status = status
        self._final = False
        self.broken = False
        self._stop = threading.Event()
        redirect = console.file is sys.stderr
        self._live: Live = Live(
            console=console,
            auto_refresh=False,  # our own thread, which an error cannot kill with a traceback
            transient=False,
            redirect_stdout=False,
            redirect_stderr=redirect,  # a warning Python prints goes above the region
            get_renderable=self._renderable,
        )
        self._live.start(refresh=True)
        self._thread = threading.Thread(
            target=self._refresh_loop, args=(1.0 / refresh_hz,), name="live-view", daemon=True
        )
        self._thread.start()

    def _refresh_loop(self, period: float) -> None:
        while not self._stop.wait(period):
            self._guard(self._live.refresh)

    def _guard(self, action: Callable[[], object]) -> bool:
        """Run `action`; an error ends the view instead of reaching the sweep. True if it ran."""
        if self.broken:
            return False
        try:
            action()
        except Exception:
            self.broken = True
            self._stop.set()
            self._end()
            return False
        return True

    def _end(self) -> None:
        """Stop the `Live` (which gives sys.stderr back), whatever its last frame does."""
        try:
            self._live.stop()
        except Exception:
            self.broken = True

    def _renderable(self) -> Group | Text:
        try:
            status = Text(self._status())  # wrapped on a narrow terminal, never cut
            if self._final:
                return status
            return Group(*self._rows(), status)
        except Exception:  # a line of the view must never end the refresh thread
            return Text("")

    def _rows(self) -> list[Text]:
        running = self._running()
        room = max(1, min(MAX_ROWS, self.console.size.height - 3))
        shown = running if len(running) <= room else running[: room - 1]
        rows = []
        width = max((len(job[2]) for job in shown), default=7)
        for name, elapsed, phase in shown:
            row = Text(no_wrap=True, overflow="ellipsis")
            row.append(f"{elapsed:>9}", style="cyan")
            row.append(f"  {phase:<{width}}  ", style="dim")
            row.append(name)
            rows.append(row)
        if len(shown) < len(running):
            rows.append(Text(f"{'':>9}  ... and {len(running) - len(shown)} more running", style="dim"))
        return rows

    def print_finished(self, status: str, name: str, took: str) -> bool:
        """A finished job's line above the region; False where the view could not print it."""
        line = Text(no_wrap=False)
        line.append(f"{status:>13}", style=status_style(status))
        line.append(f" {name}{took}")
        return self._print(line)

    def print_message(self, text: str) -> bool:
        return self._print(Text(text))

    def _print(self, line: Text) -> bool:
        """`line` above the region, then the region redrawn at once (the print redraws the region
        as it was last drawn, before the event that printed the line)."""

        def show() -> None:
            self.console.print(line)
            self._live.refresh()

        return self._guard(show)

    def close(self) -> None:
        """Stop the refresh thread and leave the status line, alone, as the region's last frame."""
        self._final = True
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=2.0)
        self._end()
