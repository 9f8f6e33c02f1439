"""What the command modules share: exit codes, argparse types and flag groups, loading a sweep
file, and running a sweep or a tune."""

from __future__ import annotations

import argparse
import math
import shlex
import sys
from pathlib import Path

EXIT_REGRESSION = 1
"""`nightly`, `report --fail-on regression`: a cell regressed."""
EXIT_BAD_INPUT = 2
EXIT_UNFINISHED = 3
"""`sweep`, `tune`, `nightly`: the run ended, but left jobs as `harness_error` (a fault of the
harness, not of the model), which the printed `--resume` command runs again."""
EXIT_INTERRUPTED = 130


def whole(least: int):
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


def positive(text: str) -> float:
    """An argparse type: a finite number above 0 (seconds, MiB)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive number, got {text!r}")
    return value


def not_empty(what: str, example: str, without: str):
    """An argparse type: a value (or comma-separated list) with something in it. An empty one, such
    as an unset shell variable, is refused: `--only ""` ran every job, `--precisions ""` tried none,
    `--address ""` ran on a private local Ray instead of the cluster."""

    def parse(text: str) -> str:
        if not any(p.strip() for p in text.split(",")):
            raise argparse.ArgumentTypeError(
                f"an empty {what} {text!r}: give one, e.g. {example}, or leave the flag out ({without})"
            )
        return text

    parse.__name__ = what
    return parse


_pattern = not_empty("pattern", "'*/bs1/*'", "every job")
ray_address = not_empty("address", "head:6379 or ray://head:10001", "a private local Ray")


def scratch_problem(text: str | None) -> str | None:
    """The error line for a --scratch under which this machine's jobs cannot make their scratch
    directories (a file, a read-only mount, /proc); None where they can
    (`orchestrator.fleet.preflight.scratch_problem`; a cluster's nodes each make it for
    themselves: `check_plan_locally`)."""
    from orchestrator.fleet.preflight import scratch_problem as problem

    return problem(text, "--scratch")


def duration(text: str) -> float:
    """Seconds from `90`, `90s`, `30m` or `2h` (argparse type)."""
    units = {"s": 1, "m": 60, "h": 3600}
    number, unit = (text[:-1], text[-1]) if text and text[-1] in units else (text, "s")
    try:
        value = float(number) * units[unit]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected seconds, or a number with s, m or h (30m), got {text!r}"
        ) from None
    if not 0 < value < math.inf:
        raise argparse.ArgumentTypeError(f"must be a positive duration, got {text!r}")
    return value


def add_deadline(p: argparse.ArgumentParser, what: str) -> None:
    p.add_argument(
        "--deadline",
        type=duration,
        metavar="DURATION",
        help=f"stop the {what} this long after it starts (seconds, or 30m, 2h: a batch job's walltime, a "
        "spot instance's notice): running jobs are cancelled, every finished row is kept, the --resume "
        "command is printed and the exit status is 130, as on Ctrl-C; --resume finishes the work",
    )


def resume_command(args, out, drop: tuple[str, ...] = (), command: str | None = None) -> str:
    """The command that finishes this one: its own flags (--only, --precisions, ... choose the
    work, so a resume without them would run other work) without --deadline and the flags `drop`
    names (each with its value), with --out OUT and --resume; `command` in place of this one's
    name (a nightly's run resumes as a `sweep`)."""
    words = list(getattr(args, "argv", None) or sys.argv[1:])
    if command is not None and words:
        words[0] = command
    dropped = ("--deadline", *drop)
    kept: list[str] = []
    skip = False
    for word in words:
        if skip:
            skip = False
        elif word in dropped:
            skip = True
        elif not word.startswith(tuple(f"{d}=" for d in dropped)) and word != "--resume":
            kept.append(word)
    if not any(w == "--out" or w.startswith("--out=") for w in kept):
        kept += ["--out", str(out)]
    return shlex.join(["orchestrate", *kept, "--resume"])


def unfinished_exit(message: str | None) -> int:
    """The exit status of a run that ended: 0, or after printing `message` (what a run that left
    `harness_error` jobs says, with the command that runs them again) `EXIT_UNFINISHED`."""
    if message is None:
        return 0
    print(f"\n{message}", file=sys.stderr)
    return EXIT_UNFINISHED


def deadline_at(args) -> float | None:
    """`time.monotonic()` of the --deadline, counted from now (the command's start)."""
    import time

    return None if args.deadline is None else time.monotonic() + args.deadline


def add_cluster_flags(p: argparse.ArgumentParser, what: str) -> None:
    """Where and how a run's jobs go (`sweep`, `tune`, `nightly`), declared once."""
    p.add_argument(
        "--address",
        type=ray_address,
        metavar="ADDR",
        help=f"Ray cluster to use (e.g. ray://head:10001 or auto); default: start a private local Ray "
        f"for this {what} and stop it at the end",
    )
    p.add_argument(
        "--cpus-per-job",
        type=whole(1),
        metavar="N",
        help="cores each job on a CPU node reserves, and its OMP/compile thread count (default: all cores "
        "of the node, one job at a time, so jobs do not disturb each other's timings)",
    )
    p.add_argument(
        "--scratch",
        metavar="DIR",
        help="where job processes keep caches and logs, on each node (created if missing; default: temp dir). "
        "On this machine it is tried before Ray starts: a path where no directory can be made (a file, a "
        "read-only mount) is refused with exit 2; a node that cannot make it records harness_error rows, "
        "which --resume runs again",
    )
    p.add_argument(
        "--allow-missing",
        action="store_true",
        help="when the sweep names hardware classes the cluster lacks, run the ones present instead of "
        "refusing to start",
    )
    p.add_argument(
        "--timeout-cap",
        type=positive,
        metavar="SECONDS",
        help="lower every job's time limit to at most this (for a run that must end within a window); "
        "jobs that hit it become `timeout` rows",
    )
    p.add_argument(
        "--no-overlap",
        action="store_true",
        help="start each process of a job only after the one before it has ended, one GPU job per GPU "
        "(default: a job's later processes start once its first is on the device, and the next job on a GPU "
        "starts its first while the job before it runs; each imports and builds on the node's spare cores "
        "and waits at a gate before it touches the device; rows record started_ahead, gate_wait_s, "
        "lane_wait_s and ahead_off). For an A/A check of the overlap, or a node whose spare cores run other work",
    )


def add_only(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--only",
        type=_pattern,
        metavar="PATTERN",
        help="run only jobs whose name (hardware/model/bsN/dtype/config, e.g. cpu/resnet-50/bs1/fp32/default) "
        "matches: a glob such as '*/bs1/*' must match the whole name, a plain word such as 'resnet' "
        "matches anywhere; separate several patterns with commas",
    )


def add_limits(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--max-compile-s",
        type=positive,
        metavar="SECONDS",
        help="budget: a config whose cold compile (first compiled call) took longer is never a preset",
    )
    p.add_argument(
        "--max-memory-mb",
        type=positive,
        metavar="MIB",
        help="budget: a config whose compiled peak memory (CUDA allocator, or process RSS on CPU) was higher "
        "is never a preset. The compiled phase's peak: the first-call search of cudnn_benchmark ran before it, "
        "in the eager phase, and takes the memory that is free; a preset's serving_peak_mem_bytes counts it",
    )


def add_cache_redis(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--cache-redis",
        metavar="URL",
        help="an existing Redis server for the shared compile cache, one every worker node reaches: "
        "redis://[USER@]HOST:PORT, rediss://... (TLS; ?ssl_ca_certs=PATH for a private CA), unix:///PATH, or "
        "HOST:PORT. Never put its password in the URL: it comes from $ORCHESTRATE_CACHE_PASSWORD or "
        "--cache-password-file. Checked (an authenticated PING) before anything runs. Default: a private "
        "redis-server for the run on a unix socket only this user can open, with a random password, stopped "
        "at its end (jobs on this machine only); without a redis-server binary the run goes on without the "
        "cache, with one warning",
    )
    p.add_argument(
        "--cache-password-file",
        metavar="FILE",
        help="a file holding the --cache-redis server's password (the URL's user's, with ACLs); default "
        "$ORCHESTRATE_CACHE_PASSWORD_FILE, else $ORCHESTRATE_CACHE_PASSWORD",
    )
    p.add_argument(
        "--cache-secret-file",
        metavar="FILE",
        help="a file holding the fleet's secret that seals every cache entry (an HMAC key: jobs use no entry "
        "it did not seal, since entries are unpickled); default $ORCHESTRATE_CACHE_SECRET_FILE, else "
        "$ORCHESTRATE_CACHE_SECRET, else a key derived from the server's password. The same on every node "
        "and in every run that shares the server",
    )


def cache_redis_address(args, enabled: bool, flag: str):
    """The `compiler.cache_access.CacheAccess` of a run's --cache-redis with its credentials (a
    bad address, or one without a password or secret, raises CacheAddressError: one error line,
    exit 2; its server is checked by the preflight); None without --cache-redis; refused where the
    cache is off."""
    from orchestrator.fleet.cache import CacheAddressError, named_access

    given = [f for f in ("cache_password_file", "cache_secret_file") if getattr(args, f, None)]
    if args.cache_redis is None:
        if given:
            name = "--" + given[0].replace("_", "-")
            raise CacheAddressError(f"{name} goes with --cache-redis (a private server makes its own)")
        return None
    if not enabled:
        raise CacheAddressError(f"--cache-redis names the shared compile cache's server, which {flag}")
    return named_access(args.cache_redis, args.cache_password_file, args.cache_secret_file)


def limits_from_args(args):
    from orchestrator.tune.presets import Limits

    return Limits(max_compile_s=args.max_compile_s, max_memory_mb=args.max_memory_mb)


def load_sweep(path: Path):
    from orchestrator.spec.sweep import SpecError, load_spec

    try:
        return load_spec(path)
    except SpecError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return None


def sweep_options(args, out, **extra):
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
        overlap=not args.no_overlap,
        argv=sys.argv,
        **extra,
    )


def check_plan_locally(spec, args, plan=None) -> bool:
    """For a run on this machine (no --address, or `local`): --scratch tried, and --only, the
    sweep's hardware and --cpus-per-job checked against the classes its private Ray will have,
    before Ray starts (a typo cost Ray's start, 10-40 s on a loaded 2-core machine): the Python
    API's check (`orchestrator.fleet.preflight.plan_here`) under the flags' names. `plan` makes the
    jobs from those classes (default: the sweep's matrix; `tune` gives its candidates). False,
    after printing why, when nothing would run or the jobs could not make their scratch."""
    from orchestrator.fleet.preflight import plan_here

    try:
        plan_here(args.address, args.scratch, args.cpus_per_job, plan or _sweep_plan(spec, args), "--scratch")
    except _plan_refusals() as exc:
        print(f"error: {exc}", file=sys.stderr)
        return False
    return True


def check_before_ray(spec, args, opts):
    """`sweep`'s checks before Ray starts, the Python API's own
    (`orchestrator.fleet.preflight.check_before_ray`: the output, the --address and --cache-redis
    servers, every --history an output, then `check_plan_locally`'s) under the flags' names: what
    they found, for `run_sweep` to trust, or None after printing why. A dead --address or
    --cache-redis raises, for `main` to print."""
    from orchestrator.fleet.preflight import check_before_ray as check
    from store.storage import StorageError

    try:
        return check(opts, _sweep_plan(spec, args), "--history", "--scratch")
    except (StorageError, *_plan_refusals()) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return None


def _sweep_plan(spec, args):
    """The sweep's jobs on given hardware classes, as its flags select them."""
    from orchestrator.fleet.driver import plan_jobs

    def plan(classes):
        return plan_jobs(spec, classes, args.only, args.timeout_cap, args.allow_missing)

    return plan


def _plan_refusals() -> tuple[type[Exception], ...]:
    """What a plan on this machine refuses with: a --scratch where no directory can be made, a
    class or an --only that leaves nothing to run."""
    from orchestrator.fleet.inventory import MissingHardwareError
    from orchestrator.fleet.options import OptionsError
    from orchestrator.spec.matrix import NoJobMatches
    from orchestrator.tune.plan import NothingToTune

    return OptionsError, MissingHardwareError, NoJobMatches, NothingToTune


def drive(run):
    """Run a sweep or a tune: (its summary, None), or (None, the exit code) after printing why it
    could not start or was interrupted."""
    from orchestrator.fleet.driver import SweepInterrupted
    from orchestrator.fleet.existing import OutputExistsError
    from orchestrator.fleet.inventory import MissingHardwareError
    from orchestrator.spec.matrix import NoJobMatches
    from orchestrator.tune.plan import NothingToTune
    from store.storage import StorageError

    try:
        return run(), None
    except (OutputExistsError, MissingHardwareError, NoJobMatches, StorageError, NothingToTune) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return None, EXIT_BAD_INPUT
    except SweepInterrupted as exc:
        print(f"\n{exc}", file=sys.stderr)
        return None, EXIT_INTERRUPTED


def print_what_won(table: list[dict] | None) -> None:
    """Per class, which settings the presets use and what each gained where measured alone."""
    from orchestrator.tune.effects import what_won_markdown

    if table:
        print("\nWhat won, per hardware class (gain: the same config without the setting / with it):")
        print(what_won_markdown(table))
