"""`orchestrate`: validate, plan and run torch.compile sweeps; derive presets and reports."""

from __future__ import annotations

import argparse
import contextlib
import faulthandler
import json
import math
import os
import shlex
import signal
import sys
import warnings
from pathlib import Path

EXIT_BAD_INPUT = 2
EXIT_INTERRUPTED = 130

DESCRIPTION = """\
Find the fastest torch.compile settings for your models on every hardware class of a Ray cluster.

  orchestrate validate sweeps/smoke.yaml      check a sweep file, report every problem with its line
  orchestrate plan sweeps/smoke.yaml          show the jobs a sweep would run; runs nothing
  orchestrate sweep sweeps/smoke.yaml         run it (private local Ray unless --address is given)
  orchestrate report runs/smoke               speedup table per hardware class -> runs/smoke/report.md
  orchestrate presets runs/smoke              fastest ok config per cell -> runs/smoke/presets.json
  orchestrate tune sweeps/smoke.yaml          search beyond the stock modes -> runs/smoke-tune/presets.json
  orchestrate export runs/smoke-tune --hardware cpu --dest DIR   presets + compile-cache bundles
"""


class _Parser(argparse.ArgumentParser):
    """argparse with its errors on one line (the usage block it prints first hides the message)."""

    def error(self, message: str):
        self.exit(EXIT_BAD_INPUT, f"error: {message.removeprefix('argument ')} (see `{self.prog} --help`)\n")


def _whole(least: int):
    """An argparse type: a whole number of at least `least`."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
        if value < least:
            raise argparse.ArgumentTypeError(f"must be at least {least}, got {value}")
        return value

    parse.__name__ = "whole number"
    return parse


def _positive(text: str) -> float:
    """An argparse type: a finite number above 0 (seconds, MiB)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive number, got {text!r}")
    return value


def _add_only(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--only",
        metavar="PATTERN",
        help="run only jobs whose name (hardware/model/bsN/dtype/config, e.g. cpu/resnet-50/bs1/fp32/default) "
        "matches: a glob such as '*/bs1/*' must match the whole name, a plain word such as 'resnet' "
        "matches anywhere; separate several patterns with commas",
    )


def _add_budgets(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--max-compile-s",
        type=_positive,
        metavar="SECONDS",
        help="budget: a config whose cold compile (first compiled call) took longer is never a preset",
    )
    p.add_argument(
        "--max-memory-mb",
        type=_positive,
        metavar="MIB",
        help="budget: a config whose compiled peak memory (CUDA allocator, or process RSS on CPU) was higher "
        "is never a preset",
    )


def _add_cache_redis(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--cache-redis",
        metavar="HOST:PORT",
        help="an existing Redis server for the shared compile cache (one every worker node reaches, on a "
        "cluster); checked before anything runs. Default: a private redis-server on 127.0.0.1 for the run, "
        "stopped at its end (jobs on this machine only); without a redis-server binary the run goes on "
        "without the cache, with one warning",
    )


def _cache_address(args, enabled: bool, flag: str) -> str | None:
    """The --cache-redis of a run that shares its compile cache, checked (a bad one raises
    CacheAddressError: one error line, exit 2); refused where the cache is off."""
    from orchestrator.fleet.cache import CacheAddressError, check_address

    if args.cache_redis is None:
        return None
    if not enabled:
        raise CacheAddressError(f"--cache-redis names the shared compile cache's server, which {flag}")
    return str(check_address(args.cache_redis))


def _knob_names() -> list[str]:
    from orchestrator.tune.space import KNOBS

    return [f"{k.name} ({k.help})" for k in KNOBS]


def _budgets(args):
    from orchestrator.tune.presets import Budgets

    return Budgets(max_compile_s=args.max_compile_s, max_memory_mb=args.max_memory_mb)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="orchestrate", description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("validate", help="check a sweep file; exit 2 listing every problem with file:line")
    p.add_argument("sweep", type=Path, help="sweep YAML file")

    p = sub.add_parser("plan", help="print the job matrix of a sweep and its job count; runs nothing")
    p.add_argument("sweep", type=Path, help="sweep YAML file")
    p.add_argument(
        "--hardware",
        metavar="CLASSES",
        help="comma-separated hardware classes to plan for when the sweep says `hardware: auto` "
        "(default: what this machine has, e.g. cpu or H100)",
    )
    p.add_argument(
        "--cpus-per-job", type=_whole(1), metavar="N", help="as for `sweep` (changes the slot counts shown)"
    )
    _add_only(p)

    p = sub.add_parser("sweep", help="run a sweep and write its result tables")
    p.add_argument("sweep", type=Path, help="sweep YAML file")
    p.add_argument(
        "--out",
        metavar="DIR",
        help="output directory (default: runs/<sweep name>): a local path, or a URI every node can reach, "
        "e.g. s3://BUCKET/PREFIX, gs://BUCKET/PREFIX (quote a URI with ?options in the shell)",
    )
    p.add_argument(
        "--address",
        metavar="ADDR",
        help="Ray cluster to use (e.g. ray://head:10001 or auto); default: start a private local Ray "
        "for this sweep and stop it at the end",
    )
    p.add_argument(
        "--resume",
        action="store_true",
        help="continue a sweep in an output directory that already has rows: jobs with a row are "
        "skipped, so no job gets a second row (without it, a non-empty --out is refused)",
    )
    p.add_argument(
        "--cpus-per-job",
        type=_whole(1),
        metavar="N",
        help="cores each job on a CPU node reserves, and its OMP/compile thread count (default: all cores "
        "of the node, one job at a time, so jobs do not disturb each other's timings)",
    )
    p.add_argument(
        "--scratch",
        metavar="DIR",
        help="where job processes keep caches and logs, on each node (created if missing; default: temp dir)",
    )
    p.add_argument(
        "--lock-clocks",
        action="store_true",
        help="lock each GPU job's SM clock at the GPU's maximum through NVML while it runs (as tritonbench "
        "does), then reset it; needs root on the GPU nodes and nvidia-ml-py. Where NVML refuses, the job "
        "runs unlocked, its row has clocks_locked=false and a note with the reason, and the sweep prints it",
    )
    p.add_argument(
        "--history",
        action="append",
        default=[],
        metavar="DIR",
        help="an earlier output directory (path or URI) whose job times order this sweep longest-first "
        "(repeatable); its rows are read for timing only and never count as done",
    )
    p.add_argument(
        "--allow-missing",
        action="store_true",
        help="when the sweep names hardware classes the cluster lacks, run the ones present instead of "
        "refusing to start",
    )
    p.add_argument(
        "--max-attempts",
        type=_whole(1),
        default=3,
        metavar="N",
        help="tries per job when its Ray worker or node dies (default 3); a job's own failure is never retried",
    )
    p.add_argument(
        "--timeout-cap",
        type=_positive,
        metavar="SECONDS",
        help="lower every job's time limit to at most this (for a run that must end within a window); "
        "jobs that hit it become `timeout` rows",
    )
    p.add_argument(
        "--shared-cache",
        action="store_true",
        help="jobs share Inductor's FX graph cache, Triton autotune cache and GEMM/conv autotune results "
        "through Redis (per hardware class and software stack). Off by default, because a sweep measures "
        "cold compiles: with it, compile_s may be served from the cache, and each row says how "
        "(compile_cache, compile_from_cache, *_cache_hits/misses)",
    )
    _add_cache_redis(p)
    _add_only(p)

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
    p.add_argument("out", help="sweep output directory: a path or a URI such as s3://BUCKET/PREFIX")
    p.add_argument(
        "--baseline", metavar="RUN", help="an earlier output directory (path or URI) to compare with"
    )
    p.add_argument(
        "--history",
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

    p = sub.add_parser(
        "nightly",
        help="run a sweep into a new dated directory under --history and compare it with the last run there",
        description="Runs SWEEP into DIR/<UTC date>T<time>Z (DIR a path or a URI), compares it with the newest "
        "earlier run under DIR that has rows (as `orchestrate report NEW --baseline OLD`), writes "
        "regression.md and regression.json into the new run, prints the summary, and exits 1 when a cell "
        "regressed (0 otherwise; 2 on bad input; 130 when interrupted). Made for cron and CI: see the README.",
    )
    p.add_argument("sweep", type=Path, help="sweep YAML file")
    p.add_argument("--history", required=True, metavar="DIR", help="where the dated runs live (path or URI)")
    p.add_argument("--address", metavar="ADDR", help="Ray cluster to use; default: a private local Ray")
    p.add_argument("--cpus-per-job", type=_whole(1), metavar="N", help="as for `sweep`")
    p.add_argument("--scratch", metavar="DIR", help="as for `sweep`")
    p.add_argument("--allow-missing", action="store_true", help="as for `sweep`")
    p.add_argument("--timeout-cap", type=_positive, metavar="SECONDS", help="as for `sweep`")
    p.add_argument("--thresholds", metavar="FILE", help="as for `report --baseline`")
    _add_only(p)

    p = sub.add_parser(
        "presets",
        help="write OUT/presets.json and OUT/presets.parquet: the fastest ok config per hardware/model/batch/dtype",
        description="Per hardware class, model, batch size and precision: the fastest config whose output "
        "passed the fp64 accuracy check, within the budgets if given; per class and precision a default for "
        "models never swept (eligible on the most cells, then the best geometric-mean speedup). Written as "
        "the `presets` table (OUT/presets.parquet) and as JSON keyed by hardware class and software stack.",
    )
    p.add_argument("out", help="sweep output directory: a path or a URI such as s3://BUCKET/PREFIX")
    _add_budgets(p)

    p = sub.add_parser(
        "tune",
        help="search beyond the stock modes per cell; keep a tuned config only where it is faster by a margin "
        "the statistics support",
        description="Candidates per (hardware class, model, batch size, precision) cell: the sweep's configs "
        "(the stock modes), torch's max-autotune modes as extra bases on GPU classes (--bases), each of those "
        "with one knob turned (--knobs: Inductor options, freezing, channels-last, and runtime settings such "
        "as cudnn_benchmark), and, where allowed, the stock configs under other precision policies "
        "(--precisions). Successive halving across the cluster: every candidate measured cheaply (rung0), the "
        "best 1/eta, the best stock config and the knobs that each helped turned together measured again "
        "(rung1), then the best candidate and the best stock config timed in the same processes, or in "
        "processes of their own where they differ in a runtime setting (confirm). A candidate becomes the "
        "preset only if the 95% interval of stock/candidate lies above 1; every candidate must pass the fp64 "
        "accuracy check and the budgets. Jobs share compile and autotune work through Redis unless "
        "--no-shared-cache. Writes OUT/rung0, OUT/rung1, OUT/confirm (sweep outputs), OUT/tune.json (every "
        "decision, what each setting gained) and OUT/presets.{parquet,json} (for `export`); prints per class "
        "what won.",
    )
    p.add_argument(
        "sweep",
        type=Path,
        help="sweep YAML file: its models, batch sizes, dtypes, hardware, measure "
        "settings, and its configs as the stock modes to beat",
    )
    p.add_argument(
        "--out", metavar="DIR", help="output directory (default: runs/<sweep name>-tune); a path or URI"
    )
    p.add_argument("--address", metavar="ADDR", help="Ray cluster to use; default: a private local Ray")
    p.add_argument(
        "--resume", action="store_true", help="finish a tune in --out: jobs already recorded are skipped"
    )
    p.add_argument(
        "--precisions",
        metavar="LIST",
        default="",
        help="precision policies a candidate may use besides the cell's own, e.g. tf32,bf16 (default: none; "
        "a faster precision changes the numbers, so it is only tried when asked, and still gated by the "
        "fp64 accuracy rule)",
    )
    p.add_argument(
        "--knobs",
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
        metavar="DIR",
        help="an earlier tune's --out: the knobs it measured to gain nothing (or to hurt) on every cell of a hardware class are left out "
        "of that class's search (tune.json says which, and why)",
    )
    p.add_argument(
        "--eta",
        type=_whole(2),
        default=3,
        metavar="N",
        help="rung 0 keeps the best 1/N of each cell's candidates for rung 1 (default 3)",
    )
    p.add_argument(
        "--confirm-repeats",
        type=_whole(2),
        default=3,
        metavar="N",
        help="fresh processes that time the candidate against the stock config (default 3, at least 2)",
    )
    _add_budgets(p)
    p.add_argument("--cpus-per-job", type=_whole(1), metavar="N", help="as for `sweep`")
    p.add_argument("--scratch", metavar="DIR", help="as for `sweep`")
    p.add_argument("--allow-missing", action="store_true", help="as for `sweep`")
    p.add_argument("--timeout-cap", type=_positive, metavar="SECONDS", help="as for `sweep`")
    p.add_argument(
        "--no-shared-cache",
        action="store_true",
        help="compile every candidate cold. By default the tune's jobs share Inductor's FX graph cache, "
        "Triton autotune cache and GEMM/conv autotune results through Redis, since its rungs recompile the "
        "same candidates; compile_s is then partly cache-served, and each row says how (compile_cache, "
        "compile_from_cache, *_cache_hits/misses)",
    )
    _add_cache_redis(p)
    _add_only(p)

    p = sub.add_parser(
        "export",
        help="one hardware class's presets plus a compile-cache bundle per preset, for compiler.apply",
        description="Write DEST/presets.json (per model, batch size and dtype the fastest ok config of the "
        "class, and per dtype a class default for models never swept), DEST/bundles/*.bin (a cold compile of "
        "each preset in a fresh process, saved with torch.compiler.save_cache_artifacts) and DEST/manifest.json "
        "(the class, the software stack, the sha256 of every file), and DEST/packages/*.pt2: each preset compiled "
        "ahead of time for its batch size (AOTInductor, without weights), built in the same process and shipped "
        "only once a fresh process loaded it, which "
        "compiler.apply.compile_tuned loads with the serving model's weights instead of tracing and compiling. "
        "Runs on a node of that class with the stack the sweep ran on, and refuses anything else before "
        "compiling. Load it in production with compiler.apply.compile_tuned.",
    )
    p.add_argument("out", help="sweep output directory: a path or a URI such as s3://BUCKET/PREFIX")
    p.add_argument("--hardware", required=True, help="the hardware class to export (e.g. H100, A100, cpu)")
    p.add_argument("--dest", required=True, type=Path, help="a new (or empty) local directory to write")
    p.add_argument(
        "--cpus",
        type=_whole(1),
        default=None,
        metavar="N",
        help="cores each bundle compile uses (default: all)",
    )
    p.add_argument(
        "--scratch", default=None, help="where the bundle compiles keep their caches (default: $TMPDIR)"
    )
    p.add_argument(
        "--resume",
        action="store_true",
        help="carry on an export into DEST that was interrupted (killed, timed out): the presets it finished "
        "are kept, the others built",
    )
    p.add_argument(
        "--no-packages",
        action="store_true",
        help="bundles only: skip the AOTInductor packages (each adds an export, an ahead-of-time compile and "
        "a load test in a fresh process to the preset's bundle job: 57-81 s on an H200, 16-24 s for the smoke "
        "models on a 2-core CPU); a stack whose loader crashes gets none anyway",
    )

    p = sub.add_parser(
        "kernels",
        help="print which kernel autotuning chose per op and input shape (the kernel_choices table)",
        description="One line per hardware class, op, input shapes and dtype from a sweep's kernel_choices "
        "table (written by jobs whose config autotunes: max-autotune, or max_autotune with freezing on CPU): "
        "candidates timed, the winner with its tiles, and the fastest extern and template times. A job whose "
        "compile timed out or crashed mid-autotune keeps the ops it finished, marked partial.",
    )
    p.add_argument("out", help="sweep output directory: a path or a URI such as s3://BUCKET/PREFIX")
    p.add_argument("--hardware", help="only this hardware class (e.g. H100)")

    # --- Ray Jobs: submit a sweep to a running cluster, follow it ----------------------------
    jobs_epilog = (
        "Token authentication: on a cluster started with RAY_AUTH_MODE=token, set RAY_AUTH_MODE=token "
        "here too; Ray's Jobs client then sends the cluster's token, read from RAY_AUTH_TOKEN, else the "
        "file named by RAY_AUTH_TOKEN_PATH, else ~/.ray/auth_token (`ray get-auth-token` on the head "
        "prints it). orchestrate passes your environment to Ray unchanged and stores no token."
    )
    address_help = (
        "the head node's dashboard, which serves Ray's Jobs API, e.g. http://HEAD:8265; default: "
        "$RAY_API_SERVER_ADDRESS, else $RAY_ADDRESS (this flag wins over both)"
    )
    p = sub.add_parser(
        "submit",
        help="submit a sweep to a running Ray cluster as a Ray job (its driver runs on the head node)",
        description="Submit a sweep through Ray Jobs: the project checkout (without .git, runs/, caches, "
        "*.parquet) becomes the job's working directory and `orchestrate sweep FILE --address auto` runs "
        "on the head node. Prints the job id, then follows its logs until it ends (unless --no-wait).",
        epilog=jobs_epilog,
    )
    p.add_argument(
        "sweep", type=Path, help="sweep YAML file inside the project (e.g. sweeps/), validated here first"
    )
    p.add_argument("--address", metavar="URL", help=address_help)
    p.add_argument(
        "--out",
        metavar="DIR",
        help="output directory as the head node sees it (default: runs/<sweep name>). A relative path "
        "resolves inside the job's working directory on the head node, a temporary copy under Ray's "
        "session directory: pass an absolute path, on a filesystem your machines share, to keep and read "
        "the results; or a URI (s3://BUCKET/PREFIX, gs://BUCKET/PREFIX) that the head node can write with "
        "its own credentials",
    )
    _add_only(p)
    p.add_argument("--resume", action="store_true", help="as for `sweep`: continue a sweep in --out")
    p.add_argument(
        "--timeout-cap", type=_positive, metavar="SECONDS", help="as for `sweep`: cap every job's time limit"
    )
    p.add_argument(
        "--cpus-per-job",
        type=_whole(1),
        metavar="N",
        help="as for `sweep`: cores each job on a CPU node reserves",
    )
    p.add_argument(
        "--allow-missing", action="store_true", help="as for `sweep`: run the hardware classes present"
    )
    p.add_argument(
        "--max-attempts",
        type=_whole(1),
        metavar="N",
        help="as for `sweep`: tries per job when its worker or node dies",
    )
    p.add_argument(
        "--lock-clocks", action="store_true", help="as for `sweep`: lock GPU SM clocks during each job"
    )
    p.add_argument(
        "--shared-cache",
        action="store_true",
        help="as for `sweep`: jobs share their compile work through Redis",
    )
    p.add_argument(
        "--cache-redis",
        metavar="HOST:PORT",
        help="as for `sweep`: the Redis server of --shared-cache, as the cluster's nodes reach it (checked "
        "by the driver on the head node)",
    )
    p.add_argument(
        "--no-wait",
        action="store_true",
        help="print the job id and return at once, instead of following the job's logs until it ends",
    )

    p = sub.add_parser("status", help="status of a submitted sweep job", epilog=jobs_epilog)
    p.add_argument("job", help="job id printed by `orchestrate submit` (raysubmit_...)")
    p.add_argument("--address", metavar="URL", help=address_help)

    p = sub.add_parser("logs", help="print the logs of a submitted sweep job", epilog=jobs_epilog)
    p.add_argument("job", help="job id printed by `orchestrate submit` (raysubmit_...)")
    p.add_argument("--address", metavar="URL", help=address_help)
    p.add_argument(
        "--follow",
        action="store_true",
        help="keep printing new output until the job ends (Ctrl-C stops following, not the job)",
    )
    return parser


def _load(path: Path):
    from orchestrator.spec.sweep import SpecError, load_spec

    try:
        return load_spec(path)
    except SpecError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return None


def cmd_validate(args) -> int:
    spec = _load(args.sweep)
    if spec is None:
        return EXIT_BAD_INPUT
    print(
        f"{args.sweep}: ok ({len(spec.models)} models x {len(spec.batch_sizes)} batch sizes x "
        f"{len(spec.dtypes)} dtypes x {len(spec.configs)} configs per hardware class)"
    )
    return 0


def cmd_plan(args) -> int:
    from orchestrator.fleet.driver import plan_jobs
    from orchestrator.fleet.inventory import CPU_CLASS, HardwareClass, MissingHardwareError, local_classes

    spec = _load(args.sweep)
    if spec is None:
        return EXIT_BAD_INPUT
    if args.hardware:
        names = [h.strip() for h in args.hardware.split(",") if h.strip()]
        classes = {n: HardwareClass(n, "cpu" if n == CPU_CLASS else "cuda", slots=1) for n in names}
    elif spec.hardware != "auto":
        classes = {n: HardwareClass(n, "cpu" if n == CPU_CLASS else "cuda", slots=1) for n in spec.hardware}
    else:
        classes = local_classes(args.cpus_per_job)
    try:
        jobs = plan_jobs(spec, classes, args.only)
    except MissingHardwareError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    print(f"sweep {spec.name!r} from {args.sweep}: {len(jobs)} jobs")
    print(
        f"hardware: {', '.join(sorted({j.hardware for j in jobs})) or 'none'}"
        + (" (auto: this machine)" if spec.hardware == "auto" and not args.hardware else "")
    )
    width = max((len(j.name) for j in jobs), default=4)
    print(f"{'#':>4}  {'job':<{width}}  {'job_id':<20}  timeout")
    for i, job in enumerate(jobs, 1):
        print(f"{i:>4}  {job.name:<{width}}  {job.job_id:<20}  {job.timeout_s:g}s")
    print(f"{len(jobs)} jobs")
    return 0


def cmd_sweep(args) -> int:
    from orchestrator.fleet.driver import check_ray_address, run_sweep
    from orchestrator.fleet.progress import format_duration
    from orchestrator.store.schema import results_path
    from orchestrator.store.storage import StorageError, check_writable, checked

    spec = _load(args.sweep)
    if spec is None:
        return EXIT_BAD_INPUT
    check_ray_address(args.address)  # seconds, not Ray's minute of retries
    cache_redis = _cache_address(args, args.shared_cache, "a sweep uses only with --shared-cache")
    try:
        out = checked(args.out or str(Path("runs") / spec.name))
        check_writable(out)
        history = [checked(earlier) for earlier in args.history]
    except StorageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    for earlier in history:
        if not results_path(earlier).is_dir():
            print(
                f"error: --history {earlier}: not an output directory (it has no results/)", file=sys.stderr
            )
            return EXIT_BAD_INPUT
    opts = _sweep_options(
        args,
        out,
        resume=args.resume,
        max_attempts=args.max_attempts,
        history_dirs=list(history),
        lock_clocks=args.lock_clocks,
        shared_cache=args.shared_cache,
        cache_redis=cache_redis,
    )
    summary, code = _drive(lambda: run_sweep(spec, opts))
    if summary is None:
        return code
    counts = ", ".join(f"{n} {s}" for s, n in sorted(summary.counts.items())) or "nothing to run"
    print(
        f"done in {format_duration(summary.wall_s)}: {counts}; {summary.skipped} skipped as already done.\n"
        f"results: {results_path(out)}  (next: orchestrate report {shlex.quote(str(out))}; "
        f"orchestrate presets {shlex.quote(str(out))})"
    )
    return 0


def _sweep_options(args, out, **extra):
    """SweepOptions from the flags `sweep` and `nightly` share, plus `extra`."""
    from orchestrator.fleet.driver import SweepOptions

    return SweepOptions(
        out_dir=out,
        address=args.address,
        only=args.only,
        cpus_per_job=args.cpus_per_job,
        scratch_root=args.scratch,
        timeout_cap_s=args.timeout_cap,
        allow_missing=args.allow_missing,
        argv=sys.argv,
        **extra,
    )


def _drive(run):
    """Run a sweep or a tune: (its summary, None), or (None, the exit code) after printing why it
    could not start or was interrupted."""
    from orchestrator.fleet.driver import OutputExistsError, SweepInterrupted
    from orchestrator.fleet.inventory import MissingHardwareError
    from orchestrator.store.storage import StorageError
    from orchestrator.tune.search import NothingToTune

    try:
        return run(), None
    except (OutputExistsError, MissingHardwareError, StorageError, NothingToTune) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return None, EXIT_BAD_INPUT
    except SweepInterrupted as exc:
        print(f"\n{exc}", file=sys.stderr)
        return None, EXIT_INTERRUPTED


def _mode_names() -> list[str]:
    from compiler.config import inductor_modes

    return sorted(inductor_modes())


def cmd_tune(args) -> int:
    from orchestrator.fleet.driver import check_ray_address
    from orchestrator.fleet.progress import format_duration
    from orchestrator.store.storage import StorageError, check_writable, checked
    from orchestrator.tune.search import TuneOptions, run_tune
    from orchestrator.tune.space import KNOB_NAMES
    from workers.job import PRECISIONS, canonical_precision

    spec = _load(args.sweep)
    if spec is None:
        return EXIT_BAD_INPUT
    check_ray_address(args.address)  # seconds, not Ray's minute of retries
    problems = []
    precisions = []
    for name in filter(None, (p.strip() for p in args.precisions.split(","))):
        canon = canonical_precision(name)
        if canon is None:
            problems.append(f"--precisions: unknown policy {name!r}; valid: {', '.join(PRECISIONS)}")
        else:
            precisions.append(canon)
    cache_redis = _cache_address(args, not args.no_shared_cache, "--no-shared-cache turns off")
    knobs = KNOB_NAMES
    if args.knobs is not None:
        knobs = tuple(filter(None, (k.strip() for k in args.knobs.split(","))))
        problems += [
            f"--knobs: unknown knob {k!r}; valid: {', '.join(KNOB_NAMES)}"
            for k in knobs
            if k not in KNOB_NAMES
        ]
    bases = None
    if args.bases is not None:
        modes = _mode_names()
        bases = tuple(filter(None, (b.strip() for b in args.bases.split(","))))
        problems += [
            f"--bases: unknown mode {b!r}; valid: {', '.join(modes)}" for b in bases if b not in modes
        ]
    budgets = _budgets(args)
    if problems:
        for line in problems:
            print(f"error: {line}", file=sys.stderr)
        return EXIT_BAD_INPUT
    try:
        out = checked(args.out or str(Path("runs") / f"{spec.name}-tune"))
        check_writable(out)
    except StorageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    opts = TuneOptions(
        out_dir=out,
        address=args.address,
        resume=args.resume,
        only=args.only,
        precisions=tuple(precisions),
        knobs=knobs,
        bases=bases,
        prune_from=checked(args.prune_from) if args.prune_from else None,
        budgets=budgets,
        eta=args.eta,
        confirm_repeats=args.confirm_repeats,
        cpus_per_job=args.cpus_per_job,
        timeout_cap_s=args.timeout_cap,
        allow_missing=args.allow_missing,
        scratch_root=args.scratch,
        shared_cache=not args.no_shared_cache,
        cache_redis=cache_redis,
        argv=sys.argv,
    )
    summary, code = _drive(lambda: run_tune(spec, opts))
    if summary is None:
        return code
    for cell, why in summary.decisions.items():
        print(f"{cell}: {why}")
    for hw, knobs in summary.pruned.items():
        print(f"{hw}: left out of the search (--prune-from): {', '.join(sorted(knobs))}")
    _print_what_won(summary.what_won)
    jobs = ", ".join(f"{n} {r}" for r, n in summary.jobs.items())
    print(
        f"done in {format_duration(summary.wall_s)} ({jobs} jobs): {summary.cells} cells, {summary.tuned} tuned, "
        f"{summary.stock} kept the stock config, {summary.no_preset} without a preset.\n"
        f"presets: {out.join('presets.json')}  (next: orchestrate export {shlex.quote(str(out))} --hardware CLASS "
        "--dest DIR)"
    )
    return 0


def cmd_report(args) -> int:
    from orchestrator.store.schema import read_results, results_path
    from orchestrator.store.storage import StorageError, checked
    from reports.speedup import render, write_report

    try:
        out = checked(args.out)
    except StorageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    if args.baseline and args.history:
        print("error: give --baseline RUN or --history DIR, not both", file=sys.stderr)
        return EXIT_BAD_INPUT
    comparing = args.baseline or args.history
    if not comparing and (args.md or args.json or args.html or args.fail_on or args.thresholds):
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
    from orchestrator.store.storage import StorageError, check_writable, checked
    from reports.regression import to_markdown

    spec = _load(args.sweep)
    if spec is None:
        return EXIT_BAD_INPUT
    check_ray_address(args.address)  # seconds, not Ray's minute of retries
    try:
        history = checked(args.history)
        check_writable(history)
        thresholds = load_thresholds(args.thresholds)
    except (StorageError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    opts = _sweep_options(args, history)
    result, code = _drive(lambda: run_nightly(spec, history, opts, thresholds))
    if result is None:
        return code
    if result.comparison is None:
        print(f"{result.run}: the first run under {history}; nothing to compare yet")
        return 0
    print(to_markdown(result.comparison, terminal=True))
    print(f"reports: {result.run.join('regression.md')}, .json and .html beside it")
    return 1 if result.comparison.counts()["regression"] else 0


def _compare_runs(args, out, table) -> int:
    from compiler.statistics import load_thresholds
    from orchestrator.store.schema import read_results, read_table, results_path
    from orchestrator.store.storage import StorageError, checked
    from reports.html import render_html
    from reports.regression import compare, to_json_text, to_markdown

    try:
        baseline = checked(args.baseline or args.history)
        thresholds = load_thresholds(args.thresholds)
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
    for target, text in pages:
        if target:  # before printing: a closed pipe must not cost the files
            Path(target).write_text(text)
    print(to_markdown(comparison, terminal=True))
    regressions = comparison.counts()["regression"]
    return 1 if args.fail_on == "regression" and regressions else 0


def cmd_presets(args) -> int:
    from orchestrator.store.storage import StorageError, checked
    from orchestrator.tune.presets import write_presets

    try:
        path, data = write_presets(checked(args.out), _budgets(args))
    except (FileNotFoundError, StorageError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except OSError as exc:
        print(f"error: {args.out}: cannot write the presets there ({exc.strerror or exc})", file=sys.stderr)
        return EXIT_BAD_INPUT
    for p in data["presets"]:
        vs_default = f"{p['speedup_vs_default']:.2f}x" if p["speedup_vs_default"] else "n/a"
        print(
            f"{p['hardware']}/{p['model']}/bs{p['batch_size']}/{p['dtype']}: {p['config']} "
            f"({p['speedup_vs_eager']:.2f}x vs eager, {vs_default} vs default)"
        )
    for m in data["no_preset"]:
        print(f"{m['hardware']}/{m['model']}/bs{m['batch_size']}/{m['dtype']}: no ok config {m['statuses']}")
    for hardware, by_dtype in data["defaults"].items():
        for dtype, d in by_dtype.items():
            print(
                f"{hardware}/*/{dtype} (class default, for models never swept): {d['config']} "
                f"(ok on {d['cells']} cells, geomean {d['geomean_speedup_vs_eager']:.2f}x vs eager)"
            )
    _print_what_won(data.get("what_won"))
    print(f"wrote {path}")
    return 0


def _print_what_won(table: list[dict] | None) -> None:
    """Per class, which settings the presets use and what each gained where measured alone."""
    from orchestrator.tune.effects import what_won_markdown

    if table:
        print("\nWhat won, per hardware class (gain: the same config without the setting / with it):")
        print(what_won_markdown(table))


def cmd_export(args) -> int:
    from orchestrator.store.storage import StorageError, checked
    from orchestrator.tune.export import ExportError, export

    try:
        manifest = export(
            checked(args.out),
            args.hardware,
            args.dest,
            threads=args.cpus,
            scratch_root=args.scratch,
            packages=not args.no_packages,
            resume=args.resume,
            log=lambda line: print(line, flush=True),
        )
    except (ExportError, StorageError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    bundles = sum(1 for f in manifest["files"] if f.startswith("bundles/"))
    packages = sum(1 for f in manifest["files"] if f.startswith("packages/"))
    print(
        f"wrote {args.dest}: presets.json, {bundles} bundles, {packages} packages, manifest.json "
        f"(stack: {manifest['stack']})"
    )
    return 0


def cmd_kernels(args) -> int:
    from orchestrator.store.storage import StorageError, checked
    from reports.kernels import load, render, summarize

    try:
        rows = load(checked(args.out)).to_pylist()
    except StorageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    rows = [r for r in rows if not args.hardware or r["hardware"] == args.hardware]
    if not rows:
        where = f" for hardware {args.hardware!r}" if args.hardware else ""
        print(
            f"error: no kernel_choices rows{where} in {args.out}; they come from jobs whose config autotunes "
            "(mode: max-autotune), written op by op as the compile times them"
            + _unfinished_compiles(args.out, args.hardware),
            file=sys.stderr,
        )
        return EXIT_BAD_INPUT
    print(render(summarize(rows)))
    ops: dict[tuple, list] = {}
    for r in rows:
        ops.setdefault((r["job_id"], r["op_index"]), []).append(r)
    partial = [o for o in ops.values() if o[0].get("partial")]
    if partial:
        jobs = len({o[0]["job_id"] for o in partial})
        print(
            f"{len(partial)} of {len(ops)} autotuned ops come from {jobs} compile(s) that did not finish (the "
            "job timed out or crashed; rows marked `partial`): each op was timed whole, but no code was emitted"
        )
    known = [o for o in ops.values() if any(r.get("emitted") is not None for r in o)]
    differ = sum(1 for o in known if any(r.get("emitted") and not r["is_winner"] for r in o))
    if known:
        benchmarked = sum(1 for o in known if any(r.get("fusion_benchmarked") for r in o))
        print(
            f"{benchmarked} of {len(known)} autotuned ops went through Inductor's epilogue-fusion "
            f"benchmarking; {differ} of them emitted another kernel than the fastest"
        )
    return 0


def _unfinished_compiles(out: str, hardware: str | None) -> str:
    """For `kernels` with no rows: the jobs whose compile never finished (so a config that does
    autotune may have none yet), as a clause; '' when there are none or results cannot be read."""
    from orchestrator.store.schema import read_results

    try:
        results = read_results(out, ["hardware", "status", "error", "mode", "options"]).to_pylist()
    except Exception:  # only a hint: the error above stands without it
        return ""

    def autotunes(r: dict) -> bool:
        options = json.loads(r["options"] or "{}")
        return (r["mode"] or "").startswith("max-autotune") or any(
            options.get(k) for k in ("max_autotune", "max_autotune_gemm")
        )

    stopped = [
        r
        for r in results
        if (not hardware or r["hardware"] == hardware)
        and autotunes(r)
        and (
            r["status"] == "compile_error"
            or (r["status"] in ("timeout", "crash") and "phase 'compile'" in (r["error"] or ""))
        )
    ]
    if not stopped:
        return ""
    return (
        f"; {len(stopped)} job(s) ended in their compile before autotuning finished an op "
        "(a longer timeout, or a smaller model, would let them keep some)"
    )


def cmd_submit(args) -> int:
    from orchestrator.fleet import submit as jobs
    from orchestrator.spec.sweep import SpecError
    from orchestrator.store.storage import redact

    extra = [*(["--only", args.only] if args.only else []), *(["--resume"] if args.resume else [])]
    extra += ["--timeout-cap", f"{args.timeout_cap:g}"] if args.timeout_cap is not None else []
    extra += ["--cpus-per-job", str(args.cpus_per_job)] if args.cpus_per_job is not None else []
    extra += ["--allow-missing"] if args.allow_missing else []
    extra += ["--lock-clocks"] if args.lock_clocks else []
    extra += ["--shared-cache"] if args.shared_cache else []
    extra += ["--cache-redis", args.cache_redis] if args.cache_redis else []
    extra += ["--max-attempts", str(args.max_attempts)] if args.max_attempts is not None else []
    try:
        sub = jobs.prepare(args.sweep, args.out, extra)
        address = jobs.resolve_address(args.address)
        job_id = jobs.submit_prepared(sub, address)
    except (SpecError, jobs.SubmitError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    if sub.out_is_uri:
        where = "written by the driver on the head node, with the head node's credentials"
    elif sub.out_is_relative:
        where = "relative: inside the job's working directory on the head node"
    else:
        where = "on the head node"
    print(
        f"submitted sweep {sub.spec.name!r} as job {job_id} to {address}; output {redact(sub.out)} ({where})\n"
        f"  status: orchestrate status {job_id} --address {address}\n"
        f"  logs:   orchestrate logs {job_id} --follow --address {address}\n"
        f"  stop:   ray job stop {job_id} --address {address}",
        flush=True,
    )
    if args.no_wait:
        return 0
    print(f"following the logs of {job_id} (Ctrl-C stops following; the job keeps running):", flush=True)
    try:
        final = jobs.logs(address, job_id, follow=True)
    except jobs.SubmitError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"\nstopped following; job {job_id} keeps running", file=sys.stderr)
        return EXIT_INTERRUPTED
    print(f"job {job_id}: {final}")
    return 0 if final == "SUCCEEDED" else 1


def cmd_status(args) -> int:
    from orchestrator.fleet import submit as jobs

    try:
        info = jobs.status(args.address, args.job)
    except jobs.SubmitError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    print(f"job {info['job_id']}: {info['status']}")
    for key in ("message", "start_time", "end_time", "duration_s", "entrypoint"):
        print(f"  {key + ':':<12} {'-' if info[key] is None else info[key]}")
    for key, value in sorted(info["metadata"].items()):
        print(f"  {key.removeprefix('orchestrator.') + ':':<12} {value}")
    return 0


def cmd_logs(args) -> int:
    from orchestrator.fleet import submit as jobs

    try:
        jobs.logs(args.address, args.job, follow=args.follow)
    except jobs.SubmitError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        print(f"\nstopped following; job {args.job} keeps running", file=sys.stderr)
        return EXIT_INTERRUPTED
    return 0


COMMANDS = {
    "validate": cmd_validate,
    "plan": cmd_plan,
    "kernels": cmd_kernels,
    "export": cmd_export,
    "sweep": cmd_sweep,
    "report": cmd_report,
    "presets": cmd_presets,
    "tune": cmd_tune,
    "nightly": cmd_nightly,
    "submit": cmd_submit,
    "status": cmd_status,
    "logs": cmd_logs,
}


def _print_warning(message, category, filename, lineno, file=None, line=None) -> None:
    """Warnings of ours (a stray file ignored) as one `warning:` line; others as Python shows them."""
    from orchestrator.store.integrity import OutputWarning

    if issubclass(category, OutputWarning):
        if str(message) not in _warned:  # once per command, however often the table is read
            _warned.add(str(message))
            print(f"warning: {message}", file=sys.stderr)
    else:
        _show_warning(message, category, filename, lineno, file, line)


_show_warning = warnings.showwarning
_warned: set[str] = set()


def main(argv: list[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as exc:  # --help (0), or a bad flag (2, already explained on one line)
        return exc.code if isinstance(exc.code, int) else EXIT_BAD_INPUT
    # `kill -USR1 PID`: every thread's stack on stderr, to see where it waits (not where stderr is
    # no file, as under a test's capture)
    with contextlib.suppress(AttributeError, OSError, ValueError):
        faulthandler.register(signal.SIGUSR1, all_threads=True)
    from orchestrator.fleet.cache import CacheAddressError
    from orchestrator.fleet.driver import AddressError
    from orchestrator.store.storage import StorageError

    _always_show_output_warnings()
    warnings.showwarning = _print_warning
    _warned.clear()
    try:
        return COMMANDS[args.command](args)
    except (StorageError, AddressError, CacheAddressError) as exc:  # a locked output, a dead --address, ...
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except BrokenPipeError:  # output piped into `head` or a pager that quit: not an error of ours
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # so the exit flush is quiet
        return 0
    finally:
        warnings.showwarning = _show_warning


def _always_show_output_warnings() -> None:
    """Python shows a warning once per code location; ours name files, so each command shows its
    own (deduplicated by `_print_warning`), not only the first command of a process."""
    from orchestrator.store.integrity import OutputWarning

    warnings.filterwarnings("always", category=OutputWarning)
