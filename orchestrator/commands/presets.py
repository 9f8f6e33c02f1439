"""`presets`: the fastest ok config per hardware class, model, batch size and dtype."""

from __future__ import annotations

import contextlib
import sys

from orchestrator.commands.common import EXIT_BAD_INPUT, _add_budgets, _budgets, _print_what_won
from orchestrator.store.location import arg as location_arg
from workers.runner import plural


def add_parsers(sub) -> None:
    p = sub.add_parser(
        "presets",
        help="write OUT/presets.json and OUT/presets.parquet: the fastest ok config per hardware/model/batch/dtype",
        description="Per hardware class, model, batch size and precision: the fastest config whose output "
        "passed the fp64 accuracy check, within the budgets if given; per class and precision a default for "
        "models never swept (eligible on the most cells, then the best geometric-mean speedup). Written as "
        "the `presets` table (OUT/presets.parquet) and as JSON keyed by hardware class and software stack.",
    )
    p.add_argument(
        "out", type=location_arg, help="sweep output directory: a path or a URI such as s3://BUCKET/PREFIX"
    )
    _add_budgets(p)
    p.set_defaults(func=cmd_presets)


def cmd_presets(args) -> int:
    from orchestrator.store.lock import holding
    from orchestrator.store.storage import StorageError, checked
    from orchestrator.tune.presets import write_presets

    try:
        out = checked(args.out)
        # it writes into OUT: held while it does (a missing OUT is refused below, and not created)
        locked = (
            holding(out, again="Run `orchestrate presets` once it has finished.") if out.exists() else None
        )
        with locked or contextlib.nullcontext():
            path, data = write_presets(out, _budgets(args))
    except (FileNotFoundError, StorageError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except OSError as exc:
        print(f"error: {args.out}: cannot write the presets there ({exc.strerror or exc})", file=sys.stderr)
        return EXIT_BAD_INPUT
    for p in data["presets"]:
        vs_default = f"{p['speedup_vs_default']:.2f}x" if p["speedup_vs_default"] else "n/a"
        cell = f"{p['hardware']}/{p['model']}/bs{p['batch_size']}/{p['dtype']}"
        if p["source"] == "eager":
            print(
                f"{cell}: eager (do not compile; runtime {p['runtime'] or 'torch defaults'}): compiled "
                f"{p['eager_over_config']} took {p['eager_gain']:.2f}x eager's time [{p['eager_gain_ci_low']:.2f}, "
                f"{p['eager_gain_ci_high']:.2f}] over {p['eager_gain_processes']} processes ({vs_default} vs default)"
            )
            continue
        print(f"{cell}: {p['config']} ({p['speedup_vs_eager']:.2f}x vs eager, {vs_default} vs default)")
    for m in data["no_preset"]:
        print(f"{m['hardware']}/{m['model']}/bs{m['batch_size']}/{m['dtype']}: no ok config {m['statuses']}")
    for hardware, by_dtype in data["defaults"].items():
        for dtype, d in by_dtype.items():
            print(
                f"{hardware}/*/{dtype} (class default, for models never swept): {d['config']} "
                f"(ok on {plural(d['cells'], 'cell')}, geomean {d['geomean_speedup_vs_eager']:.2f}x vs eager)"
            )
    _print_what_won(data.get("what_won"))
    print(f"wrote {path}")
    return 0
