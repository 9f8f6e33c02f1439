"""A sweep's options (`SweepOptions`: what the `sweep` command's flags set), and their check for a
caller that builds them itself (a notebook, a script): the CLI's flag types check them there."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from typing import Any

from compiler.cache_access import CacheAccess
from store.storage import Location, Target


@dataclass
class SweepOptions:
    out_dir: Target
    """A local path or a `pyarrow.fs` URI (s3://bucket/prefix, gs://..., file:///...)."""
    address: str | None = None
    """Ray cluster address; None starts a private local cluster for this sweep."""
    resume: bool = False
    """Continue a sweep in an output that already has rows: the jobs with a row are skipped."""
    only: str | None = None
    """Run only the jobs whose name matches (a glob such as '*/bs1/*', or a word; comma-separated)."""
    cpus_per_job: int | None = None
    """Cores each job on a CPU node reserves (default: all cores of the node, one job at a time)."""
    timeout_cap_s: float | None = None
    """Upper bound on every job's time limit (for runs that must end within a window)."""
    allow_missing: bool = False
    """Run the classes that are present when the sweep names some the cluster lacks."""
    max_attempts: int = 3
    """Tries per job when its worker or node dies (a job's own failure is never retried)."""
    history_dirs: list[Target] = field(default_factory=list)
    """Earlier output directories (paths or URIs) whose job times order this sweep (longest
    first); their rows never count as done."""
    scratch_root: str | None = None
    """Where job subprocesses keep their caches and logs (default: the system temp dir)."""
    overlap: bool = True
    """Start a job's later processes ahead, on the node's spare cores, while the one before each
    runs (`workers.ahead`), and the next GPU job's first while the job before it runs
    (`workers.lanes`); False (`--no-overlap`) starts each after the one before it has ended, one
    GPU job per GPU."""
    lock_clocks: bool = False
    """Lock each GPU job's SM clock at its maximum through NVML (root only); rows say if it took."""
    shared_cache: bool = False
    """Jobs compile through Inductor's remote caches on a Redis server shared by the sweep's jobs
    (their compile_s is then not a cold compile; rows say what the cache served). Off by default:
    a sweep measures cold compiles."""
    cache_redis: str | CacheAccess | None = None
    """An existing Redis server for `shared_cache`: its URL or HOST:PORT, as `--cache-redis` takes
    it (the password from `$ORCHESTRATE_CACHE_PASSWORD` or `$ORCHESTRATE_CACHE_PASSWORD_FILE`, the
    secret that seals entries from `$ORCHESTRATE_CACHE_SECRET` or derived from the password), or a
    `compiler.cache_access.CacheAccess`; None starts a private one for the sweep (reachable by
    jobs on this machine only)."""
    argv: list[str] = field(default_factory=list)
    """The command line, recorded in run.json (the CLI's; empty from Python)."""
    resume_command: str | None = None
    """The command an interrupted run prints to resume (default: this sweep with --resume)."""
    deadline: float | None = None
    """`time.monotonic()` at which the run stops as on Ctrl-C (--deadline: a batch job's walltime,
    a spot instance's notice): running jobs cancelled, every finished row kept, exit 130."""


class OptionsError(ValueError):
    """`SweepOptions` a sweep cannot run with; the message names each field and what it takes."""


_FLAGS = ("resume", "allow_missing", "lock_clocks", "shared_cache", "overlap")


def check_options(opts: Any) -> None:
    """`OptionsError` naming every field of `opts` (`SweepOptions`; `TypeError` for anything else)
    whose value the CLI's flags could not have given, all at once; nothing is touched."""
    if not isinstance(opts, SweepOptions):
        raise TypeError(f"expected SweepOptions(out_dir=...), got {type(opts).__name__}")
    problems = [f"{name} {what}, got {value!r:.80}" for name, value, what in _problems(opts)]
    if opts.cache_redis is not None and not opts.shared_cache:
        problems.append("cache_redis names the shared compile cache's server: set shared_cache=True too")
    if len(problems) == 1:
        raise OptionsError(f"SweepOptions: {problems[0]}")
    if problems:
        lines = "".join(f"\n  {p}" for p in problems)
        raise OptionsError(f"{len(problems)} problems in SweepOptions:{lines}")


def _problems(opts: SweepOptions):
    """(field, value, what it must be) for each field whose value is wrong."""
    if not _location(opts.out_dir):
        yield "out_dir", opts.out_dir, "must be a path or a URI"
    if not isinstance(opts.history_dirs, (list, tuple)) or not all(map(_location, opts.history_dirs)):
        yield "history_dirs", opts.history_dirs, "must be a list of paths or URIs"
    if not isinstance(opts.cache_redis, CacheAccess) and not _cache_live(opts.cache_redis):
        value = opts.cache_redis
        if value is not None and not (isinstance(value, str) and value.strip()):
            yield "cache_redis", value, "must be None, a URL or HOST:PORT, or a CacheAccess"
    for name in ("address", "only", "resume_command"):
        value = getattr(opts, name)
        if value is not None and not (isinstance(value, str) and value.strip(", ")):
            yield name, value, "must be None or a non-empty string"
    if opts.scratch_root is not None and not _location(opts.scratch_root, uri=False):
        yield "scratch_root", opts.scratch_root, "must be None or a path"
    for name in _FLAGS:
        if not isinstance(getattr(opts, name), bool):
            yield name, getattr(opts, name), "must be True or False"
    if opts.cpus_per_job is not None and not _whole(opts.cpus_per_job):
        yield "cpus_per_job", opts.cpus_per_job, "must be None or a whole number >= 1"
    if not _whole(opts.max_attempts):
        yield "max_attempts", opts.max_attempts, "must be a whole number >= 1"
    if opts.timeout_cap_s is not None and not _positive(opts.timeout_cap_s):
        yield "timeout_cap_s", opts.timeout_cap_s, "must be None or a positive number of seconds"
    if opts.deadline is not None and not _positive(opts.deadline):
        yield "deadline", opts.deadline, "must be None or a time.monotonic() value"
    if not isinstance(opts.argv, (list, tuple)) or not all(isinstance(a, str) for a in opts.argv):
        yield "argv", opts.argv, "must be a list of strings"


def _cache_live(value: Any) -> bool:
    """A tune's running cache, handed to the sweeps of its rounds (`orchestrator.fleet.cache`)."""
    from orchestrator.fleet.cache import CacheLive

    return isinstance(value, CacheLive)


def _location(value: Any, uri: bool = True) -> bool:
    if uri and isinstance(value, Location):
        return True
    if isinstance(value, os.PathLike):
        value = os.fspath(value)
    return isinstance(value, str) and bool(value.strip())


def _whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def _positive(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and 0 < value < math.inf
