"""`presets`: the fastest ok config per hardware class, model, batch size and dtype."""

from __future__ import annotations

import contextlib
import sys

from orchestrator.commands.common import EXIT_BAD_INPUT, add_limits, limits_from_args, print_what_won
from orchestrator.commands.targets import check_page_path, write_pages
from store.location_forms import arg as location_arg
from workers.runner import plural


def add_parsers(sub) -> None:
    p = sub.add_parser(
        "presets",
        help="write OUT/presets.json and OUT/presets.parquet: the fastest ok config per hardware/model/batch/dtype",
        description="Per hardware class, model, batch size and precision (with accuracy budgets: per budget, "
        "every precision the sweep measured a candidate): the fastest config whose output passed the fp64 "
        "accuracy check, within the limits and the budget, and its speedup over a stock PyTorch user (eager and "
        "torch.compile in its faster stock mode, fp32 under torch's defaults) with its error against fp64; per "
        "class and precision a default for models never swept (eligible on the most cells, then the best "
        "geometric-mean speedup). Written as the `presets` table (OUT/presets.parquet) and as JSON keyed by "
        "hardware class and software stack. --html FILE charts their gain over a stock PyTorch user (also of a "
        "tune's output: its deployed.json).",
    )
    p.add_argument(
        "out", type=location_arg, help="sweep output directory: a path or a URI such as s3://BUCKET/PREFIX"
    )
    add_limits(p)
    p.add_argument(
        "--accuracy",
        metavar="LIST",
        help="accuracy budgets to decide under, comma-separated (stock, tf32, fp16, bf16 or a number: max "
        "relative error against fp64); a preset per budget, the fastest config that fits it. Default: the "
        "sweep's own `accuracy:` (none: a preset per precision swept)",
    )
    p.add_argument(
        "--html",
        metavar="FILE",
        help="also write one self-contained HTML page of what the presets gain (works offline, fetches nothing): "
        "per accuracy budget, each preset's speedup over a stock PyTorch user's torch.compile with its 95%% "
        "interval, as a chart and a table. On a tune's output (OUT holds deployed.json), the page of that "
        "deployed.json: the tune's presets are not derived again and nothing is written into OUT",
    )
    p.set_defaults(func=cmd_presets)


def _versus(p: dict) -> str:
    """A preset's gain over a stock PyTorch user, with the errors against fp64."""
    if p.get("vs_stock_compile") is None:
        return ""

    def times(key: str) -> str:
        low, high = p.get(f"{key}_ci_low"), p.get(f"{key}_ci_high")
        ci = f" [{low:.2f}, {high:.2f}]" if low == low and high == high and low is not None else ""
        return f"{p[key]:.2f}x{ci}"

    err = p.get("max_rel_err")
    stock_err = p.get("stock_max_rel_err")
    errors = (
        f"; error vs fp64 {err:.2g} (stock {stock_err:.2g})"
        if err is not None and stock_err is not None
        else ""
    )
    return (
        f"; vs stock torch.compile ({p['stock_compile_config']}) {times('vs_stock_compile')}, vs stock eager "
        f"{times('vs_stock_eager')}{errors}"
    )


def cmd_presets(args) -> int:
    from compiler.accuracy import parse_budgets
    from orchestrator.tune.presets import write_presets
    from store.layout import DEPLOYED_FILE
    from store.lock import holding
    from store.storage import StorageError, checked

    try:
        check_page_path(args.html, "--html")
        accuracy = None
        if args.accuracy is not None:
            accuracy = parse_budgets(filter(None, (a.strip() for a in args.accuracy.split(","))))
        out = checked(args.out)
        if out.join(DEPLOYED_FILE).is_file():
            return _tune_page(args, out)
        # it writes into OUT: held while it does (a missing OUT is refused below, and not created)
        locked = (
            holding(out, again="Run `orchestrate presets` once it has finished.") if out.exists() else None
        )
        with locked or contextlib.nullcontext():
            path, data = write_presets(out, limits_from_args(args), accuracy)
    except (FileNotFoundError, StorageError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except OSError as exc:
        print(f"error: {args.out}: cannot write the presets there ({exc.strerror or exc})", file=sys.stderr)
        return EXIT_BAD_INPUT
    if args.html and write_pages([(args.html, _page(data["presets"], f"Presets of {args.out}"), "--html")]):
        return EXIT_BAD_INPUT
    for p in data["presets"]:
        vs_default = f"{p['speedup_vs_default']:.2f}x" if p["speedup_vs_default"] else "n/a"
        cell = f"{p['hardware']}/{p['model']}/bs{p['batch_size']}/{p['dtype']}"
        if p.get("budget"):
            cell += f" ({p['budget']} budget, precision {p['precision']}, {p['accuracy_decision']})"
        if p["source"] == "eager":
            print(
                f"{cell}: eager (do not compile; runtime {p['runtime'] or 'torch defaults'}): compiled "
                f"{p['eager_over_config']} took {p['eager_gain']:.2f}x eager's time [{p['eager_gain_ci_low']:.2f}, "
                f"{p['eager_gain_ci_high']:.2f}] over {p['eager_gain_processes']} processes ({vs_default} vs default)"
                + _versus(p)
            )
            continue
        print(
            f"{cell}: {p['config']} ({p['speedup_vs_eager']:.2f}x vs eager, {vs_default} vs default{_versus(p)})"
        )
    for m in data["no_preset"]:
        within = f" within the {m['budget']} budget" if m.get("budget") else ""
        what = f"undecided, {m['undecided']}" if m.get("undecided") else "no ok config"
        print(
            f"{m['hardware']}/{m['model']}/bs{m['batch_size']}/{m['dtype']}: {what}{within} {m['statuses']}"
        )
    for hardware, by_dtype in data["defaults"].items():
        for dtype, d in by_dtype.items():
            print(
                f"{hardware}/*/{dtype} (class default, for models never swept): {d['config']} "
                f"(ok on {plural(d['cells'], 'cell')}, geomean {d['geomean_speedup_vs_eager']:.2f}x vs eager)"
            )
    print_what_won(data.get("what_won"))
    print(f"wrote {path}")
    if args.html:
        print(f"wrote {args.html}")
    return 0


def _page(entries: list[dict], title: str) -> str:
    """The deployed-gain page of preset entries (their `deployed.json` summary)."""
    from orchestrator.tune.deployed import summary
    from reports.deployed_html import render_deployed_html

    return render_deployed_html(summary(entries), title)


def _tune_page(args, out) -> int:
    """A tune's output: the page of its deployed.json (--html), its presets as the tune decided them."""
    import json

    from reports.deployed_html import render_deployed_html
    from store.layout import DEPLOYED_FILE, PRESETS_FILE

    given = [
        f
        for f, v in (
            ("--accuracy", args.accuracy),
            ("--max-compile-s", args.max_compile_s),
            ("--max-memory-mb", args.max_memory_mb),
        )
        if v is not None
    ]
    if not args.html or given:
        what = f"{', '.join(given)} derive presets from a sweep" if given else "its presets are decided"
        print(
            f"error: {args.out} is a tune's output: {what}; the tune's presets are {out.join(PRESETS_FILE)}. "
            f"Give --html FILE (alone) for the page of its {DEPLOYED_FILE}, or run `orchestrate presets` on a "
            "sweep's output",
            file=sys.stderr,
        )
        return EXIT_BAD_INPUT
    try:
        deployed = json.loads(out.join(DEPLOYED_FILE).read_text())
        if not isinstance(deployed, dict) or not isinstance(deployed.get("cells"), list):
            raise ValueError("not a deployed summary (no list of cells)")
    except (OSError, ValueError) as exc:
        print(f"error: {out.join(DEPLOYED_FILE)}: cannot read it: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    if write_pages([(args.html, render_deployed_html(deployed, f"Deployed gain of {args.out}"), "--html")]):
        return EXIT_BAD_INPUT
    for name, figures in (deployed.get("budgets") or {}).items():
        geo = figures.get("geomean_vs_stock_compile")
        print(
            f"{name} budget: {figures.get('cells')} cells, geomean "
            f"{'-' if geo is None else f'{geo:.3f}x'} over stock torch.compile"
        )
    print(f"wrote {args.html}")
    return 0
