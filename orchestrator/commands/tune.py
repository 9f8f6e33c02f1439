"""`tune`: search beyond the stock modes per cell, by successive halving across the cluster."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

from orchestrator.commands.common import (
    EXIT_BAD_INPUT,
    add_cache_redis,
    add_cluster_flags,
    add_deadline,
    add_limits,
    add_only,
    cache_redis_address,
    check_plan_locally,
    deadline_at,
    drive,
    limits_from_args,
    load_sweep,
    not_empty,
    print_what_won,
    resume_command,
    sweep_options,
    unfinished_exit,
    whole,
)
from store.location_forms import arg as location_arg
from workers.runner import plural


def _knob_names() -> list[str]:
    from orchestrator.tune.space import KNOBS

    return [f"{k.name} ({k.help})" for k in KNOBS]


def _mode_names() -> list[str]:
    from compiler.config import inductor_modes

    return sorted(inductor_modes())


_HELP = (
    "search beyond the stock modes per cell; keep a tuned config only where it is faster by a margin "
    "the statistics support"
)
_DESCRIPTION = (
    "Per (hardware class, model, batch size) cell and accuracy budget (--accuracy, or the sweep's "
    "accuracy:, default stock), the fastest configuration within the budget that beats a stock PyTorch user "
    "(the model's dtype under torch's defaults, eager or torch.compile in its faster stock mode). The bases "
    "are the sweep's configs (the stock modes) and, on GPU classes, torch's max-autotune modes (--bases), "
    "under every precision policy a budget lets the class search (--precisions narrows them; `orchestrate "
    "plan` lists them); each base may get one knob turned (--knobs: Inductor options, freezing, "
    "channels-last, and runtime settings such as cudnn_benchmark). Rounds across the cluster, precision "
    "first: every base measured cheaply (rung0), the knobs on each budget's fastest base (knobs), the best "
    "1/eta and the knobs that each helped turned together (rung1), then in fresh processes the stock user "
    "and per precision chosen its fastest candidate against its stock mode, in the same processes where "
    "their runtime settings are equal (confirm). In the cell's own precision a candidate wins only if the "
    "95% interval of stock/candidate lies above 1; in another, the faster config that beats the stock user "
    "by that rule; eager (do not compile) where the same processes timed eager faster, unless --no-eager. "
    "Random-weight outputs that cannot judge precision keep the cell's own. Every candidate must pass the "
    "fp64 accuracy check and the limits. Jobs share compile and autotune work through Redis unless "
    "--no-shared-cache. Writes OUT/rung0, OUT/knobs, OUT/rung1, OUT/confirm (sweep outputs), OUT/tune.json "
    "(every decision, what each setting gained), OUT/presets.{parquet,json} (a preset per cell and budget, "
    "for `export`) and OUT/deployed.json (each preset's speedup over stock eager and stock torch.compile, "
    "with its error against fp64); prints them and, per class, what won."
)


def add_parsers(sub) -> None:
    """`tune`'s flags, in the order --help lists them."""
    p = sub.add_parser("tune", help=_HELP, description=_DESCRIPTION)
    _add_run_flags(p)
    _add_search_space_flags(p)
    _add_round_flags(p)
    add_limits(p)
    _add_cache_flags(p)
    add_deadline(p, "tune")
    add_only(p)
    p.set_defaults(func=cmd_tune)


def _add_run_flags(p) -> None:
    """What to tune, where its output goes, on which cluster, and --resume."""
    p.add_argument(
        "sweep",
        type=Path,
        help="sweep YAML file: its models, batch sizes, dtypes, hardware, measure "
        "settings, and its configs as the stock modes to beat",
    )
    p.add_argument(
        "--out",
        type=location_arg,
        metavar="DIR",
        help="output directory (default: runs/<sweep name>-tune); a path or URI",
    )
    add_cluster_flags(p, "tune")
    p.add_argument(
        "--resume", action="store_true", help="finish a tune in --out: jobs already recorded are skipped"
    )


def _add_search_space_flags(p) -> None:
    """What the search may try: accuracy budgets, precisions, knobs, bases, and --prune-from."""
    p.add_argument(
        "--accuracy",
        type=not_empty("list of accuracy budgets", "stock,bf16", "the sweep's accuracy:, else stock"),
        metavar="LIST",
        help="accuracy budgets, comma-separated, each deciding a preset per cell from the same rows: stock (no "
        "worse against fp64 than torch's defaults on the cell, within a factor), a level (tf32, fp16, bf16) or a "
        "number (max relative error against fp64). Each lets a class search the precision policies up to its "
        "level that the class runs natively (`orchestrate plan` shows which, and why the others are out). "
        "Default: the sweep's `accuracy:`, else stock",
    )
    p.add_argument(
        "--precisions",
        type=not_empty("list of precision policies", "fp32,bf16", "every one the budgets allow"),
        metavar="LIST",
        help="search only these precision policies (the cell's own always), e.g. fp32,bf16 to leave tf32 and "
        "fp16 out of a bf16 budget (default: every policy the budgets let the class search)",
    )
    p.add_argument(
        "--knobs",
        type=not_empty("list of knobs", "freezing,coordinate_descent", "all that apply"),
        metavar="LIST",
        help="the knobs to try on each stock config, comma-separated (default: all that apply to the device "
        "and model): " + ", ".join(_knob_names()) + ". A freezing preset's exported bundle barely shortens "
        "its start (torch cannot cache AOTAutograd with freezing): leave freezing out where start-up matters",
    )
    p.add_argument(
        "--bases",
        metavar="LIST",
        help="torch modes added as bases where the sweep's configs lack them: candidates of their own, each "
        "with the knobs too (default: max-autotune,max-autotune-no-cudagraphs on GPU classes, none on CPU, "
        "where a max-autotune compile takes minutes; '' for none)",
    )
    p.add_argument(
        "--prune-from",
        type=location_arg,
        metavar="DIR",
        help="an earlier tune's --out: the knobs it measured to gain nothing (or to hurt) on every cell of a hardware class are left out "
        "of that class's search (tune.json says which, and why)",
    )


def _add_round_flags(p) -> None:
    """How the rounds keep and confirm candidates: --eta, --confirm-repeats, --extend-repeats, --no-eager."""
    p.add_argument(
        "--eta",
        type=whole(2),
        default=3,
        metavar="N",
        help="rung 0 keeps the best 1/N of each cell's candidates for rung 1 (default 3)",
    )
    p.add_argument(
        "--confirm-repeats",
        type=whole(2),
        default=3,
        metavar="N",
        help="fresh processes that time the candidate against the stock config (default 3, at least 2)",
    )
    p.add_argument(
        "--extend-repeats",
        type=whole(0),
        default=2,
        metavar="N",
        help="where a confirmation measured a speedup of at least confirm_extend_gain (thresholds.json: 1.05) "
        "but its interval did not lie above 1, time every confirmation job of the cell again in N more fresh "
        "processes and decide on all of them together (OUT/extend; default 2, 0: never)",
    )
    p.add_argument(
        "--no-eager",
        action="store_true",
        help="never make a cell's preset eager (do not compile): keep the compiled config chosen even where "
        "its confirmation timed eager faster (tune.json still records that check, as eager_check)",
    )


def _add_cache_flags(p) -> None:
    """The shared compile cache: --no-shared-cache, --cache-from, --cache-redis."""
    p.add_argument(
        "--no-shared-cache",
        action="store_true",
        help="compile every candidate cold. By default the tune's jobs share Inductor's FX graph cache, "
        "Triton autotune cache and GEMM/conv autotune results through Redis, since its rungs recompile the "
        "same candidates; compile_s is then partly cache-served, and each row says how (compile_cache, "
        "compile_from_cache, *_cache_hits/misses)",
    )
    p.add_argument(
        "--cache-from",
        type=location_arg,
        metavar="DIR",
        help="an earlier tune's --out (or a sweep's, run with --shared-cache): the tune's private Redis starts with "
        "the GEMM/conv timings and Triton configs it kept (DIR/shared-cache.parquet), so max-autotune candidates "
        "of the same hardware class and software stack skip the benchmarking already done there (entries of "
        "other classes or stacks never match). Not with --cache-redis (that server keeps its own) or "
        "--no-shared-cache",
    )
    add_cache_redis(p)


def _cache_from_conflict(args) -> str | None:
    """Why --cache-from cannot go with the other cache flags given, or None."""
    if args.cache_from is None:
        return None
    if args.no_shared_cache:
        return "--cache-from seeds the shared compile cache, which --no-shared-cache turns off"
    if args.cache_redis is not None:
        return (
            "--cache-from seeds the tune's private Redis; a server named with --cache-redis keeps its own "
            "entries (drop one of the two)"
        )
    return None


def _cache_from(args):
    """The checked --cache-from location, or None; StorageError (one error line, exit 2) where it
    holds no shared-cache snapshot."""
    from orchestrator.fleet.cache import SNAPSHOT_FILE
    from store.storage import StorageError, checked

    if args.cache_from is None:
        return None
    where = checked(args.cache_from)
    if not where.join(SNAPSHOT_FILE).exists():
        raise StorageError(
            f"--cache-from: {where.join(SNAPSHOT_FILE)} does not exist (give the --out of an earlier tune, or of a "
            "sweep run with --shared-cache, that autotuned something)"
        )
    return where


def _print_deployed(document: dict) -> None:
    """Per budget, what the presets gain over a stock PyTorch user (`deployed.json`)."""
    if not document.get("cells"):
        return
    print("\nAgainst a stock PyTorch user (the model's dtype, torch's defaults; deployed.json):")
    print(
        "| cell | budget | preset | precision | vs stock eager | vs stock torch.compile | error vs fp64 (stock's) | precision decision |"
    )
    print("|---|---|---|---|---|---|---|---|")

    def times(v, ci):
        if v is None:
            return "-"
        low, high = ci
        return f"{v:.2f}x" + (f" [{low:.2f}, {high:.2f}]" if low is not None and high is not None else "")

    def err(v):
        return "-" if v is None else f"{v:.2g}"

    for c in document["cells"]:
        print(
            f"| {c['cell']} | {c['budget']} | {c['preset']} | {c['policy']} | "
            f"{times(c['vs_stock_eager'], c['vs_stock_eager_ci'])} | {times(c['vs_stock_compile'], c['vs_stock_compile_ci'])} | "
            f"{err(c['max_rel_err'])} ({err(c['stock_max_rel_err'])}) | {c['accuracy_decision']} |"
        )
    for name, b in document.get("budgets", {}).items():
        geo = b.get("geomean_vs_stock_compile")
        print(
            f"{name} budget: {b['cells']} cells, geomean {geo:.3f}x over stock torch.compile"
            if geo
            else f"{name} budget: {b['cells']} cells, no figure against stock torch.compile",
            f"({len(b['below_1'])} below 1, {len(b['undetermined'])} undetermined)",
        )


def cmd_tune(args) -> int:
    """Resolve and check the options, check the plan on this machine, run the tune, print it."""
    from orchestrator.fleet.address import check_ray_address
    from orchestrator.tune.plan import plan_locally
    from orchestrator.tune.search import run_tune

    deadline = deadline_at(args)  # counted from the command's start
    spec = load_sweep(args.sweep)
    if spec is None:
        return EXIT_BAD_INPUT
    check_ray_address(args.address)  # seconds, not Ray's minute of retries
    opts = _tune_options(args, spec, deadline)
    if opts is None:
        return EXIT_BAD_INPUT
    if not check_plan_locally(spec, args, plan_locally(spec, opts)):
        return EXIT_BAD_INPUT
    summary, code = drive(lambda: run_tune(spec, opts))
    if summary is None:
        return code
    _print_summary(summary, opts.sweep.out_dir)
    return unfinished_exit(summary.unfinished())


def _tune_options(args, spec, deadline: float | None):
    """`TuneOptions` from the flags, or None after printing every problem with them (one
    `error:` line each) or with the locations they name."""
    from orchestrator.tune.plan import TuneOptions
    from store.storage import StorageError, check_own_output, check_writable, checked

    problems: list[str] = []
    precisions = _precisions(args, problems)
    accuracy = _accuracy(args, problems)
    cache_redis = cache_redis_address(args, not args.no_shared_cache, "--no-shared-cache turns off")
    conflict = _cache_from_conflict(args)
    if conflict:
        problems.append(conflict)
    knobs = _knobs(args, problems)
    bases = _bases(args, problems)
    limits = limits_from_args(args)
    if problems:
        for line in problems:
            print(f"error: {line}", file=sys.stderr)
        return None
    try:
        out = checked(args.out or str(Path("runs") / f"{spec.name}-tune"))
        check_own_output(out, "tune")
        check_writable(out)
        prune_from = checked(args.prune_from) if args.prune_from else None
        cache_from = _cache_from(args)
    except StorageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return None
    sweep = sweep_options(
        args,
        out,
        resume=args.resume,
        shared_cache=not args.no_shared_cache,
        cache_redis=cache_redis,
        deadline=deadline,
        resume_command=resume_command(args, out),
    )
    return TuneOptions(
        sweep,
        accuracy=accuracy,
        precisions=precisions,
        knobs=knobs,
        bases=bases,
        prune_from=prune_from,
        limits=limits,
        eta=args.eta,
        confirm_repeats=args.confirm_repeats,
        extend_repeats=args.extend_repeats,
        eager_presets=not args.no_eager,
        cache_from=cache_from,
    )


def _names(value: str) -> tuple[str, ...]:
    """The names of a comma-separated flag, blanks dropped."""
    return tuple(filter(None, (v.strip() for v in value.split(","))))


def _precisions(args, problems: list[str]) -> tuple[str, ...] | None:
    """--precisions, canonical (None: not given); an unknown policy goes into `problems`."""
    from compiler.precision import PRECISIONS, canonical_precision

    if args.precisions is None:
        return None
    precisions = []
    for name in _names(args.precisions):
        canon = canonical_precision(name)
        if canon is None:
            problems.append(f"--precisions: unknown policy {name!r}; valid: {', '.join(PRECISIONS)}")
        else:
            precisions.append(canon)
    return tuple(precisions)


def _accuracy(args, problems: list[str]) -> tuple:
    """--accuracy's budgets (empty: not given); a bad one goes into `problems`."""
    from compiler.accuracy import parse_budgets

    if args.accuracy is None:
        return ()
    try:
        return parse_budgets(_names(args.accuracy))
    except ValueError as exc:
        problems.append(f"--accuracy: {exc}")
        return ()


def _knobs(args, problems: list[str]) -> tuple[str, ...]:
    """--knobs (default: every knob); an unknown one goes into `problems`."""
    from orchestrator.tune.space import KNOB_NAMES

    if args.knobs is None:
        return KNOB_NAMES
    knobs = _names(args.knobs)
    problems += [
        f"--knobs: unknown knob {k!r}; valid: {', '.join(KNOB_NAMES)}" for k in knobs if k not in KNOB_NAMES
    ]
    return knobs


def _bases(args, problems: list[str]) -> tuple[str, ...] | None:
    """--bases (None: not given); an unknown mode goes into `problems`."""
    if args.bases is None:
        return None
    modes = _mode_names()
    bases = _names(args.bases)
    problems += [f"--bases: unknown mode {b!r}; valid: {', '.join(modes)}" for b in bases if b not in modes]
    return bases


def _print_summary(summary, out) -> None:
    """What the tune decided, its presets against a stock user, and where its presets are."""
    from orchestrator.fleet.progress import format_duration

    for cell, why in summary.decisions.items():
        print(f"{cell}: {why}")
    _print_deployed(summary.deployed)
    for hw, knobs in summary.pruned.items():
        print(f"{hw}: left out of the search (--prune-from): {', '.join(sorted(knobs))}")
    print_what_won(summary.what_won)
    jobs = ", ".join(f"{n} {r}" for r, n in summary.jobs.items())
    print(
        f"done in {format_duration(summary.wall_s)} ({jobs} jobs): {plural(summary.cells, 'cell')}, "
        f"{plural(summary.tuned + summary.stock + summary.eager, 'preset')} ({', '.join(summary.budgets)}): "
        f"{summary.tuned} tuned, {summary.stock} the stock config, {summary.eager} eager (do not compile); "
        f"{plural(summary.no_preset, 'cell')} without a preset.\n"
        + (summary.time_went + "\n" if summary.time_went else "")
        + f"presets: {out.join('presets.json')}  (next: orchestrate export {shlex.quote(str(out))} --hardware CLASS "
        + ("--budget NAME " if len(summary.budgets) > 1 else "")
        + "--dest DIR)"
    )
