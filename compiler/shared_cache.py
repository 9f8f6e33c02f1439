"""Inductor's compile and autotune work shared between job processes through a Redis server.

A job that the driver gives a Redis address (`orchestrate tune` by default, `sweep --shared-cache`)
runs with Inductor's own remote caches on (`cache_environment`): the FX graph cache
(`RemoteFxGraphCache`) and the Triton kernel autotune cache (`RemoteAutotuneCache`). Torch keeps
GEMM/convolution autotune timings (max-autotune's `select_algorithm`) in a local JSON file only
(`codecache.PersistentCache`), so `install` bridges that file through the same server: it fills
the file from Redis before the compile and pushes every entry Inductor writes as soon as it is
written, so a job killed mid-autotune has already shared what it benchmarked.

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
import inspect
import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from compiler import durable

SHARED_CACHE_ENV = "CO_SHARED_CACHE"
"""HOST:PORT of the Redis server a job shares its compile work through (set by the runner)."""
CONNECT_TIMEOUT_S = 3.0
GEMM_KEY = "gemm-autotune"
"""The Redis hash (under the namespace) that holds the GEMM/conv autotune timings."""

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


def cache_environment(env: dict[str, str], address: str | None) -> None:
    """Set a job process's environment (before it imports torch, which reads these once) for
    sharing through the Redis server at `address` (HOST:PORT), or for no remote cache at all."""
    for name in _ON_SWITCHES:
        env[name] = "0"
    for name in _OFF_SWITCHES:
        env.pop(name, None)
    # TORCHINDUCTOR_REDIS_URL wins over HOST/PORT inside torch: never let one leak in
    for name in ("TORCHINDUCTOR_REDIS_URL", "TORCHINDUCTOR_REDIS_HOST", "TORCHINDUCTOR_REDIS_PORT"):
        env.pop(name, None)
    env.pop(SHARED_CACHE_ENV, None)
    if address is None:
        return
    host, _, port = address.rpartition(":")
    for name in _ON_SWITCHES:
        env[name] = "1"
    env.update(TORCHINDUCTOR_REDIS_HOST=host.strip("[]"), TORCHINDUCTOR_REDIS_PORT=port)
    env[SHARED_CACHE_ENV] = address


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
    hash, named by the JSON list of its four keys."""

    client: Any
    key: str
    known: set[str] = field(default_factory=set)
    """Fields already in Redis (filled from it, or pushed by this process)."""
    shared: dict[str, set[str]] = field(default_factory=dict)
    """op -> input keys whose timings came from Redis."""
    hits: int = 0
    misses: int = 0
    pushed: int = 0
    updates: int = 0
    error: str | None = None

    def prefill(self, path: Path, system: Any) -> int:
        """Merge the shared timings into the local file; return how many were shared."""
        entries = self.client.hgetall(self.key)
        local = _read_cache_file(path)
        for raw_field, raw_value in entries.items():
            with contextlib.suppress(ValueError, TypeError):
                op, inputs, precision, choice = json.loads(raw_field)
                local.setdefault(op, {}).setdefault(inputs, {}).setdefault(precision, {})[choice] = (
                    json.loads(raw_value)
                )
                self.known.add(raw_field.decode() if isinstance(raw_field, bytes) else raw_field)
                self.shared.setdefault(op, set()).add(inputs)
        if entries:
            durable.write_text(path, json.dumps({"system": system, "cache": local}, indent=4))
        return len(entries)

    def push(self, cache: dict[str, Any]) -> None:
        """Send the entries of `cache` (the whole local file, as Inductor rewrites it) that Redis
        lacks. A server that stopped answering costs this job its sharing, never its compile."""
        self.updates += 1
        if self.error:
            return
        new = {f: json.dumps(v) for f, v in _leaves(cache) if f not in self.known}
        if not new:
            return
        try:
            self.client.hset(self.key, mapping=new)
        except Exception as exc:  # redis.RedisError, OSError: sharing stops, the job goes on
            self.error = f"{type(exc).__name__}: {exc}"
            return
        self.known.update(new)
        self.pushed += len(new)

    def count_lookup(self, op: Any, inputs: Any, updates_before: int, timings: Any) -> None:
        if self.updates > updates_before:
            self.misses += 1  # it benchmarked
        elif timings and isinstance(inputs, str):
            keys = self.shared.get(op, ())
            if any(k == inputs or k.startswith(f"{inputs}_") for k in keys):
                self.hits += 1


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
    gemm: GemmBridge | None = None
    notes: list[str] = field(default_factory=list)
    _remote_before: dict[str, tuple[int, int]] = field(default_factory=dict)
    _gemm_before: tuple[int, int] = (0, 0)

    def start_counting(self) -> None:
        """Counts from here on (the compile being measured, not a baseline compiled before it)."""
        self._remote_before = _remote_counts()
        if self.gemm is not None:
            self._gemm_before = (self.gemm.hits, self.gemm.misses)

    def columns(self) -> dict[str, Any]:
        """The row's cache columns for the compile since `start_counting` (FX graph counts are
        `compiler.capture.fxgraph_cache_counts`, read by the caller)."""
        cols: dict[str, Any] = {"compile_cache": self.mode, "cache_namespace": self.namespace}
        if self.mode == "shared":
            now = _remote_counts()
            hit, miss = (
                sum(now.get(n, (0, 0))[i] - self._remote_before.get(n, (0, 0))[i] for n in _AUTOTUNE_CACHES)
                for i in (0, 1)
            )
            cols.update(autotune_cache_hits=hit, autotune_cache_misses=miss)
        if self.gemm is not None:
            cols.update(
                gemm_cache_hits=self.gemm.hits - self._gemm_before[0],
                gemm_cache_misses=self.gemm.misses - self._gemm_before[1],
                gemm_cache_shared=self.gemm.pushed,
            )
            if self.gemm.error:
                self.note(f"shared cache: GEMM autotune results stopped being shared: {self.gemm.error}")
        return cols

    def note(self, text: str) -> None:
        if text not in self.notes:
            self.notes.append(text)


_AUTOTUNE_CACHES = ("RemoteAutotuneCache",)


def _remote_counts() -> dict[str, tuple[int, int]]:
    """(hits, misses) per remote cache class from torch's own tally (`remote_cache.cache_stats`)."""
    try:
        from torch._inductor.remote_cache import cache_stats

        return {name: (int(s.hit), int(s.miss)) for name, s in dict(cache_stats._stats).items()}
    except Exception:  # another torch layout: no counts rather than no job
        return {}


def install(hardware: str, environ: dict[str, str] | None = None) -> SharedCache:
    """Set this process up for the shared cache its runner asked for (`SHARED_CACHE_ENV`): check
    the server answers, namespace Inductor's Redis keys, bridge the GEMM autotune file. Call once,
    after torch's Inductor is imported and before the first compile."""
    environ = os.environ if environ is None else environ
    address = environ.get(SHARED_CACHE_ENV)
    if not address:
        return SharedCache()
    shared = SharedCache(mode="unavailable", address=address)
    client, why = _connect(address)
    if client is None:
        _remote_off()
        shared.note(f"shared cache at {address} not used: {why}; compiled without it")
        return shared
    from compiler.hardware import software_stack

    shared.namespace = namespace(hardware, software_stack())
    why = _namespace_inductor_keys(client, shared.namespace)
    if why:
        _remote_off()
        shared.note(f"shared cache at {address} not used: {why}")
        return shared
    shared.mode = "shared"
    why = _bridge_gemm_autotune(client, shared)
    if why:
        shared.note(f"shared cache: GEMM/conv autotune results not shared ({why})")
    return shared


def _connect(address: str) -> tuple[Any, str | None]:
    try:
        import redis
    except ImportError:
        return None, "the `redis` Python package is not installed in the job's environment"
    host, _, port = address.rpartition(":")
    client = redis.Redis(
        host=host.strip("[]"),
        port=int(port),
        socket_connect_timeout=CONNECT_TIMEOUT_S,
        socket_timeout=30.0,
    )
    try:
        client.ping()
    except Exception as exc:  # redis.ConnectionError, TimeoutError, an answer that is not Redis
        return None, f"it does not answer ({type(exc).__name__}: {exc})"
    return client, None


def _remote_off() -> None:
    """Inductor's remote caches off in this process (its config read the switches at import)."""
    from torch._inductor import config

    config.fx_graph_remote_cache = False
    config.autotune_remote_cache = False


def _namespace_inductor_keys(client: Any, prefix: str) -> str | None:
    """Prefix every key of Inductor's Redis caches (`RedisRemoteCache._get_key`, which builds
    `pt2:{cache_id}::{key}:c1`) with `prefix`, and prove it with a probe entry: a torch whose
    caches no longer go through that method would otherwise mix classes and stacks silently."""
    try:
        from torch._inductor import remote_cache
    except ImportError as exc:
        return f"torch._inductor.remote_cache is missing ({exc})"
    cls = getattr(remote_cache, "RedisRemoteCache", None)
    original = getattr(cls, "_get_key", None)
    if cls is None or original is None:
        return "torch's RedisRemoteCache._get_key is gone: keys could not be namespaced per class and stack"
    if not getattr(original, "_co_namespaced", False):

        def get_key(self, key: str) -> str:
            return prefix + original(self, key)

        get_key._co_namespaced = True  # type: ignore[attr-defined]
        cls._get_key = get_key
    probe_id, probe_key = "co-namespace-probe", f"{os.getpid()}"
    try:
        probe = cls(probe_id)
        probe.put(probe_key, {"probe": True})
        found = [k.decode() for k in client.scan_iter(match=f"*{probe_id}*{probe_key}*", count=1000)]
        client.delete(*found) if found else None
    except Exception as exc:
        return f"the namespace probe failed ({type(exc).__name__}: {exc})"
    if not found or not all(k.startswith(prefix) for k in found):
        return f"torch wrote its probe key as {found or 'nothing'}, not under {prefix!r}"
    return None


def _bridge_gemm_autotune(client: Any, shared: SharedCache) -> str | None:
    """Wrap `PersistentCache.update_local_cache` (push) and `.lookup` (count) and fill the local
    file from Redis; the reason it could not, or None."""
    try:
        from torch._inductor import codecache, select_algorithm
    except ImportError as exc:
        return f"torch's codecache or select_algorithm is missing: {exc}"
    persistent = getattr(codecache, "PersistentCache", None)
    selector = getattr(select_algorithm, "AlgorithmSelectorCache", None)
    needed = ("get_local_cache_path", "update_local_cache", "lookup", "get_system")
    if persistent is None or selector is None or not issubclass(selector, persistent):
        return "torch's AlgorithmSelectorCache is no longer a codecache.PersistentCache"
    missing = [name for name in needed if not callable(getattr(persistent, name, None))]
    if missing:
        return f"torch's PersistentCache lacks {', '.join(missing)}"
    bridge = GemmBridge(client, shared.namespace + GEMM_KEY)
    try:
        bridge.prefill(Path(persistent.get_local_cache_path()), persistent.get_system())
    except Exception as exc:
        return f"could not fill the local autotune file from Redis: {type(exc).__name__}: {exc}"
    original_update, original_lookup = persistent.update_local_cache, persistent.lookup
    signature = inspect.signature(original_lookup)

    def update_local_cache(self, local_cache):
        original_update(self, local_cache)
        bridge.push(local_cache)

    def lookup(self, *args, **kwargs):
        before = bridge.updates
        timings = original_lookup(self, *args, **kwargs)
        try:
            bound = signature.bind(self, *args, **kwargs).arguments
        except TypeError:
            return timings
        if bound.get("benchmark") is not None:  # a peek (benchmark=None) would not tune on a miss
            bridge.count_lookup(bound.get("op"), bound.get("inputs"), before, timings)
        return timings

    persistent.update_local_cache = update_local_cache
    persistent.lookup = lookup
    shared.gemm = bridge
    return None
