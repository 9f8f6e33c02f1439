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


def measured_rows(table_jobs, make_result, seed: int, failed: str | None = None, hostile: bool = False):
    """One row per job of the conftest sweep, each timed in 3 processes of 20 calls (each process
    off by a few percent, as on a real host); `failed`: a job name that ran out of memory;
    `hostile`: the mlp model's name is markup."""
    rng = np.random.default_rng(seed)
    rows = []
    for i, (name, job) in enumerate(sorted(table_jobs.items())):
        center = 2.0 + i % 5

        def groups(ms: float) -> list[list[float]]:
            return [
                [
                    float(x)
                    for x in ms * (1 + 0.03 * rng.standard_normal()) * (1 + 0.01 * rng.standard_normal(CALLS))
                ]
                for _ in range(PROCESSES)
            ]

        fields = latency_fields(groups(10.0), groups(center))
        if name == failed:
            result = make_result("oom", None, None, error="CUDA out of memory")
        else:
            result = make_result("ok", **fields, compile_s=10.0 + i, warm_compile_s=1.5 + i % 3)
        row = make_row(job, result, run_id=f"run-{seed}")
        if hostile and row["model"] == "mlp":
            row["model"] = HOSTILE
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
