"""`nightly`: a sweep run into a new dated folder under --history and compared with the last run
there (orchestrator.workflows.nightly), made for cron and CI (docs/regression.md)."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

from orchestrator.commands.common import (
    EXIT_BAD_INPUT,
    EXIT_REGRESSION,
    add_cluster_flags,
    add_only,
    check_plan_locally,
    drive,
    load_sweep,
    resume_command,
    sweep_options,
    unfinished_exit,
)
from orchestrator.commands.targets import outputs_among
from store.layout import SWEEP_WRITTEN
from store.location_forms import arg as location_arg


def add_parsers(sub) -> None:
    p = sub.add_parser(
        "nightly",
        help="run a sweep into a new dated directory under --history and compare it with the last run there",
        description="Runs SWEEP into DIR/<UTC date>T<time>Z (DIR a path or a URI), compares it with the newest "
        "earlier run under DIR that has rows (as `orchestrate report NEW --baseline OLD`), writes "
        "regression.md and regression.json into the new run, prints the summary, and exits 1 when a cell "
        "regressed (0 otherwise; 2 on bad input; 3 when jobs ended as harness_error, a fault of the harness "
        "whose cells the comparison counts as failures: it prints the sweep that finishes the run, then the "
        "comparison to make again; 130 when interrupted). Made for cron and CI: see docs/regression.md.",
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


def cmd_nightly(args) -> int:
    from compiler.statistics import load_thresholds
    from orchestrator.fleet.address import check_ray_address
    from orchestrator.workflows.nightly import run_nightly
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
    else:
        print(to_markdown(result.comparison, terminal=True))
        print(f"reports: {result.run.join('regression.md')}, .json and .html beside it")
    if result.summary.harness_errors:  # their cells count as failures: finish the run, then compare
        return unfinished_exit(_unfinished(args, result, history))
    if result.comparison is not None and result.comparison.counts()["regression"]:
        return EXIT_REGRESSION
    return 0


def _unfinished(args, result, history) -> str:
    """What a nightly whose run left `harness_error` jobs says: the sweep that finishes tonight's
    run (the nightly's own flags, into its folder) and, where it was compared, the comparison to
    make again then."""
    from orchestrator.fleet.summary import unfinished

    resume = resume_command(args, result.run, drop=("--history", "--thresholds"), command="sweep")
    message = unfinished(result.summary.harness_errors, resume)
    if result.comparison is not None:
        again = ["orchestrate", "report", str(result.run), "--history", str(history)]
        message += f"\nthen compare it again:\n  {shlex.join(again)}"
    return message


def _check_history_root(history) -> None:
    """ValueError for a nightly --history that is a sweep output or lies inside one: tonight's run
    would be written among its files (under results/: part files the output's reader names as strays)."""
    if not history.is_local:
        return
    path = history.local_path.absolute()
    folder = next(outputs_among((path, *path.parents), SWEEP_WRITTEN), None)
    if folder is not None:
        raise ValueError(
            f"--history {history}: {'is' if folder == path else 'lies inside'} the sweep output {folder}; "
            "nightly runs go into a folder of their own, each run in a dated folder under it"
        )
