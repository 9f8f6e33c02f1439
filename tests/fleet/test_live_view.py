"""The live view of a running sweep on a terminal (`orchestrator.fleet.live_view`, drawn by
`orchestrator.fleet.progress.Progress`): rendered into a rich console that believes it writes to
a terminal, or into a real pseudo-terminal, and read back as the screen a terminal would show.
Real time passes (short sleeps): the view redraws itself from a thread. Every wait polls up to a
generous limit, so a busy machine only makes the tests slower."""

from __future__ import annotations

import io
import os
import pty
import re
import sys
import threading
import time
from collections.abc import Callable

import pytest
from rich.console import Console

from compiler.config import CompileConfig
from compiler.job import Job, MeasureSpec, ModelSpec
from orchestrator.fleet.inventory import HardwareClass
from orchestrator.fleet.progress import Progress
from orchestrator.fleet.scheduler import Scheduler

CSI = re.compile(r"\x1b\[(\??)([\d;]*)([A-Za-z])")


def screen(text: str) -> list[str]:
    """The lines a terminal shows after `text`: what rich's live display writes (characters, \\r,
    \\n, cursor up, erase line, cursor shown or hidden; colours ignored), less the blank lines
    under the last one written."""
    lines, row, col, i = [""], 0, 0, 0
    while i < len(text):
        match = CSI.match(text, i)
        if match:
            private, number, code = match.groups()
            if code == "A" and not private:
                row = max(0, row - int(number or 1))
            elif code == "K":
                lines[row] = ""
                col = 0 if number == "2" else col
            i = match.end()
            continue
        ch = text[i]
        i += 1
        if ch == "\r":
            col = 0
        elif ch == "\n":
            row, col = row + 1, 0
            if row == len(lines):
                lines.append("")
        else:
            line = lines[row].ljust(col)
            lines[row] = line[:col] + ch + line[col + 1 :]
            col += 1
    lines = [line.rstrip() for line in lines]
    while lines and not lines[-1]:
        lines.pop()
    return lines


def terminal(width: int = 120, height: int = 30) -> tuple[Console, io.StringIO]:
    buf = io.StringIO()
    return Console(file=buf, force_terminal=True, width=width, height=height, color_system=None), buf


def wait_for(check: Callable[[], bool], limit_s: float = 8.0) -> bool:
    end = time.monotonic() + limit_s
    while time.monotonic() < end:
        if check():
            return True
        time.sleep(0.05)
    return check()


def status_of(buf: io.StringIO) -> str:
    """The region's status line as the terminal shows it now."""
    return next(line for line in reversed(screen(buf.getvalue())) if line.startswith("["))


def job(bs: int) -> Job:
    return Job(
        sweep="s",
        hardware="cpu",
        device="cpu",
        model=ModelSpec(id="python:workers.toy:mlp", name="mlp"),
        batch_size=bs,
        dtype="fp32",
        config=CompileConfig(name="default"),
        measure=MeasureSpec(),
        timeout_s=60,
    )


def test_running_jobs_are_named_with_their_time_and_finished_ones_scroll_above():
    console, buf = terminal()
    p = Progress(total=4, console=console)
    try:
        p.started_job(job(1))  # the scheduler gives the Job; a name works too
        p.started_job("cpu/mlp/bs4/fp32/default")
        assert wait_for(lambda: re.search(r"\b[1-9]\d*s  running  cpu/mlp/bs1/fp32/default", buf.getvalue()))
        shown = screen(buf.getvalue())
        region = shown[-3:]
        assert re.fullmatch(r" +\d+s  running  cpu/mlp/bs1/fp32/default", region[0])
        assert re.fullmatch(r" +\d+s  running  cpu/mlp/bs4/fp32/default", region[1])
        assert region[2].startswith("[0/4] no results yet | running 2 | queued 2 | elapsed ")
        # what each does, as its task says (workers.task.phase_key, read by the driver)
        assert p.shows_phases
        p.set_phase("cpu/mlp/bs1/fp32/default", "compile")
        p.set_phase("cpu/mlp/bs4/fp32/default", "waiting for a GPU")
        p.set_phase("cpu/mlp/bs16/fp32/default", "timing")  # not running: ignored
        assert wait_for(lambda: re.search(r"s  compile +cpu/mlp/bs1/", "\n".join(screen(buf.getvalue()))))
        region = screen(buf.getvalue())[-3:]
        assert re.fullmatch(r" +\d+s  compile            cpu/mlp/bs1/fp32/default", region[0]), region
        assert re.fullmatch(r" +\d+s  waiting for a GPU  cpu/mlp/bs4/fp32/default", region[1]), region

        p.finished_job("cpu/mlp/bs1/fp32/default", "ok", 1.5)
        p.message("warning: cpu: clocks not locked")
        p.finished_job("cpu/mlp/bs4/fp32/default", "timeout", None)
        p.started_job(job(8))
        assert p.phase("cpu/mlp/bs1/fp32/default") == "running"  # forgotten with its job
        assert wait_for(lambda: "running  cpu/mlp/bs8/fp32/default" in screen(buf.getvalue())[-2])
        shown = screen(buf.getvalue())
        assert shown[-5:-2] == [
            "           ok cpu/mlp/bs1/fp32/default in 1.5s",
            "warning: cpu: clocks not locked",
            "      timeout cpu/mlp/bs4/fp32/default",
        ]
        assert shown[-1].startswith("[2/4] ok=1 timeout=1 | running 1 | queued 1 |")
    finally:
        p.close()
    final = screen(buf.getvalue())
    # the finished lines stay above; the region's last frame is the status line alone
    assert final[-2] == "      timeout cpu/mlp/bs4/fp32/default"
    assert final[-1].startswith("[2/4] ok=1 timeout=1 |")
    assert sum(line.startswith("[") for line in final) == 1
    assert "\x1b[?25h" in buf.getvalue()  # the cursor is shown again
    assert p.running == 1 and dict(p.counts) == {"ok": 1, "timeout": 1}


def test_the_eta_and_elapsed_move_with_no_job_event():
    console, buf = terminal()
    p = Progress(total=3, console=console)
    try:
        p.started_job("cpu/a/bs1/fp32/default")
        assert wait_for(lambda: "first job running" in buf.getvalue())
        before = status_of(buf)
        time.sleep(1.2)
        assert wait_for(lambda: status_of(buf) != before)  # nothing happened but time
        after = status_of(buf)
        assert re.search(r"\| ETA -- \(first job running \d+s\)$", after)
        assert before.split("|")[-1] != after.split("|")[-1]

        p.finished_job("cpu/a/bs1/fp32/default", "ok", 1.3)
        p.started_job("cpu/b/bs1/fp32/default")
        assert wait_for(lambda: re.search(r"\| ETA \d", status_of(buf)))
        before = status_of(buf)
        time.sleep(1.2)
        assert wait_for(lambda: status_of(buf) != before)
        assert re.search(r"elapsed \d+s \| ETA \d+s$", status_of(buf))
    finally:
        p.close()


def test_the_status_line_before_and_after_the_first_result(monkeypatch):
    clock = [1000.0]
    monkeypatch.setattr(time, "monotonic", lambda: clock[0])
    p = Progress(total=5, already_done=1, stream=io.StringIO(), live=False)
    assert p.live_status() == "[1/5] no results yet | running 0 | queued 4 | elapsed 0s | ETA --"
    p.started_job(job(1))
    clock[0] += 42
    assert p.live_status().endswith("| running 1 | queued 3 | elapsed 42s | ETA -- (first job running 42s)")
    p.started_job(job(2))
    clock[0] += 18
    p.finished_job(job(1).name, "ok", 60.0)
    assert p.eta_s() == pytest.approx(60.0 * 3)  # 1 job in 60 s, 3 left
    assert p.live_status() == "[2/5] ok=1 | running 1 | queued 2 | elapsed 1m00s | ETA 3m00s"
    assert p.running_jobs() == [(job(2).name, 18.0)]


def test_a_log_stream_keeps_one_line_per_finished_job(monkeypatch):
    clock = [50.0]
    monkeypatch.setattr(time, "monotonic", lambda: clock[0])
    stream = io.StringIO()
    p = Progress(total=3, stream=stream)  # not a terminal: the log view, as before
    assert p.live is False
    p.started_job(job(1))
    p.started_job(job(4))
    p.tick()
    clock[0] += 30
    p.finished_job(job(1).name, "ok", 29.5)
    p.message("warning: cpu: clocks not locked")
    clock[0] += 30
    p.finished_job(job(4).name, "crash", None)
    p.close()
    assert stream.getvalue() == (
        "           ok cpu/mlp/bs1/fp32/default in 29.5s  [1/3] ok=1 | running 1 | elapsed 30s | ETA 1m00s\n"
        "warning: cpu: clocks not locked\n"
        "        crash cpu/mlp/bs4/fp32/default  [2/3] crash=1 ok=1 | running 0 | elapsed 1m00s | ETA 30s\n"
    )


class _FakeTty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_without_rich_a_terminal_gets_the_one_line_view_whose_times_move(monkeypatch):
    for name in [m for m in sys.modules if m == "rich" or m.startswith("rich.")]:
        monkeypatch.setitem(sys.modules, name, None)  # as if rich were not installed
    monkeypatch.setitem(sys.modules, "rich", None)
    monkeypatch.delitem(sys.modules, "orchestrator.fleet.live_view", raising=False)
    stream = _FakeTty()
    p = Progress(total=2, stream=stream)
    assert p.live is True and p._view is None
    p.started_job(job(1))
    first = stream.getvalue()
    assert first.startswith("\r\033[K[0/2] no results yet | running 1 | elapsed ")
    time.sleep(1.1)
    p.tick()  # the driver's tick between results
    redrawn = stream.getvalue()[len(first) :]
    assert redrawn.startswith("\r\033[K[0/2] no results yet | running 1 | elapsed ")

    def elapsed(text: str) -> int:
        return int(re.search(r"elapsed (\d+)s", text).group(1))

    assert elapsed(redrawn) > elapsed(first)
    p.finished_job(job(1).name, "ok", 1.0)
    p.close()
    assert stream.getvalue().endswith("\n") and stream.getvalue().count("\n") == 1


class _BreaksAfter(io.StringIO):
    """A terminal that fails (as one that went away does) after `writes` writes."""

    def __init__(self, writes: int):
        super().__init__()
        self.writes = writes

    def write(self, text: str) -> int:
        self.writes -= 1
        if self.writes < 0:
            raise OSError(5, "Input/output error")
        return super().write(text)

    def isatty(self) -> bool:
        return True


@pytest.mark.parametrize("writes", [0, 3])
def test_a_view_that_fails_never_stops_the_sweep(writes):
    log = io.StringIO()
    console = Console(file=_BreaksAfter(writes), force_terminal=True, width=100, height=20)
    p = Progress(total=2, stream=log, console=console)
    for i in range(2):
        p.started_job(job(i + 1))
        time.sleep(0.3)
        p.finished_job(job(i + 1).name, "ok", 0.3)
    p.message("a warning")
    p.close()
    assert p._view is None and dict(p.counts) == {"ok": 2}
    lines = log.getvalue().splitlines()
    assert "a warning" in lines  # the log view took over
    assert any(line.startswith("           ok cpu/mlp/bs2/fp32/default in 0.3s  [2/2]") for line in lines)
    assert not any(t.name == "live-view" and t.is_alive() for t in threading.enumerate())


def test_on_a_pseudo_terminal_stderr_gets_the_live_view(monkeypatch):
    monkeypatch.setenv("TERM", "xterm-256color")
    monkeypatch.delenv("TTY_COMPATIBLE", raising=False)
    leader, follower = pty.openpty()
    stream = open(follower, "w", encoding="utf-8")  # noqa: SIM115 - closed below
    chunks: list[bytes] = []

    def drain() -> None:  # a terminal that reads everything, so no write ever blocks
        while True:
            try:
                data = os.read(leader, 65536)
            except OSError:
                return
            if not data:
                return
            chunks.append(data)

    def seen() -> list[str]:
        return screen(b"".join(chunks).decode(errors="replace").replace("\r\n", "\n"))

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    monkeypatch.setattr(sys, "stderr", stream)
    try:
        p = Progress(total=2)
        assert p._view is not None and p.live is True
        p.started_job(job(1))
        print("a warning Python printed", file=sys.stderr)  # goes above the region
        assert wait_for(lambda: "running  cpu/mlp/bs1/fp32/default" in "".join(seen()))
        p.finished_job(job(1).name, "ok", 0.2)
        p.close()
        assert sys.stderr is stream  # given back
        stream.flush()
        assert wait_for(lambda: "[1/2] ok=1" in "".join(seen()))
    finally:
        stream.close()
        reader.join(timeout=5)
        os.close(leader)
    shown = seen()
    assert "a warning Python printed" in shown
    assert "           ok cpu/mlp/bs1/fp32/default in 0.2s" in shown
    assert shown[-1].startswith("[1/2] ok=1 | running 0 | queued 1 |"), shown


class _Remote:
    """One class's remote function that never finishes."""

    def __init__(self):
        self.sent = 0

    def remote(self, *args, **kwargs):
        self.sent += 1
        return ("ref", self.sent)


def _scheduler(remote: _Remote) -> Scheduler:
    cpu = HardwareClass("cpu", "cpu", ["n1"], slots=2)
    return Scheduler(
        classes={"cpu": cpu},
        remotes={"cpu": remote},
        task_args=(),
        run_id="r",
        emit=lambda row, job, wall, tables=None: None,
        inventory=lambda: {"cpu": cpu},
    )


def test_the_scheduler_names_each_job_it_sends():
    remote, p = _Remote(), Progress(total=3, stream=io.StringIO())
    sched = _scheduler(remote)
    sched.add([job(1), job(2), job(4)])
    sched.fill(p.started_job)  # what the driver gives it
    assert [name for name, _ in p.running_jobs()] == [job(1).name, job(2).name]

    counted: list[int] = []
    sched = _scheduler(remote)
    sched.add([job(1), job(2)])
    sched.fill(lambda: counted.append(1))  # a callback of no argument still works
    assert counted == [1, 1]
