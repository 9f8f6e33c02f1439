"""The shared compile cache's hooks into Inductor's internals: the private APIs that
`compiler.torch_private` names `REMOTE_CACHE`, `COMPILE_WORKERS` and `AUTOTUNE_FILE`, each reached
through `torch_private.use` (checked releases only; anything else is `TorchPrivateError`).

- `route_remote_caches(link)`: every Inductor remote cache of this process (the FX-graph cache,
  whose entries are pickles, and the Triton autotune cache) reads and writes through `link`
  (`compiler.cache_link.CacheLink`: authenticated, sealed entries, short timeouts), through
  torch's own hook for a backend of the caller's (`RemoteCache.backend_override_cls`), never
  through torch's Redis backend (no password, no timeouts, entries unpickled unchecked).
- `route_compile_workers(spec)`: Inductor's compile workers (separate processes that load each
  generated Triton kernel, and with it read its shared autotune config) do the same, each with a
  link of its own made from `spec`.
- `watch_autotune_file(on_update, on_lookup)`: max-autotune's GEMM/conv timings, which torch keeps
  in a local file only, reported to the caller as Inductor writes and reads them.

This module imports torch only inside its functions.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from compiler import durable
from compiler.cache_access import CacheAccess
from compiler.cache_link import CacheLink
from compiler.torch_private import AUTOTUNE_FILE, COMPILE_WORKERS, REMOTE_CACHE, use

ROUTED = ("RemoteFxGraphCache", "RemoteAutotuneCache")
"""The remote caches a job turns on (`compiler.shared_cache.cache_environment`); each must take
the project's backend, or the job compiles without the shared cache."""


def route_remote_caches(link: CacheLink) -> None:
    """Make every `RedisRemoteCache` of this process use `link` as its backend, and prove it on
    the caches a job uses (`ROUTED`)."""

    def call() -> None:
        from torch._inductor import remote_cache

        class SharedCacheBackend(remote_cache.RemoteCacheBackend):
            def _get(self, key: str) -> bytes | None:
                return link.get(key)

            def _put(self, key: str, data: Any) -> None:
                if isinstance(data, bytes):
                    link.put(key, data)

        remote_cache.RedisRemoteCache.backend_override_cls = SharedCacheBackend
        for name in ROUTED:
            if not isinstance(getattr(remote_cache, name)("co-probe").backend, SharedCacheBackend):
                raise AttributeError(f"{name} does not take RedisRemoteCache.backend_override_cls")

    use(REMOTE_CACHE, call)


def remote_cache_counts() -> dict[str, tuple[int, int]]:
    """(hits, misses) per remote cache class from torch's own tally (`remote_cache.cache_stats`)."""

    def call() -> dict[str, tuple[int, int]]:
        from torch._inductor.remote_cache import cache_stats

        return {name: (int(s.hit), int(s.miss)) for name, s in dict(cache_stats._stats).items()}

    return use(REMOTE_CACHE, call)


@dataclass(frozen=True)
class WorkerLink:
    """What a compile worker needs to make its own `CacheLink` (sent with each compile task, over
    the pipe Inductor keeps to its workers: never through their environment or command line), and
    where it reports what its link did (`report_dir/<pid>.json`, read by the job process:
    `compiler.shared_cache.SharedCache`)."""

    access: CacheAccess
    namespace: str
    report_dir: str


_worker_link: list[CacheLink] = []
"""The link of this compile worker process, once it routed its caches."""


def compile_in_worker(spec: WorkerLink, load_kernel: Any, extra_env: Any, extra_config: Any) -> Any:
    """Inductor's compile task for one Triton kernel, in a compile worker, with the worker's remote
    caches routed through a link of its own first (once per worker). A worker that cannot route
    them compiles without the shared configs: torch's own Redis backend, which it would fall back
    to, points nowhere in a job's environment (`compiler.shared_cache.cache_environment`)."""
    from torch._inductor.runtime.compile_tasks import _worker_compile_triton

    if not _worker_link:
        link = CacheLink(spec.access, spec.namespace)
        try:
            route_remote_caches(link)
        except Exception as exc:  # TorchPrivateError or a torch that moved: no sharing here
            link.lose(f"this compile worker could not route its caches ({type(exc).__name__})")
        _worker_link.append(link)
    try:
        return _worker_compile_triton(load_kernel, extra_env, extra_config)
    finally:
        _report(spec.report_dir, _worker_link[0])


def _report(report_dir: str, link: CacheLink) -> None:
    """Write what this worker's link did so far to `report_dir/<pid>.json` (replaced whole)."""
    with contextlib.suppress(OSError):  # a report lost costs counts, never the compile
        durable.write_text(Path(report_dir, f"{os.getpid()}.json"), json.dumps(link.counts()))


def route_compile_workers(spec: WorkerLink) -> None:
    """Send every Triton compile task of this process to its compile workers through
    `compile_in_worker`, with `spec` (pickled by reference: the workers import this module)."""

    def call() -> None:
        from torch._inductor import async_compile

        current = async_compile._worker_compile_triton
        if getattr(current, "func", None) is compile_in_worker:
            return
        if not callable(current):
            raise AttributeError("async_compile._worker_compile_triton is not a function")
        async_compile._worker_compile_triton = functools.partial(compile_in_worker, spec)

    use(COMPILE_WORKERS, call)


def watch_autotune_file(
    on_update: Callable[[dict[str, Any]], None],
    on_lookup: Callable[[Any, Any, int, Any], None],
    updates: Callable[[], int],
) -> tuple[Path, Any]:
    """Have max-autotune's GEMM/conv timings file (`codecache.PersistentCache`) call
    `on_update(whole file's cache)` after Inductor writes it and `on_lookup(op, inputs, updates
    before, timings)` after a lookup that would benchmark on a miss (`updates()`: the caller's
    count of writes, to tell a benchmark from a hit); return the file's path and the system key
    its entries are valid for."""

    def call() -> tuple[Path, Any]:
        from torch._inductor import codecache, select_algorithm

        persistent = codecache.PersistentCache
        if not issubclass(select_algorithm.AlgorithmSelectorCache, persistent):
            raise AttributeError("AlgorithmSelectorCache is no longer a codecache.PersistentCache")
        path, system = Path(persistent.get_local_cache_path()), persistent.get_system()
        original_update, original_lookup = persistent.update_local_cache, persistent.lookup
        signature = inspect.signature(original_lookup)

        def update_local_cache(self, local_cache):
            original_update(self, local_cache)
            on_update(local_cache)

        def lookup(self, *args, **kwargs):
            before = updates()
            timings = original_lookup(self, *args, **kwargs)
            try:
                bound = signature.bind(self, *args, **kwargs).arguments
            except TypeError:
                return timings
            if bound.get("benchmark") is not None:  # a peek (benchmark=None) would not tune on a miss
                on_lookup(bound.get("op"), bound.get("inputs"), before, timings)
            return timings

        persistent.update_local_cache = update_local_cache
        persistent.lookup = lookup
        return path, system

    return use(AUTOTUNE_FILE, call)
