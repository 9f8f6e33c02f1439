"""`orchestrate nightly SWEEP --history DIR`: tonight's run and its comparison with the last one.

Runs the sweep into a new dated directory under DIR (a path or a URI; `DIR/<UTC date>T<time>Z`),
compares it with the earlier runs there by the history rules of
`reports.regression.compare_history` (the baseline pools a window of previous runs; a latency,
compile-time or memory regression must hold on consecutive runs, a failure counts at once) and
writes the reports into tonight's directory (`regression.md`, the
summary for a CI comment; `regression.json`, every cell; `regression.html`, the page). The exit status says whether anything
regressed, for cron and CI. The comparison itself is `orchestrate report NEW --baseline OLD`.
"""

from __future__ import annotations

import re
import sys
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TextIO

from compiler.statistics import load_thresholds
from orchestrator.fleet.driver import SweepOptions, SweepSummary, run_sweep
from orchestrator.spec.sweep import SweepSpec
from reports.regression import Comparison, compare_history, to_json_text, to_markdown
from reports.regression.html import render_html, row_facts
from store.integrity import DamagedOutputError, OutputWarning
from store.schema import read_results, read_table
from store.storage import Location

RUN_NAME = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{6}Z$")
REPORT_MD = "regression.md"
REPORT_JSON = "regression.json"
REPORT_HTML = "regression.html"


@dataclass
class NightlyResult:
    run: Location
    previous: Location | None
    summary: SweepSummary
    comparison: Comparison | None


def run_name(now: float | None = None) -> str:
    return time.strftime("%Y-%m-%dT%H%M%SZ", time.gmtime(now))


def earlier_runs(history: Location, before: str, limit: int | None = None) -> list[Location]:
    """The dated runs under `history` older than the name `before` that have result rows, oldest
    first; the newest `limit` of them."""
    found = []
    for name in reversed(history.subdirectories()):
        if RUN_NAME.match(name) and name < before:
            candidate = history.join(name)
            try:
                rows = read_results(candidate, columns=["job_id"]).num_rows
            except DamagedOutputError as exc:  # tonight's run must not fail for an old run's file
                warnings.warn(f"skipping {candidate} as a baseline: {exc}", OutputWarning, stacklevel=2)
                continue
            if rows:
                found.append(candidate)
                if limit is not None and len(found) == limit:
                    break
    return found[::-1]


def compare_with_history(current: Location, earlier: list[Location], thresholds: Any) -> Comparison:
    """`current` against the runs before it (oldest first) by the history rules of
    `reports.regression.compare_history` (a window of runs, consecutive violations)."""
    runs = [*earlier, current]
    return compare_history(
        [read_results(r) for r in runs],
        thresholds,
        [read_table(r, "kernel_choices") for r in runs],
        labels=[r.path.rstrip("/").rsplit("/", 1)[-1] for r in runs],
    )


def run_nightly(
    spec: SweepSpec,
    history: Location,
    opts: SweepOptions,
    thresholds: Any,
    stream: TextIO | None = None,
    task_body: Callable[..., dict[str, Any]] | None = None,
    now: float | None = None,
) -> NightlyResult:
    """`opts.out_dir` is replaced by tonight's directory; `task_body` as for `run_sweep`."""
    stream = stream or sys.stderr
    thresholds = thresholds or load_thresholds()
    name = run_name(now)
    run = history.join(name)
    earlier = earlier_runs(history, name, thresholds.window_runs + thresholds.consecutive)
    previous = earlier[-1] if earlier else None
    print(
        f"nightly: {run}" + (f", to compare with {previous}" if previous else " (the first run here)"),
        file=stream,
        flush=True,
    )
    opts.out_dir = run
    summary = run_sweep(spec, opts, stream, task_body=task_body)
    comparison = None
    if previous is not None:
        comparison = compare_with_history(run, earlier, thresholds)
        run.join(REPORT_MD).write_text(to_markdown(comparison))
        run.join(REPORT_JSON).write_text(to_json_text(comparison))
        facts = row_facts(read_results(run), read_results(previous))  # the marks of doubted timings
        run.join(REPORT_HTML).write_text(
            render_html(comparison, f"Nightly {name} against {previous}", facts=facts)
        )
    return NightlyResult(run, previous, summary, comparison)
