"""What a sweep checks before Ray starts, once: the cluster and cache addresses answer, and the
output and history locations can be used. The CLI runs `preflight` where its errors belong and
hands `run_sweep` what it found; a caller that does not (a notebook, a benchmark) gets the same
checks inside `run_sweep`."""

from __future__ import annotations

from dataclasses import dataclass

from orchestrator.fleet.address import check_ray_address
from orchestrator.fleet.cache import check_address
from store.storage import Location, check_own_output, check_writable, checked


@dataclass(frozen=True)
class Checked:
    """What `preflight` found usable, for `run_sweep` to trust rather than check again."""

    out: Location
    history: list[Location]


def preflight(opts) -> Checked:
    """The checks a sweep (`opts`: its SweepOptions) makes before Ray starts: a dead `opts.address` raises
    `AddressError`, a dead `opts.cache_redis` (with `shared_cache`) `cache.CacheAddressError`, an
    output that cannot be written or is no orchestrate output (`/`, a home directory) and a history
    location that cannot be read `storage.StorageError`. The CLI runs it where its errors belong;
    `run_sweep` runs it unless it is given what it found."""
    check_ray_address(opts.address)  # seconds, not Ray's minute of retries
    if opts.shared_cache and opts.cache_redis:
        check_address(opts.cache_redis)
    out = checked(opts.out_dir)
    check_own_output(out)
    check_writable(out)
    return Checked(out, [checked(h) for h in opts.history_dirs])
