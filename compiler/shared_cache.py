"""Inductor's compile and autotune work shared between job processes through a Redis server.

A job that the driver gives a cache (`orchestrate tune` by default, `sweep --shared-cache`) runs
with Inductor's own remote caches on (`cache_environment`): the FX graph cache
(`RemoteFxGraphCache`) and the Triton kernel autotune cache (`RemoteAutotuneCache`), both routed
through the project's own backend (`compiler.torch_private_cache.route_remote_caches`: one
`compiler.cache_link.CacheLink`, authenticated, every entry sealed and checked before torch
decodes it, short timeouts). Torch keeps GEMM/convolution autotune timings (max-autotune's
`select_algorithm`) in a local JSON file only (`codecache.PersistentCache`), so `install` bridges
that file through the same link: it fills the file from Redis before the compile and pushes every
entry Inductor writes as soon as it is written, so a job killed mid-autotune has already shared
what it benchmarked.

Keys are namespaced per hardware class and software stack (`namespace`): Inductor's FX key holds
the GPU's name on CUDA but nothing that tells two fake classes of a CPU cluster apart, and the
GEMM file's name holds only the device and Triton/CUDA versions. Every key this process writes
starts with `co:<class>:<stack hash>:`.

Runs in the job process only: no Ray, no `orchestrator`. Where torch's internals have moved
(the hook points are missing), the bridge or the whole cache is skipped and the row's notes say
why; a job never fails because of its cache.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from compiler import durable
from compiler.cache_access import CacheAccess, clear_env, from_env
from compiler.cache_link import CacheLink

GEMM_KEY = "gemm-autotune"
"""The Redis hash (under the namespace) that holds the GEMM/conv autotune timings."""
NOWHERE = "unix:///nonexistent/compile-orchestrator/no-server"
"""Where torch's own Redis backend points in a job process: nowhere. The project routes Inductor's
remote caches through its own backend; should one ever be made with torch's (a torch that moved),
it connects to nothing and reads nothing unchecked, rather than torch's default localhost:6379."""

_ON_SWITCHES = ("TORCHINDUCTOR_FX_GRAPH_REMOTE_CACHE", "TORCHINDUCTOR_AUTOTUNE_REMOTE_CACHE")
# Remote caches this project does not use; removed from the job's environment so that a user's
# shell cannot turn them on behind the rows' backs (a cold-compile job must not read any shared
# cache). Removed, not set to 0: their config values are part of Inductor's FX-graph cache key
# (unlike the two switches above), and a bundle made with them False misses in a serving process
# that has them at torch's default, None.
_OFF_SWITCHES = (
    "TORCHINDUCTOR_BUNDLED_AUTOTUNE_REMOTE_CACHE",
    "TORCHINDUCTOR_AUTOGRAD_REMOTE_CACHE",
    "TORCH_DYNAMO_AUTOMATIC_DYNAMIC_REMOTE_PGO",
)

CacheMode = Literal["off", "shared", "unavailable"]
UNAVAILABLE = "shared cache unavailable"
"""How every note of a job that could not use its shared cache starts."""


def cache_environment(env: dict[str, str], access: CacheAccess | None) -> None:
    """Set a job process's environment (before it imports torch, which reads these once) for
    sharing through the cache `access` names, or for no remote cache at all."""
    for name in _ON_SWITCHES:
        env[name] = "0"
    for name in _OFF_SWITCHES:
        env.pop(name, None)
    for name in ("TORCHINDUCTOR_REDIS_HOST", "TORCHINDUCTOR_REDIS_PORT"):
        env.pop(name, None)
    env["TORCHINDUCTOR_REDIS_URL"] = NOWHERE  # wins over HOST/PORT inside torch
    clear_env(env)
    if access is None:
        return
    if access.off is None:
        for name in _ON_SWITCHES:
            env[name] = "1"
    access.to_env(env)


def stack_hash(stack: dict[str, Any]) -> str:
    """A short hash of a software stack (torch, Triton, CUDA, Python, driver versions)."""
    text = json.dumps(stack, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def namespace(hardware: str, stack: dict[str, Any]) -> str:
    """The prefix of every key a job of this hardware class and stack reads and writes."""
    return f"co:{re.sub(r'[^A-Za-z0-9_.-]', '_', hardware)}:{stack_hash(stack)}:"


@dataclass
class GemmBridge:
    """GEMM/conv autotune timings between Inductor's local file and one Redis hash.

    The file is `{op: {inputs: {precision: {choice hash: ms}}}}`; each leaf is one field of the
    hash, named by the JSON list of its four keys, its value sealed for that field."""

    link: CacheLink
    known: set[str] = field(default_factory=set)
    """Fields already in Redis (filled from it, or pushed by this process)."""
    shared: dict[str, set[str]] = field(default_factory=dict)
    """op -> input keys whose timings came from Redis."""
    hits: int = 0
    misses: int = 0
    pushed: int = 0
    updates: int = 0

    def prefill(self, path: Path, system: Any) -> int:
        """Merge the shared timings into the local file; return how many were shared."""
        entries = self.link.hash_items(GEMM_KEY)
        local = _read_cache_file(path)
        merged = 0
        for raw_field, raw_value in entries.items():
            try:
                op, inputs, precision, choice = json.loads(raw_field)
                timing = json.loads(raw_value)
                leaf = local.setdefault(op, {}).setdefault(inputs, {}).setdefault(precision, {})
            except (ValueError, TypeError, AttributeError):
                continue
            leaf[choice] = timing
            self.known.add(raw_field)
            self.shared.setdefault(op, set()).add(inputs)
            merged += 1
        if merged:
            durable.write_text(path, json.dumps({"system": system, "cache": local}, indent=4))
        return merged

    def push(self, cache: dict[str, Any]) -> None:
        """Send the entries of `cache` (the whole local file, as Inductor rewrites it) that Redis
        lacks. A server that stopped answering costs this job its sharing, never its compile."""
        self.updates += 1
        new = {f: json.dumps(v).encode() for f, v in _leaves(cache) if f not in self.known}
        if new and self.link.hash_put(GEMM_KEY, new):
            self.known.update(new)
            self.pushed += len(new)

    def count_lookup(self, op: Any, inputs: Any, updates_before: int, timings: Any) -> None:
        if self.updates > updates_before:
            self.misses += 1  # it benchmarked
        elif timings and isinstance(inputs, str):
            keys = self.shared.get(op, ())
            if any(k == inputs or k.startswith(f"{inputs}_") for k in keys):
                self.hits += 1
                self.link.used()  # shared timings chose this op's kernel


def _read_cache_file(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    cache = data.get("cache") if isinstance(data, dict) else None
    return cache if isinstance(cache, dict) else {}


def _leaves(cache: dict[str, Any]):
    for op, by_inputs in cache.items():
        if not isinstance(by_inputs, dict):
            continue
        for inputs, by_precision in by_inputs.items():
            if not isinstance(by_precision, dict):
                continue
            for precision, by_choice in by_precision.items():
                if not isinstance(by_choice, dict):
                    continue
                for choice, timing in by_choice.items():
                    yield json.dumps([op, inputs, precision, choice]), timing


@dataclass
class SharedCache:
    """What this job process does with the shared cache, and its counts for the row."""

    mode: CacheMode = "off"
    address: str | None = None
    namespace: str | None = None
    link: CacheLink | None = None
    gemm: GemmBridge | None = None
    notes: list[str] = field(default_factory=list)
    workers_dir: str | None = None
    """Where Inductor's compile workers report what their links did (`WorkerLink.report_dir`)."""
    _remote_before: dict[str, tuple[int, int]] = field(default_factory=dict)
    _gemm_before: tuple[int, int] = (0, 0)
    _workers_before: tuple[int, int] = (0, 0)

    def start_counting(self) -> None:
        """Counts from here on (the compile being measured, not a baseline compiled before it)."""
        self._remote_before = _remote_counts()
        if self.gemm is not None:
            self._gemm_before = (self.gemm.hits, self.gemm.misses)
        workers = self.workers()
        self._workers_before = (workers.served, workers.misses)

    def workers(self) -> CacheLink:
        """What the compile workers' links did, summed into one link's counts."""
        total = CacheLink(self.link.access if self.link else CacheAccess(""), self.namespace or "")
        for report in sorted(Path(self.workers_dir).glob("*.json")) if self.workers_dir else ():
            with contextlib.suppress(OSError, ValueError, TypeError, AttributeError):
                total.add(json.loads(report.read_text()))
        return total

    def columns(self) -> dict[str, Any]:
        """The row's cache columns for the compile since `start_counting` (FX graph counts are
        `compiler.capture.fxgraph_cache_counts`, read by the caller)."""
        cols: dict[str, Any] = {"compile_cache": self.mode, "cache_namespace": self.namespace}
        workers = self.workers()
        if self.link is not None:
            rejected = self.link.rejected + workers.rejected
            cols["cache_rejected"] = sum(rejected.values())
            if said := CacheLink(self.link.access, "", rejected=rejected).rejections():
                self.note(f"shared cache: {said}, each read as a miss (compiled)")
            if (down := self.link.down or workers.down) is not None:
                self.mode = cols["compile_cache"] = "unavailable"
                self.note(f"{UNAVAILABLE} from then on ({down}); the job compiled without it")
        if self.mode == "shared":
            now = _remote_counts()
            hit, miss = (
                sum(now.get(n, (0, 0))[i] - self._remote_before.get(n, (0, 0))[i] for n in _AUTOTUNE_CACHES)
                for i in (0, 1)
            )
            # the configs Inductor's compile workers read as they loaded kernels
            hit += workers.served - self._workers_before[0]
            miss += workers.misses - self._workers_before[1]
            cols.update(autotune_cache_hits=hit, autotune_cache_misses=miss)
        if self.gemm is not None:
            cols.update(
                gemm_cache_hits=self.gemm.hits - self._gemm_before[0],
                gemm_cache_misses=self.gemm.misses - self._gemm_before[1],
                gemm_cache_shared=self.gemm.pushed,
            )
        return cols

    def note(self, text: str) -> None:
        if text not in self.notes:
            self.notes.append(text)


_AUTOTUNE_CACHES = ("RemoteAutotuneCache",)


def _remote_counts() -> dict[str, tuple[int, int]]:
    from compiler.torch_private_cache import remote_cache_counts

    try:
        return remote_cache_counts()
    except Exception:  # another torch layout: no counts rather than no job
        return {}


def install(hardware: str, environ: Any = None, on_first_serve: Any = None) -> SharedCache:
    """Set this process up for the shared cache its runner gave it (`compiler.cache_access`, in
    `environ`, whose secret it removes): check the server answers, route Inductor's remote caches
    through one sealed, namespaced link, bridge the GEMM autotune file. Call once, after torch's
    Inductor is imported and before the first compile. `on_first_serve()` is called when the
    cache first hands this process an entry."""
    access = from_env(os.environ if environ is None else environ)
    if access is None:
        return SharedCache()
    shared = SharedCache(mode="unavailable", address=access.url)
    if access.off is not None:
        _remote_off()
        shared.note(f"{UNAVAILABLE}: the driver stopped using it ({access.off}); the job compiled without it")
        return shared
    from compiler.hardware import software_stack

    shared.namespace = namespace(hardware, software_stack())
    link = CacheLink(access, shared.namespace, on_first_serve=on_first_serve)
    why = link.ping() or _route(shared, link)
    if why:
        _remote_off()
        shared.note(f"{UNAVAILABLE}: {access.url}: {why}; the job compiled without it")
        return shared
    shared.mode, shared.link = "shared", link
    why = _bridge_gemm_autotune(shared)
    if why:
        shared.note(f"shared cache: GEMM/conv autotune results not shared ({why})")
    return shared


def _route(shared: SharedCache, link: CacheLink) -> str | None:
    """Route this process's remote caches, and its compile workers', through `link`; why not, or None."""
    from compiler.torch_private_cache import WorkerLink, route_compile_workers, route_remote_caches

    try:
        route_remote_caches(link)
    except Exception as exc:  # TorchPrivateError: an unchecked or changed torch
        return f"Inductor's remote caches could not be routed through the project's backend ({exc})"
    with contextlib.suppress(Exception):  # the workers then read no shared Triton configs; this process does
        root = os.environ.get("TORCHINDUCTOR_CACHE_DIR") or None
        if root:
            Path(root).mkdir(parents=True, exist_ok=True)
        shared.workers_dir = tempfile.mkdtemp(prefix="co-cache-workers-", dir=root)
        route_compile_workers(WorkerLink(link.access, link.namespace, shared.workers_dir))
    return None


def _remote_off() -> None:
    """Inductor's remote caches off in this process (its config read the switches at import)."""
    from torch._inductor import config

    config.fx_graph_remote_cache = False
    config.autotune_remote_cache = False


def _bridge_gemm_autotune(shared: SharedCache) -> str | None:
    """Watch max-autotune's GEMM timings file (push, count) and fill it from Redis; why it could
    not, or None."""
    from compiler.torch_private_cache import watch_autotune_file

    assert shared.link is not None
    bridge = GemmBridge(shared.link)
    try:
        path, system = watch_autotune_file(bridge.push, bridge.count_lookup, lambda: bridge.updates)
        bridge.prefill(path, system)
    except Exception as exc:  # TorchPrivateError, or a file that cannot be written
        return f"{type(exc).__name__}: {exc}"
    shared.gemm = bridge
    return None
