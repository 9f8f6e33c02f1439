"""`presets`: the fastest ok config per hardware class, model, batch size and dtype."""

from __future__ import annotations

import contextlib
import sys

from orchestrator.commands.common import EXIT_BAD_INPUT, add_budgets, budgets_from_args, print_what_won
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
        "hardware class and software stack.",
    )
    p.add_argument(
        "out", type=location_arg, help="sweep output directory: a path or a URI such as s3://BUCKET/PREFIX"
    )
    add_budgets(p)
    p.add_argument(
        "--accuracy",
        metavar="LIST",
        help="accuracy budgets to decide under, comma-separated (stock, tf32, fp16, bf16 or a number: max "
        "relative error against fp64); a preset per budget, the fastest config that fits it. Default: the "
        "sweep's own `accuracy:` (none: a preset per precision swept)",
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
    from store.lock import holding
    from store.storage import StorageError, checked

    try:
        accuracy = None
        if args.accuracy is not None:
            accuracy = parse_budgets(filter(None, (a.strip() for a in args.accuracy.split(","))))
        out = checked(args.out)
        # it writes into OUT: held while it does (a missing OUT is refused below, and not created)
        locked = (
            holding(out, again="Run `orchestrate presets` once it has finished.") if out.exists() else None
        )
        with locked or contextlib.nullcontext():
            path, data = write_presets(out, budgets_from_args(args), accuracy)
    except (FileNotFoundError, StorageError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except OSError as exc:
        print(f"error: {args.out}: cannot write the presets there ({exc.strerror or exc})", file=sys.stderr)
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
        print(
            f"{m['hardware']}/{m['model']}/bs{m['batch_size']}/{m['dtype']}: no ok config{within} {m['statuses']}"
        )
    for hardware, by_dtype in data["defaults"].items():
        for dtype, d in by_dtype.items():
            print(
                f"{hardware}/*/{dtype} (class default, for models never swept): {d['config']} "
                f"(ok on {plural(d['cells'], 'cell')}, geomean {d['geomean_speedup_vs_eager']:.2f}x vs eager)"
            )
    print_what_won(data.get("what_won"))
    print(f"wrote {path}")
    return 0
