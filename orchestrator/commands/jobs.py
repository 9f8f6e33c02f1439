"""Ray Jobs: `submit` a sweep to a running cluster, follow it with `status` and `logs`."""

from __future__ import annotations

import sys
from pathlib import Path

from orchestrator.commands.common import EXIT_BAD_INPUT, EXIT_INTERRUPTED, add_only, positive, whole
from store.location_forms import arg as location_arg

JOBS_EPILOG = (
    "Token authentication: on a cluster started with RAY_AUTH_MODE=token, set RAY_AUTH_MODE=token "
    "here too; Ray's Jobs client then sends the cluster's token, read from RAY_AUTH_TOKEN, else the "
    "file named by RAY_AUTH_TOKEN_PATH, else ~/.ray/auth_token (`ray get-auth-token` on the head "
    "prints it). orchestrate passes your environment to Ray unchanged and stores no token."
)
"""The epilog of `submit`, `status` and `logs`: how Ray Jobs authenticate."""

ADDRESS_HELP = (
    "the head node's dashboard, which serves Ray's Jobs API, e.g. http://HEAD:8265; default: "
    "$RAY_API_SERVER_ADDRESS, else $RAY_ADDRESS (this flag wins over both)"
)
"""The --address of all three: the dashboard, not the GCS `sweep --address` takes."""


def add_parsers(sub) -> None:
    """`submit`, `status` and `logs`."""
    _add_submit(sub)
    _add_status(sub)
    _add_logs(sub)


def _add_submit(sub) -> None:
    """`submit SWEEP`: where the head node writes, the flags passed on to its `orchestrate sweep`,
    and --no-wait."""
    p = sub.add_parser(
        "submit",
        help="submit a sweep to a running Ray cluster as a Ray job (its driver runs on the head node)",
        description="Submit a sweep through Ray Jobs: the project checkout (without .git, runs/, caches, "
        "*.parquet) becomes the job's working directory and `orchestrate sweep FILE --address auto` runs "
        "on the head node. Prints the job id, then follows its logs until it ends (unless --no-wait).",
        epilog=JOBS_EPILOG,
    )
    p.add_argument(
        "sweep", type=Path, help="sweep YAML file inside the project (e.g. sweeps/), validated here first"
    )
    p.add_argument("--address", metavar="URL", help=ADDRESS_HELP)
    p.add_argument(
        "--out",
        type=location_arg,
        metavar="DIR",
        help="output directory as the head node sees it (default: runs/<sweep name>). A relative path "
        "resolves inside the job's working directory on the head node, a temporary copy under Ray's "
        "session directory: pass an absolute path, on a filesystem your machines share, to keep and read "
        "the results; or a URI (s3://BUCKET/PREFIX, gs://BUCKET/PREFIX) that the head node can write with "
        "its own credentials",
    )
    _add_forwarded(p)
    p.add_argument(
        "--no-wait",
        action="store_true",
        help="print the job id and return at once, instead of following the job's logs until it ends",
    )
    p.set_defaults(func=cmd_submit)


def _add_forwarded(p) -> None:
    """The FORWARDED flags: taken as `sweep` takes them, passed on to the sweep on the head node."""
    add_only(p)
    p.add_argument("--resume", action="store_true", help="as for `sweep`: continue a sweep in --out")
    p.add_argument(
        "--timeout-cap", type=positive, metavar="SECONDS", help="as for `sweep`: cap every job's time limit"
    )
    p.add_argument(
        "--cpus-per-job",
        type=whole(1),
        metavar="N",
        help="as for `sweep`: cores each job on a CPU node reserves",
    )
    p.add_argument(
        "--allow-missing", action="store_true", help="as for `sweep`: run the hardware classes present"
    )
    p.add_argument(
        "--max-attempts",
        type=whole(1),
        metavar="N",
        help="as for `sweep`: tries per job when its worker or node dies",
    )
    p.add_argument(
        "--lock-clocks", action="store_true", help="as for `sweep`: lock GPU SM clocks during each job"
    )
    p.add_argument(
        "--no-overlap",
        action="store_true",
        help="as for `sweep`: start each process of a job only after the one before it has ended",
    )
    p.add_argument(
        "--shared-cache",
        action="store_true",
        help="as for `sweep`: jobs share their compile work through Redis",
    )
    p.add_argument(
        "--cache-redis",
        metavar="URL",
        help="as for `sweep`: the Redis server of --shared-cache, as the cluster's nodes reach it (checked "
        "by the driver on the head node)",
    )
    p.add_argument(
        "--cache-password-file",
        metavar="FILE",
        help="as for `sweep`: a file on the head node holding the --cache-redis server's password (the "
        "driver there reads it; $ORCHESTRATE_CACHE_PASSWORD in the head node's environment does too)",
    )
    p.add_argument(
        "--cache-secret-file",
        metavar="FILE",
        help="as for `sweep`: a file on the head node holding the secret that seals the cache's entries",
    )


def _add_status(sub) -> None:
    """`status JOB`: a submitted job's state."""
    p = sub.add_parser("status", help="status of a submitted sweep job", epilog=JOBS_EPILOG)
    p.add_argument("job", help="job id printed by `orchestrate submit` (raysubmit_...)")
    p.add_argument("--address", metavar="URL", help=ADDRESS_HELP)
    p.set_defaults(func=cmd_status)


def _add_logs(sub) -> None:
    """`logs JOB [--follow]`: a submitted job's output."""
    p = sub.add_parser("logs", help="print the logs of a submitted sweep job", epilog=JOBS_EPILOG)
    p.add_argument("job", help="job id printed by `orchestrate submit` (raysubmit_...)")
    p.add_argument("--address", metavar="URL", help=ADDRESS_HELP)
    p.add_argument(
        "--follow",
        action="store_true",
        help="keep printing new output until the job ends (Ctrl-C stops following, not the job)",
    )
    p.set_defaults(func=cmd_logs)


FORWARDED = (
    "--only",
    "--resume",
    "--timeout-cap",
    "--cpus-per-job",
    "--allow-missing",
    "--max-attempts",
    "--lock-clocks",
    "--no-overlap",
    "--shared-cache",
    "--cache-redis",
    "--cache-password-file",
    "--cache-secret-file",
)
"""The flags `submit` takes as `sweep` does and passes on to the `orchestrate sweep` it runs."""


def forwarded(args) -> list[str]:
    """The `orchestrate sweep` arguments for the FORWARDED flags the user gave."""
    extra: list[str] = []
    for flag in FORWARDED:
        value = getattr(args, flag.lstrip("-").replace("-", "_"))
        if value is True:
            extra.append(flag)
        elif value is not None and value is not False and value != "":
            extra += [flag, f"{value:g}" if isinstance(value, float) else str(value)]
    return extra


def cmd_submit(args) -> int:
    from orchestrator.fleet import submit as jobs
    from orchestrator.spec.sweep import SpecError
    from store.storage import redact

    try:
        sub = jobs.prepare(args.sweep, args.out, forwarded(args))
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
