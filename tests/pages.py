"""What the report-page tests share: a run's rows measured as a job measures them (the latency
columns from per-process samples by `workers.repeats.latency_fields`), written into a real output
by the result sink, and a real browser (headless Chromium) that loads a page, returns its DOM and
every network request the page made (Chromium's net log)."""

from __future__ import annotations

import json
import shutil
import subprocess
from contextlib import closing
from pathlib import Path

import numpy as np
import pytest

from store.rows import make_row
from store.sink import ResultSink
from workers.repeats import latency_fields

HOSTILE = "<script>alert(1)</script>"
PROCESSES, CALLS = 3, 20


def measured_rows(
    table_jobs,
    make_result,
    seed: int,
    failed: str | None = None,
    hostile: bool = False,
    *,
    near_one: str | None = None,
    doubted: str | None = None,
    cpu_name: str | None = None,
    slower: dict[str, float] | None = None,
    drop: tuple[str, ...] = (),
):
    """One row per job of the conftest sweep, each timed in 3 processes of 20 calls (each process
    off by a few percent, as on a real host); `failed`: a job name that ran out of memory;
    `hostile`: the mlp model's name is markup. `near_one`: a job whose compiled latency is its
    eager's (its speedup's interval holds 1x); `doubted`: a job whose first process shared its
    cores with another (its timing is doubted, `compiler.statistics.timing_doubts`); `cpu_name`:
    the device name of the cpu class's rows (the conftest's result names an A100 on every row);
    `slower`: per job name, a factor on its compiled latency; `drop`: job names left out."""
    rng = np.random.default_rng(seed)
    rows = []
    for i, (name, job) in enumerate(sorted(table_jobs.items())):
        center = 10.0 if name == near_one else 2.0 + i % 5

        def groups(ms: float) -> list[list[float]]:
            return [
                [
                    float(x)
                    for x in ms * (1 + 0.03 * rng.standard_normal()) * (1 + 0.01 * rng.standard_normal(CALLS))
                ]
                for _ in range(PROCESSES)
            ]

        fields = latency_fields(groups(10.0), groups(center * (slower or {}).get(name, 1.0)))
        if name == failed:
            result = make_result("oom", None, None, error="CUDA out of memory")
        else:
            result = make_result("ok", **fields, compile_s=10.0 + i, warm_compile_s=1.5 + i % 3)
        if name == doubted:
            result["host_other_share"] = [0.6, 0.02, 0.03]
        if cpu_name and job.hardware == "cpu":
            result["device_name"] = cpu_name
        row = make_row(job, result, run_id=f"run-{seed}")
        if hostile and row["model"] == "mlp":
            row["model"] = HOSTILE
        if name not in drop:
            rows.append(row)
    return rows


def write_output(path: Path, rows) -> Path:
    with closing(ResultSink(path)) as sink:
        for row in rows:
            sink.add(row)
    return path


def browser() -> str:
    found = next((b for b in ("chromium", "chromium-browser", "google-chrome") if shutil.which(b)), None)
    if found is None:
        pytest.skip("no chromium on this machine (apt-get install chromium): the HTML page was not rendered")
    return found


# Chromium's own background traffic (its clock, accounts, dictionaries) is turned off where a flag
# can; what is left carries no page origin and is told apart below.
QUIET = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-default-apps",
    "--disable-spell-checking",
    "--enable-logging=stderr",
    "--v=0",
]


def load(page: Path, work: Path) -> tuple[str, list[str], str]:
    """`page` in headless Chromium: its DOM, the URLs of the network requests the page made
    (requests for the page's file origin in the net log; Chromium's background requests carry no
    page origin), and Chromium's log (console messages, such as a Content-Security-Policy
    violation)."""
    netlog = work / f"{page.stem}.netlog.json"
    done = subprocess.run(
        [
            browser(),
            *QUIET,
            f"--user-data-dir={work / 'profile'}",
            f"--log-net-log={netlog}",
            "--dump-dom",
            page.as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    log = json.loads(netlog.read_text())
    types = {v: k for k, v in log["constants"]["logEventTypes"].items()}
    requests = [
        e["params"]["url"]
        for e in log["events"]
        if types.get(e["type"]) == "URL_REQUEST_START_JOB"
        and "url" in (e.get("params") or {})
        and e["params"].get("initiator") != "not an origin"  # the browser's own, not the page's
    ]
    return done.stdout, requests, done.stderr


# --- a real browser, driven: what a person sees ---------------------------------------------------


class Browser:
    """Headless Chromium driven over the DevTools protocol on a pipe (`--remote-debugging-pipe`:
    no port, no package): one launch for several pages, each laid out at `width` CSS pixels (one
    device pixel each), and per page what a person sees: the rendered geometry of its marks
    (`see`, a script run by DevTools, which the page's policy does not govern), a screenshot of
    the whole page, every request the page made and every console or security message."""

    def __init__(self, work: Path, width: int = 1200):
        import os

        self.width, self._id, self._buf, self._events = width, 0, b"", []
        ours_in, theirs_out = os.pipe()  # Chromium writes its fd 4
        theirs_in, ours_out = os.pipe()  # Chromium reads its fd 3

        def pipes():
            os.dup2(theirs_in, 3)
            os.dup2(theirs_out, 4)

        self._proc = subprocess.Popen(
            [
                browser(),
                *QUIET[:-2],
                f"--user-data-dir={work / 'devtools-profile'}",
                "--remote-debugging-pipe",
            ],
            pass_fds=(3, 4),
            preexec_fn=pipes,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        os.close(theirs_in)
        os.close(theirs_out)
        self._in, self._out = ours_in, ours_out

    def __enter__(self) -> Browser:
        return self

    def __exit__(self, *exc) -> None:
        import os

        try:
            self._send("Browser.close")
            self._proc.wait(timeout=20)
        except Exception:
            self._proc.kill()
            self._proc.wait()
        finally:
            os.close(self._in)
            os.close(self._out)

    def _send(self, method: str, params: dict | None = None, session: str | None = None) -> int:
        import os

        self._id += 1
        message = {"id": self._id, "method": method, "params": params or {}}
        if session:
            message["sessionId"] = session
        os.write(self._out, json.dumps(message).encode() + b"\0")
        return self._id

    def _next(self, deadline: float) -> dict:
        import os
        import select
        import time

        while b"\0" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self._in], [], [], left)[0]:
                raise TimeoutError("Chromium did not answer over its DevTools pipe")
            chunk = os.read(self._in, 1 << 20)
            if not chunk:
                raise RuntimeError("Chromium closed its DevTools pipe")
            self._buf += chunk
        raw, self._buf = self._buf.split(b"\0", 1)
        return json.loads(raw)

    def call(self, method: str, params: dict | None = None, session: str | None = None, timeout: float = 60):
        import time

        wanted, deadline = self._send(method, params, session), time.monotonic() + timeout
        while True:
            message = self._next(deadline)
            if message.get("id") == wanted:
                if "error" in message:
                    raise RuntimeError(f"{method}: {message['error']}")
                return message.get("result", {})
            self._events.append(message)

    def _wait_for(self, method: str, session: str, timeout: float = 60) -> None:
        import time

        deadline = time.monotonic() + timeout
        while not any(e.get("method") == method and e.get("sessionId") == session for e in self._events):
            self._events.append(self._next(deadline))

    def open(self, page: Path) -> str:
        """`page` loaded in a tab of its own and laid out `width` wide in a window as tall as the
        page (every mark inside it: what `see` finds at a point is what is drawn there); its session."""
        target = self.call("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = self.call("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        for domain in ("Page", "Network", "Log", "Runtime"):
            self.call(f"{domain}.enable", session=session)
        self._window(session, 900)
        self.call("Page.navigate", {"url": page.as_uri()}, session)
        self._wait_for("Page.loadEventFired", session)
        self._window(session, int(self.see(session, "Math.ceil(document.documentElement.scrollHeight)")))
        return session

    def _window(self, session: str, height: int) -> None:
        metrics = {"width": self.width, "height": height, "deviceScaleFactor": 1, "mobile": False}
        self.call("Emulation.setDeviceMetricsOverride", metrics, session)

    def see(self, session: str, expression: str):
        """The value of a script run in the page (by DevTools: the page's own policy allows none)."""
        found = self.call(
            "Runtime.evaluate",
            {"expression": expression, "returnByValue": True, "awaitPromise": True},
            session,
        )
        if "exceptionDetails" in found:
            raise RuntimeError(found["exceptionDetails"])
        return found["result"].get("value")

    def screenshot(self, session: str, path: Path) -> Path:
        """The whole page as a PNG, one pixel per CSS pixel (as `see` measures)."""
        import base64

        path.write_bytes(
            base64.b64decode(self.call("Page.captureScreenshot", {"format": "png"}, session)["data"])
        )
        return path

    def clip(self, session: str, path: Path, box: dict) -> Path:
        """The part of the page in `box` (x, y, width, height, CSS pixels from its top left) as a
        PNG, one pixel per CSS pixel."""
        import base64

        params = {"format": "png", "clip": {**box, "scale": 1}, "captureBeyondViewport": True}
        path.write_bytes(base64.b64decode(self.call("Page.captureScreenshot", params, session)["data"]))
        return path

    def requests(self, session: str) -> list[str]:
        """Every URL the page asked for, itself included."""
        return [
            e["params"]["request"]["url"]
            for e in self._events
            if e.get("sessionId") == session and e.get("method") == "Network.requestWillBeSent"
        ]

    def messages(self, session: str) -> list[str]:
        """Every console, security and error message of the page (a blocked script's among them)."""
        found = []
        for e in self._events:
            if e.get("sessionId") != session:
                continue
            if e.get("method") == "Log.entryAdded":
                found.append(e["params"]["entry"].get("text", ""))
            elif e.get("method") == "Runtime.consoleAPICalled":
                found.append(" ".join(str(a.get("value", "")) for a in e["params"].get("args", [])))
            elif e.get("method") == "Runtime.exceptionThrown":
                found.append(json.dumps(e["params"]))
        return found


def png_size(path: Path) -> tuple[int, int]:
    """A PNG's width and height (its header)."""
    import struct

    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is no PNG"
    return struct.unpack(">II", data[16:24])


def png_pixels(path: Path) -> tuple[int, int, list[bytes]]:
    """A PNG's width, height and rows of RGB bytes (8-bit RGB or RGBA, not interlaced: what
    Chromium writes), read with zlib alone."""
    import struct
    import zlib

    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is no PNG"
    pos, idat, header = 8, b"", None
    while pos < len(data):
        (length,), kind = struct.unpack(">I", data[pos : pos + 4]), data[pos + 4 : pos + 8]
        body = data[pos + 8 : pos + 8 + length]
        if kind == b"IHDR":
            header = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            idat += body
        pos += 12 + length
    width, height, depth, color, _, _, interlace = header
    assert depth == 8 and color in (2, 6) and not interlace, header
    step = 3 if color == 2 else 4
    raw, stride, rows, prev = zlib.decompress(idat), width * step, [], bytearray(width * step)
    for y in range(height):
        kind, line = raw[y * (stride + 1)], bytearray(raw[y * (stride + 1) + 1 : (y + 1) * (stride + 1)])
        for i in range(stride):
            left = line[i - step] if i >= step else 0
            up, corner = prev[i], prev[i - step] if i >= step else 0
            if kind == 1:
                line[i] = (line[i] + left) & 255
            elif kind == 2:
                line[i] = (line[i] + up) & 255
            elif kind == 3:
                line[i] = (line[i] + (left + up) // 2) & 255
            elif kind == 4:
                p = left + up - corner
                pa, pb, pc = abs(p - left), abs(p - up), abs(p - corner)
                line[i] = (line[i] + (left if pa <= pb and pa <= pc else up if pb <= pc else corner)) & 255
        rows.append(bytes(line) if step == 3 else bytes(b for i, b in enumerate(line) if i % 4 != 3))
        prev = line
    return width, height, rows
