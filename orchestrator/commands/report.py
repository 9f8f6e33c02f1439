"""`report`: the speedup table of a sweep output, or two runs (or a run and its history) compared
cell by cell."""

from __future__ import annotations

import sys
from pathlib import Path

from orchestrator.commands.common import (
    EXIT_BAD_INPUT,
)
from orchestrator.commands.targets import PAGE_NAMES, check_not_output_data, check_page_path, write_pages
from store.location_forms import arg as location_arg

JSON_FORMATS = ("comparison", "pytorch")
"""What --json writes: the comparison (reports/regression/markdown.py) or benchmark records
(reports/benchmark_records.py)."""


def add_parsers(sub) -> None:
    p = sub.add_parser(
        "report",
        help="print the speedup table of a sweep output and write OUT/report.md (with --html, a page of charts; "
        "with --json --json-format pytorch, PyTorch benchmark records); with --baseline, compare two runs cell by "
        "cell",
        description="Without --baseline: the speedup table of OUT (model x config per hardware class), also "
        "written to OUT/report.md; --html FILE writes a page with, per hardware class, each cell's speedup over "
        "eager with its 95% interval and its compile time; --json FILE --json-format pytorch writes the run's "
        "results as PyTorch benchmark records (for the dashboards that read them). With --baseline RUN: every (hardware, model, batch size, dtype, config) cell "
        "of OUT against RUN: the compiled-latency ratio with its interval, speedup, compile time, memory, "
        "status, graph breaks, recompiles and autotune winner changes, and a verdict per cell (regression, "
        "improvement, unchanged, new, missing) with its reasons; the hardware classes each model regressed on; "
        "the environment diff. Thresholds: compiler/statistics/thresholds.json (or --thresholds).",
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
        "--json",
        metavar="FILE",
        help="with --baseline/--history: write every cell's comparison as JSON here; with --json-format pytorch "
        "(also without --baseline): this run's results as PyTorch benchmark records",
    )
    p.add_argument(
        "--json-format",
        choices=list(JSON_FORMATS),
        help="what --json writes: comparison (the default with --baseline/--history: every cell compared) or "
        "pytorch (PyTorch's benchmark-record format, the OSS benchmark database's v3 records: a list of "
        '{"benchmark", "model", "metric", "runners", "dependencies"}, one per cell and metric: speedup with its '
        "95%% interval, the median latency in ms with its samples, compile time, peak memory; to a FILE "
        "ending .jsonl, JSON Lines, a record a line; works on one run)",
    )
    p.add_argument(
        "--html",
        metavar="FILE",
        help="write one self-contained HTML page (inline SVG charts, a sortable table; works offline, fetches "
        "nothing): without --baseline, per hardware class each cell's speedup over eager with its 95%% interval "
        "and its compile time; with --baseline/--history, the comparison (and with --history a trend chart per "
        "cell with its interval band)",
    )
    p.add_argument(
        "--fail-on",
        choices=["regression"],
        help="with --baseline: exit with status 1 when any cell regressed (for CI and nightly jobs)",
    )
    p.add_argument(
        "--thresholds",
        metavar="FILE",
        help="with --baseline: a thresholds JSON file like compiler/statistics/thresholds.json (versioned; default: that one)",
    )
    p.set_defaults(func=cmd_report)


def cmd_report(args) -> int:
    from store.schema import read_results, results_path
    from store.storage import StorageError, checked

    try:
        out = checked(args.out)
    except StorageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    comparing = bool(args.baseline or args.history)
    problem = flag_problem(args, comparing)
    try:
        if problem:
            raise ValueError(problem)
        check_pages(args)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    table = read_results(out)
    if table.num_rows == 0:
        print(
            f"error: no result rows under {results_path(out)}; run `orchestrate sweep` first", file=sys.stderr
        )
        return EXIT_BAD_INPUT
    if comparing:
        return _compare_runs(args, out, table)
    return _one_run(args, out, table)


def flag_problem(args, comparing: bool) -> str | None:
    """What is wrong with the flags given together, in words that name the fix; None when nothing."""
    if args.baseline and args.history:
        return "give --baseline RUN or --history DIR, not both"
    if args.json_format is not None and args.json is None:
        return f"--json-format {args.json_format} says what --json writes: give --json FILE too"
    if comparing:
        return None
    flags = (("--md", args.md), ("--fail-on", args.fail_on), ("--thresholds", args.thresholds))
    given = [f for f, v in flags if v is not None]
    if given:
        return (
            f"{', '.join(given)} compare runs: give --baseline RUN or --history DIR (of one run, --html FILE "
            "writes its page of charts and --json FILE --json-format pytorch its benchmark records)"
        )
    if args.json is not None and args.json_format != "pytorch":
        return (
            "--json FILE without --baseline or --history: one run has no comparison to write; add "
            "--json-format pytorch for this run's PyTorch benchmark records, or give --baseline RUN"
        )
    return None


def records_wanted(args) -> bool:
    """Whether --json writes benchmark records (else the comparison)."""
    return args.json is not None and args.json_format == "pytorch"


def check_pages(args) -> None:
    """Every page's path, before any work (ValueError naming the flag)."""
    check_page_path(args.md, "--md")
    check_page_path(args.html, "--html")
    check_json_path(args.json)


def check_json_path(target: str | None) -> None:
    """--json FILE, for either format: a new or empty file, or benchmark records or a JSON
    comparison this tool wrote (replaced), under the same checks as every page (`check_page_path`)."""
    from reports.benchmark_records import RECORDS_START

    if target is None:
        return
    path = Path(target)
    start = b""
    try:
        if path.is_file():
            with path.open("rb") as f:
                start = f.read(80)
    except OSError:  # check_page_path names what is wrong with it
        pass
    if start.startswith(tuple(s.encode() for s in RECORDS_START)):
        check_not_output_data(path.resolve(), target, "--json")
        return
    try:
        check_page_path(target, "--json")
    except ValueError as exc:  # its words for a file of another kind: name both kinds --json writes
        if f"is not {PAGE_NAMES['--json']}" not in str(exc):
            raise
        raise ValueError(
            f"--json {target}: exists and is not a JSON page this tool wrote (benchmark records or a "
            "comparison); it is left as it is: give a new file name (or remove that file first)"
        ) from None


def _one_run(args, out, table) -> int:
    """One run: the speedup table (printed, and OUT/report.md), its page of charts (--html) and its
    benchmark records (--json --json-format pytorch)."""
    from reports.benchmark_records import benchmark_records, to_records_text
    from reports.run_cells import run_cells
    from reports.run_html import render_run_html
    from reports.speedup import render, write_report

    cells = run_cells(table) if args.html or args.json else []
    pages = []
    if args.html:
        pages.append((args.html, render_run_html(table, f"Speedup report: {args.out}", cells), "--html"))
    if args.json:
        pages.append(
            (args.json, to_records_text(benchmark_records(cells), args.json.endswith(".jsonl")), "--json")
        )
    try:
        path = write_report(out, table)  # before printing: a closed pipe must not cost the files
    except OSError as exc:  # a read-only output can still be reported on
        path = None
        print(f"warning: could not write {out.join('report.md')} ({exc.strerror or exc})", file=sys.stderr)
    failed = write_pages(pages)
    if failed is not None:
        return failed
    print(render(table, markdown=False))
    for target in [path, *(t for t, _, _ in pages)]:
        if target:
            print(f"wrote {target}")
    return 0


def _compare_runs(args, out, table) -> int:
    from compiler.statistics import load_thresholds
    from reports.regression import compare, to_json_text, to_markdown
    from reports.regression.html import render_html, row_facts
    from store.schema import read_results, read_table, results_path
    from store.storage import StorageError, checked

    try:
        baseline = checked(args.baseline or args.history)
        thresholds = load_thresholds(args.thresholds)
    except (StorageError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    if args.history:
        from orchestrator.workflows.nightly import RUN_NAME, compare_with_history, earlier_runs

        name = out.path.rstrip("/").rsplit("/", 1)[-1]
        before = name if RUN_NAME.match(name) else "~"  # a dated run: only the runs older than it
        runs = earlier_runs(baseline, before, thresholds.window_runs + thresholds.consecutive)
        if not runs:
            print(f"error: --history: no dated run with result rows under {baseline}", file=sys.stderr)
            return EXIT_BAD_INPUT
        comparison = compare_with_history(out, runs, thresholds)
        baseline_rows = read_results(runs[-1])  # the latest run of the window: its doubted timings
    else:
        before = baseline_rows = read_results(baseline)
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
    if records_wanted(args):
        from reports.benchmark_records import benchmark_records, to_records_text
        from reports.run_cells import run_cells

        json_text = to_records_text(benchmark_records(run_cells(table)), args.json.endswith(".jsonl"))
    else:
        json_text = to_json_text(comparison) if args.json else ""
    pages = [
        (args.md, to_markdown(comparison) if args.md else "", "--md"),
        (args.json, json_text, "--json"),
        (
            args.html,
            render_html(comparison, facts=row_facts(table, baseline_rows)) if args.html else "",
            "--html",
        ),
    ]
    failed = write_pages(pages)  # before printing: a closed pipe must not cost the files
    if failed is not None:
        return failed
    print(to_markdown(comparison, terminal=True))
    regressions = comparison.counts()["regression"]
    return 1 if args.fail_on == "regression" and regressions else 0
