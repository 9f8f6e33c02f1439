"""`report`: the speedup table of a sweep output, or two runs (or a run and its history) compared
cell by cell."""

from __future__ import annotations

import sys
from pathlib import Path

from orchestrator.commands.common import (
    EXIT_BAD_INPUT,
)
from orchestrator.commands.targets import check_page_path
from store.location_forms import arg as location_arg


def add_parsers(sub) -> None:
    p = sub.add_parser(
        "report",
        help="print the speedup table of a sweep output and write OUT/report.md; with --baseline, "
        "compare two runs cell by cell",
        description="Without --baseline: the speedup table of OUT (model x config per hardware class), also "
        "written to OUT/report.md. With --baseline RUN: every (hardware, model, batch size, dtype, config) cell "
        "of OUT against RUN: the compiled-latency ratio with its interval, speedup, compile time, memory, "
        "status, graph breaks, recompiles and autotune winner changes, and a verdict per cell (regression, "
        "improvement, unchanged, new, missing) with its reasons; the hardware classes each model regressed on; "
        "the environment diff. Thresholds: compiler/thresholds.json (or --thresholds).",
    )
    p.add_argument(
        "out", type=location_arg, help="sweep output directory: a path or a URI such as s3://BUCKET/PREFIX"
    )
    p.add_argument(
        "--baseline",
        type=location_arg,
        metavar="RUN",
        help="an earlier output directory (path or URI) to compare with",
    )
    p.add_argument(
        "--history",
        type=location_arg,
        metavar="DIR",
        help="instead of --baseline: the dated runs under DIR (as `nightly` writes them) are the baseline, by "
        "the dashboard's rules: the last `consecutive` runs against the `window_runs` before them, a latency, "
        "compile-time or memory regression counting only when every one of them shows it (thresholds.json)",
    )
    p.add_argument(
        "--md", metavar="FILE", help="with --baseline: write the Markdown summary (for a CI comment) here"
    )
    p.add_argument(
        "--json", metavar="FILE", help="with --baseline: write every cell's comparison as JSON here"
    )
    p.add_argument(
        "--html",
        metavar="FILE",
        help="with --baseline: write one self-contained HTML page (inline SVG charts, a sortable table; works offline)",
    )
    p.add_argument(
        "--fail-on",
        choices=["regression"],
        help="with --baseline: exit with status 1 when any cell regressed (for CI and nightly jobs)",
    )
    p.add_argument(
        "--thresholds",
        metavar="FILE",
        help="with --baseline: a thresholds JSON file like compiler/thresholds.json (versioned; default: that one)",
    )
    p.set_defaults(func=cmd_report)


def cmd_report(args) -> int:
    from reports.speedup import render, write_report
    from store.schema import read_results, results_path
    from store.storage import StorageError, checked

    try:
        out = checked(args.out)
    except StorageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    if args.baseline and args.history:
        print("error: give --baseline RUN or --history DIR, not both", file=sys.stderr)
        return EXIT_BAD_INPUT
    comparing = args.baseline or args.history
    pages_given = any(p is not None for p in (args.md, args.json, args.html))
    if not comparing and (pages_given or args.fail_on or args.thresholds is not None):
        print(
            "error: --md, --json, --html, --fail-on and --thresholds compare runs: give --baseline RUN or "
            "--history DIR",
            file=sys.stderr,
        )
        return EXIT_BAD_INPUT
    table = read_results(out)
    if table.num_rows == 0:
        print(
            f"error: no result rows under {results_path(out)}; run `orchestrate sweep` first", file=sys.stderr
        )
        return EXIT_BAD_INPUT
    if comparing:
        return _compare_runs(args, out, table)
    try:
        path = write_report(out, table)  # before printing: a closed pipe must not cost the file
    except OSError as exc:  # a read-only output can still be reported on
        path = None
        print(f"warning: could not write {out.join('report.md')} ({exc.strerror or exc})", file=sys.stderr)
    print(render(table, markdown=False))
    if path:
        print(f"wrote {path}")
    return 0


def _compare_runs(args, out, table) -> int:
    from compiler.statistics import load_thresholds
    from reports.html import render_html
    from reports.regression import compare, to_json_text, to_markdown
    from store.schema import read_results, read_table, results_path
    from store.storage import StorageError, checked

    try:
        baseline = checked(args.baseline or args.history)
        thresholds = load_thresholds(args.thresholds)
        for flag in ("md", "json", "html"):
            check_page_path(getattr(args, flag), f"--{flag}")
    except (StorageError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    if args.history:
        from orchestrator.fleet.nightly import RUN_NAME, compare_with_history, earlier_runs

        name = out.path.rstrip("/").rsplit("/", 1)[-1]
        before = name if RUN_NAME.match(name) else "~"  # a dated run: only the runs older than it
        runs = earlier_runs(baseline, before, thresholds.window_runs + thresholds.consecutive)
        if not runs:
            print(f"error: --history: no dated run with result rows under {baseline}", file=sys.stderr)
            return EXIT_BAD_INPUT
        comparison = compare_with_history(out, runs, thresholds)
    else:
        before = read_results(baseline)
        if before.num_rows == 0:
            print(f"error: --baseline: no result rows under {results_path(baseline)}", file=sys.stderr)
            return EXIT_BAD_INPUT
        comparison = compare(
            table,
            before,
            thresholds,
            read_table(out, "kernel_choices"),
            read_table(baseline, "kernel_choices"),
        )
    markdown = to_markdown(comparison)
    pages = ((args.md, markdown), (args.json, to_json_text(comparison)), (args.html, render_html(comparison)))
    for (target, text), flag in zip(pages, ("--md", "--json", "--html"), strict=True):
        if target:  # before printing: a closed pipe must not cost the files
            try:
                Path(target).write_text(text)
            except OSError as exc:
                print(f"error: {flag} {target}: cannot write it: {exc.strerror or exc}", file=sys.stderr)
                return EXIT_BAD_INPUT
    print(to_markdown(comparison, terminal=True))
    regressions = comparison.counts()["regression"]
    return 1 if args.fail_on == "regression" and regressions else 0
