"""What a sweep checks before Ray starts, once, for the CLI and the Python API alike
(`check_before_ray`): the cluster and cache addresses answer and the output and history locations
can be used (`preflight`), every history location is an output, and for a private local Ray the
scratch directory can be made and the plan on this machine's classes plans (`plan_here`). The CLI
runs it where its errors belong and hands `run_sweep` what it found; a caller that does not (a
notebook, a benchmark) gets it inside `run_sweep`, after the checks the CLI's flag types make
(`check_inputs`)."""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from compiler.cache_access import CacheAccess
from orchestrator.fleet.address import check_ray_address
from orchestrator.fleet.cache import CacheLive, check_access, named_access
from orchestrator.fleet.inventory import HardwareClass, local_classes
from orchestrator.fleet.options import OptionsError, SweepOptions, check_options
from orchestrator.spec.sweep import SweepSpec
from store.schema import results_path
from store.storage import Location, check_own_output, check_writable, checked


@dataclass(frozen=True)
class Checked:
    """What `preflight` found usable, for `run_sweep` to trust rather than check again."""

    out: Location
    history: list[Location]
    cache: CacheAccess | CacheLive | None = None
    """The named shared-cache server (`opts.cache_redis`) with its credentials, checked; a tune's
    running cache as it was handed over; None for none or a private one."""


def preflight(opts: SweepOptions) -> Checked:
    """The checks a sweep (`opts`: its SweepOptions) makes before Ray starts: a dead `opts.address` raises
    `AddressError`, a dead `opts.cache_redis` (with `shared_cache`; resolved here to its
    `CacheAccess` and checked, once) `cache.CacheAddressError`, an
    output that cannot be written or is no orchestrate output (`/`, a home directory) and a history
    location that cannot be read `storage.StorageError`. The CLI runs it where its errors belong;
    `run_sweep` runs it unless it is given what it found."""
    check_ray_address(opts.address)  # seconds, not Ray's minute of retries
    cache = opts.cache_redis if opts.shared_cache else None
    if cache is not None and not isinstance(cache, CacheLive):
        cache = check_access(named_access(cache) if isinstance(cache, str) else cache)
    out = checked(opts.out_dir)
    check_own_output(out)
    check_writable(out)
    return Checked(out, [checked(h) for h in opts.history_dirs], cache)


def check_inputs(spec: Any, opts: Any, plan: Callable[[dict[str, HardwareClass]], Any]) -> Checked:
    """For a caller of `run_sweep` without the CLI (a notebook), what the CLI's flag types check,
    then what it checks itself: `spec` a `SweepSpec` and `opts` `SweepOptions` (`TypeError`), each
    option's value (`OptionsError`), then `check_before_ray`."""
    if not isinstance(spec, SweepSpec):
        raise TypeError(
            f"expected a SweepSpec, got {type(spec).__name__}: make one with load_spec(PATH or dict)"
        )
    check_options(opts)
    return check_before_ray(opts, plan)


def check_before_ray(
    opts: SweepOptions,
    plan: Callable[[dict[str, HardwareClass]], Any],
    history: str = "history_dirs:",
    scratch: str = "scratch_root",
) -> Checked:
    """What a sweep checks before Ray starts, in this order, for the CLI and `check_inputs` alike
    (`history` and `scratch` name those locations in the errors as the caller gave them: the CLI's
    flags, or the fields of `SweepOptions`): `preflight`, every history location an output
    (`OptionsError`), then, unless this process started a Ray already, `plan_here`."""
    ready = preflight(opts)
    if problem := history_problem(ready, history):
        raise OptionsError(problem)
    ray_started = "ray" in sys.modules and sys.modules["ray"].is_initialized()  # run_sweep keeps it
    if ray_started:
        return ready  # run_sweep plans on the classes of that Ray, not this machine's
    plan_here(opts.address, opts.scratch_root, opts.cpus_per_job, plan, scratch)
    return ready


def plan_here(
    address: str | None,
    scratch_root: Any,
    cpus_per_job: int | None,
    plan: Callable[[dict[str, HardwareClass]], Any],
    scratch: str = "scratch_root",
) -> None:
    """For a private local Ray (no `address`, or `local`): the scratch directory can be made
    (`OptionsError`, naming it as `scratch`), and `plan` on this machine's classes plans (its
    `MissingHardwareError`, `NoJobMatches`), so a typo costs no Ray start. Nothing for a cluster:
    its classes are known once it is reached."""
    if address not in (None, "local"):
        return
    if problem := scratch_problem(scratch_root, scratch):
        raise OptionsError(problem)
    plan(local_classes(cpus_per_job))


def history_problem(ready: Checked, name: str) -> str | None:
    """The error line for the first history location that is no output directory (it has no
    results/), `name` saying how the caller gave them; None where every one is an output."""
    earlier = next((h for h in ready.history if not results_path(h).is_dir()), None)
    return None if earlier is None else f"{name} {earlier}: not an output directory (it has no results/)"


def scratch_problem(path: Any, name: str = "--scratch") -> str | None:
    """The error line for a scratch directory (`name`: how the caller gave it) under which this
    machine's jobs cannot make their scratch directories (a file, a read-only mount, /proc),
    checked by making and removing one there; None where they can. (A cluster's nodes each make
    it for themselves.)"""
    if not path:
        return None
    import contextlib
    import os
    import tempfile
    from pathlib import Path

    where = Path(path).expanduser().absolute()
    made = [p for p in [where, *where.parents] if not p.exists() and not p.is_symlink()]
    try:
        where.mkdir(parents=True, exist_ok=True)
        os.rmdir(tempfile.mkdtemp(prefix=".scratch-probe-", dir=where))
    except OSError as exc:
        why = exc.strerror or str(exc)
        return f"{name} {path}: no directory can be made there ({why}); name a writable directory"
    finally:  # leave nothing behind: the jobs make it again, on their nodes
        for p in made:
            with contextlib.suppress(OSError):
                p.rmdir()
    return None
