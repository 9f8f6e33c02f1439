"""`report` (a speedup table, or two runs compared) and `nightly` (a dated run compared with the
last one)."""

from __future__ import annotations

import sys
from pathlib import Path

from orchestrator.commands.common import (
    EXIT_BAD_INPUT,
    add_cluster_flags,
    add_only,
    check_plan_locally,
    drive,
    load_sweep,
    sweep_options,
)
from store.location import arg as location_arg


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

    p = sub.add_parser(
        "nightly",
        help="run a sweep into a new dated directory under --history and compare it with the last run there",
        description="Runs SWEEP into DIR/<UTC date>T<time>Z (DIR a path or a URI), compares it with the newest "
        "earlier run under DIR that has rows (as `orchestrate report NEW --baseline OLD`), writes "
        "regression.md and regression.json into the new run, prints the summary, and exits 1 when a cell "
        "regressed (0 otherwise; 2 on bad input; 130 when interrupted). Made for cron and CI: see docs/regression.md.",
    )
    p.add_argument("sweep", type=Path, help="sweep YAML file")
    p.add_argument(
        "--history",
        required=True,
        type=location_arg,
        metavar="DIR",
        help="where the dated runs live (path or URI)",
    )
    add_cluster_flags(p, "nightly")
    p.add_argument("--thresholds", metavar="FILE", help="as for `report --baseline`")
    add_only(p)
    p.set_defaults(func=cmd_nightly)


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


def cmd_nightly(args) -> int:
    from compiler.statistics import load_thresholds
    from orchestrator.fleet.driver import check_ray_address
    from orchestrator.fleet.nightly import run_nightly
    from reports.regression import to_markdown
    from store.storage import StorageError, check_writable, checked

    spec = load_sweep(args.sweep)
    if spec is None:
        return EXIT_BAD_INPUT
    check_ray_address(args.address)  # seconds, not Ray's minute of retries
    try:
        history = checked(args.history)
        _check_history_root(history)
        check_writable(history)
        thresholds = load_thresholds(args.thresholds)
    except (StorageError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    if not check_plan_locally(spec, args):
        return EXIT_BAD_INPUT
    opts = sweep_options(args, history)
    result, code = drive(lambda: run_nightly(spec, history, opts, thresholds))
    if result is None:
        return code
    if result.comparison is None:
        print(f"{result.run}: the first run under {history}; nothing to compare yet")
        return 0
    print(to_markdown(result.comparison, terminal=True))
    print(f"reports: {result.run.join('regression.md')}, .json and .html beside it")
    return 1 if result.comparison.counts()["regression"] else 0


def _check_history_root(history) -> None:
    """ValueError for a nightly --history that is a sweep output or lies inside one: tonight's run
    would be written among its files (under results/: part files the output's reader names as strays)."""
    if not history.is_local:
        return
    path = history.local_path.absolute()
    folder = next(_outputs_among((path, *path.parents), WRITTEN_MARKS), None)
    if folder is not None:
        raise ValueError(
            f"--history {history}: {'is' if folder == path else 'lies inside'} the sweep output {folder}; "
            "nightly runs go into a folder of their own, each run in a dated folder under it"
        )


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
            _check_page_path(getattr(args, flag), f"--{flag}")
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


PAGE_STARTS = {
    "--md": b"## Regression report",
    "--json": b'{\n "format": 1,\n "thresholds": {',
    "--html": b"<!DOCTYPE html><html><head><meta charset='utf-8'>",
}
"""How each page this tool writes begins (reports/regression.py, reports/html.py): an existing file
is replaced only when it begins so (a page of an earlier run), or is empty."""

PAGE_NAMES = {"--md": "a Markdown summary", "--json": "a JSON comparison", "--html": "an HTML page"}

WRITTEN_MARKS = ("run.json", "_ledger")
"""What a sweep output holds once it has run (any one of them)."""

OUTPUT_MARKS = (*WRITTEN_MARKS, ".orchestrate.lock")
"""What makes a directory a sweep output (any one of them): also the lock of one being written."""

OUTPUT_DATA = ("results", "kernel_choices", "triton_kernels", "_ledger", "quarantine", *OUTPUT_MARKS)
"""An output's own files and folders: no page goes there."""

TUNE_MARKS = ("tune.json",)
"""What makes a directory a tune's output (its rounds are sweep outputs one level down)."""

TUNE_DATA = ("rung0", "rung1", "confirm", "tune.json", "presets.json", "presets.parquet")
"""A tune's own files and folders, beside OUTPUT_DATA's names: neither a page nor an export goes there."""


def _check_page_path(target: str | None, flag: str) -> None:
    """A report page's path, checked before the comparison runs: a file in a directory that
    exists, not in a sweep output's data, and not an existing file other than a page of this
    kind (ValueError naming the flag otherwise: it would be lost)."""
    if target is None:
        return
    if not target.strip():
        raise ValueError(f"{flag}: an empty file name; give a file, e.g. regression.{flag[2:]}")
    if target == "-":
        raise ValueError(f"{flag} -: pages are written to files, not to standard output; give a file name")
    path = Path(target)
    try:
        if path.is_dir():
            raise ValueError(f"{flag} {target}: is a directory; give a file name, e.g. {path / 'report'}")
        if not path.parent.is_dir():
            raise ValueError(f"{flag} {target}: the directory {path.parent} does not exist; create it first")
        if path.is_symlink() and not path.exists():  # a loop (resolve raises), or a missing target
            raise ValueError(
                f"{flag} {target}: a symbolic link to a missing target, or a loop; give another name"
            )
        _check_not_output_data(path.resolve(), target, flag)
        if path.is_fifo() or path.is_socket():  # opening one waits for a reader: a hang
            raise ValueError(f"{flag} {target}: is a FIFO or a socket; give a regular file name")
        if path.is_file() and path.stat().st_size:
            with path.open("rb") as f:
                start = f.read(len(PAGE_STARTS[flag]))
            if start != PAGE_STARTS[flag]:
                raise ValueError(
                    f"{flag} {target}: exists and is not {PAGE_NAMES[flag]} this tool wrote; it is left as it "
                    "is: give a new file name (or remove that file first)"
                )
    except (OSError, RuntimeError) as exc:  # a name too long for the file system, a symlink loop
        raise ValueError(
            f"{flag} {target[:200]}: unusable path: {getattr(exc, 'strerror', None) or exc}"
        ) from None


def _check_not_output_data(path: Path, target: str, flag: str, beside: str | None = None) -> None:
    """ValueError when `path` is a sweep or tune output's own file or lies in one of its folders
    (`beside`: what to write instead, e.g. a file name next to the output)."""
    for folder in _outputs_among(path.parents, (*OUTPUT_MARKS, *TUNE_MARKS)):
        first = path.relative_to(folder).parts[0]
        if first in OUTPUT_DATA or first in TUNE_DATA:
            what = "tune" if (folder / TUNE_MARKS[0]).exists() else "sweep"
            instead = beside or f"write the page beside it, e.g. {folder / ('regression.' + flag[2:])}"
            raise ValueError(
                f"{flag} {target}: is the {what} output {folder}'s own data "
                f"(its {first}{'/' if folder != path.parent else ''}); {instead}"
            )


def _outputs_among(folders, marks: tuple[str, ...]):
    """The folders, in order, that hold one of `marks`: sweep outputs."""
    return (folder for folder in folders if any((folder / mark).exists() for mark in marks))
