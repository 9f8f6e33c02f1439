"""`sweep`: run a sweep and write its result tables."""

from __future__ import annotations

import shlex
from pathlib import Path

from orchestrator.commands.common import (
    EXIT_BAD_INPUT,
    add_cache_redis,
    add_cluster_flags,
    add_deadline,
    add_only,
    cache_redis_address,
    check_before_ray,
    deadline_at,
    drive,
    load_sweep,
    resume_command,
    sweep_options,
    unfinished_exit,
    whole,
)
from store.location_forms import arg as location_arg


def add_parsers(sub) -> None:
    p = sub.add_parser("sweep", help="run a sweep and write its result tables")
    p.add_argument("sweep", type=Path, help="sweep YAML file")
    p.add_argument(
        "--out",
        type=location_arg,
        metavar="DIR",
        help="output directory (default: runs/<sweep name>): a local path, or a URI every node can reach, "
        "e.g. s3://BUCKET/PREFIX, gs://BUCKET/PREFIX (quote a URI with ?options in the shell)",
    )
    add_cluster_flags(p, "sweep")
    p.add_argument(
        "--resume",
        action="store_true",
        help="continue a sweep in an output directory that already has rows: jobs with a row are "
        "skipped, so no job gets a second row (without it, a non-empty --out is refused)",
    )
    p.add_argument(
        "--lock-clocks",
        action="store_true",
        help="lock each GPU job's SM clock at the GPU's maximum through NVML while it runs (as tritonbench "
        "does), then reset it; needs root on the GPU nodes and the gpu extra (nvidia-ml-py). Where NVML "
        "refuses, the job runs unlocked, its row has clocks_locked=false and a note with the reason, and the "
        "sweep prints it",
    )
    p.add_argument(
        "--history",
        type=location_arg,
        action="append",
        default=[],
        metavar="DIR",
        help="an earlier output directory (path or URI) whose job times order this sweep longest-first "
        "(repeatable); its rows are read for timing only and never count as done",
    )
    p.add_argument(
        "--max-attempts",
        type=whole(1),
        default=3,
        metavar="N",
        help="tries per job when its Ray worker or node dies (default 3); a job's own failure is never retried",
    )
    p.add_argument(
        "--shared-cache",
        action="store_true",
        help="jobs share Inductor's FX graph cache, Triton autotune cache and GEMM/conv autotune results "
        "through Redis (per hardware class and software stack). Off by default, because a sweep measures "
        "cold compiles: with it, compile_s may be served from the cache, and each row says how "
        "(compile_cache, compile_from_cache, *_cache_hits/misses)",
    )
    add_cache_redis(p)
    add_deadline(p, "sweep")
    add_only(p)
    p.set_defaults(func=cmd_sweep)


def doubted_for_run(args, out, run_id: str) -> str:
    """The end of a sweep's word on its doubted timings (`reports.run_cells.doubted_summary`), with
    the command that measures them again into a new output; "" where the rows cannot be read."""
    from reports.run_cells import doubted_summary
    from store.schema import read_results

    try:
        table = read_results(out)
    except Exception:  # a damaged or unreachable output: the sweep has said what it saved
        return ""
    again = shlex.quote(f"{str(out).rstrip('/')}-again")
    return doubted_summary(table, run_id, f"orchestrate sweep {shlex.quote(str(args.sweep))} --out {again}")


def cmd_sweep(args) -> int:
    from analysis import efficiency
    from orchestrator.fleet.driver import run_sweep
    from orchestrator.fleet.progress import format_duration
    from store.schema import results_path

    deadline = deadline_at(args)  # counted from the command's start
    spec = load_sweep(args.sweep)
    if spec is None:
        return EXIT_BAD_INPUT
    cache_redis = cache_redis_address(args, args.shared_cache, "a sweep uses only with --shared-cache")
    opts = sweep_options(
        args,
        args.out or str(Path("runs") / spec.name),
        resume=args.resume,
        max_attempts=args.max_attempts,
        history_dirs=list(args.history),
        lock_clocks=args.lock_clocks,
        deadline=deadline,
        shared_cache=args.shared_cache,
        cache_redis=cache_redis,
        resume_command=resume_command(args, args.out or str(Path("runs") / spec.name)),
    )
    ready = check_before_ray(spec, args, opts)  # once, here: run_sweep trusts what it found
    if ready is None:
        return EXIT_BAD_INPUT
    out = ready.out
    summary, code = drive(lambda: run_sweep(spec, opts, ready=ready))
    if summary is None:
        return code
    counts = ", ".join(f"{n} {s}" for s, n in sorted(summary.counts.items())) or "nothing to run"
    time_went = efficiency.for_run(out, summary.run_id)  # where this run's time went
    doubted = doubted_for_run(args, out, summary.run_id)
    print(
        f"done in {format_duration(summary.wall_s)}: {counts}; {summary.skipped} skipped as already done.\n"
        + (time_went + "\n" if time_went else "")
        + (doubted + "\n" if doubted else "")
        + f"results: {results_path(out)}  (next: orchestrate report {shlex.quote(str(out))}; "
        f"orchestrate presets {shlex.quote(str(out))})"
    )
    return unfinished_exit(summary.unfinished())
