"""Every private torch API this project calls, one function each, with the torch releases it was
checked on.

torch keeps these out of its public surface (an underscore module, a C binding, a function of
Inductor's internals) and changes them without notice. So the rest of the project reaches them
only through here, and each names the releases (major.minor) on which this project's use of it
was checked: by the CPU test tiers (torch 2.13, the version `constraints.txt` pins) and on GPUs
(torch 2.11 with CUDA 13.0: the H100 kernel choices and the H200 packages of `docs/results/`).
On any other release a call stops with `TorchPrivateError`, which names the API, the releases it
was checked on, this torch, and what to do; so does a checked release that lacks the API (an
odd build). `ORCHESTRATE_UNCHECKED_TORCH=1` lets a call try an unchecked release anyway (an API
it then finds missing or changed still stops with the same message).

What each use costs when it stops:
- `AOTI_LOADER`: `compiler.aoti.load_runner` (AOTInductor packages) raises, so `compile_tuned`
  serves the preset from its bundle instead and the export records `package_error`.
- `AOTI_BUILD`: `compiler.aoti.runtime_link_options` warns and leaves a package's link as
  Inductor makes it (the libstdc++ fix for a compiler with only the static archive is not
  applied), as on any other error there.
- `FEEDBACK_SAVER`: `compiler.kernels.KernelChoiceRecorder` records no kernel choices, and the
  compile goes on; the row's `notes` say why.
- `TEMPLATE_SETTLEMENT`: the recorder records the choices without `emitted` (and
  `fusion_benchmarked`), both null; the row's `notes` say why.
- `TRITON_AUTOTUNERS`: `compiler.kernels.triton_kernel_rows` raises, so a job records no
  `triton_kernels` and its `notes` say why (`workers.bench.compile`).
- `COMPILE_METRICS`: `compiler.capture` gives null for the statistics it cannot read (graphs,
  graph breaks, recompiles, guards, kernels, compile-time breakdown, FX-graph cache counts) and
  the row's `notes` say why, once; the recorder's `from_cache` is null.
- `ACCURACY_SAME`: `compiler.measure.check_against_fp64` raises (the accuracy rule itself cannot
  run), so the job ends `runtime_error` with this module's message as its error.
- `BUNDLE_FORMAT`: `compiler.serving.bundle_check` cannot check a compile-cache bundle's container, so
  `compile_tuned` loads no bundle (a warning, `ExportError` under `strict`) and the preset
  compiles without it: torch's own reader would loop on a container cut short.

- `REMOTE_CACHE`, `COMPILE_WORKERS`, `AUTOTUNE_FILE`: the shared compile cache's hooks, whose
  functions live in `compiler.torch_private_cache`. Without `REMOTE_CACHE` a job compiles without
  the shared cache (`compile_cache = unavailable`, the notes say why); without `COMPILE_WORKERS`
  Inductor's compile workers do not read the shared Triton autotune configs; without
  `AUTOTUNE_FILE` GEMM/conv autotune timings are not shared.

Left outside on purpose: `torch._inductor.config` (the compile knobs every torch.compile user
sets) and Dynamo's user-facing calls (`torch._dynamo.reset`, `torch._dynamo.config`: what every
torch.compile user calls; Dynamo's utilities and metrics above are inside), the CPU ISA probe's cache
(`compiler.isa_probe`, which also asks `cpp_builder` and `cache_dir_utils`: an optimisation its
caller skips on any error), and the hand-run measurement scripts of `benchmarks/` (which name
their exemptions in tests/test_torch_private.py). The attributes of a `CachingAutotuner` (its
`launchers`, `inductor_meta`, `heuristic_type`, ...) are read by `compiler.kernels` through
`getattr` with defaults: a field torch drops reads as null in `triton_kernels`.

This module imports only torch, and that lazily.
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

UNCHECKED_ENV = "ORCHESTRATE_UNCHECKED_TORCH"
"""Set to 1: call the private APIs on a torch release they were not checked on."""

T = TypeVar("T")


class TorchPrivateError(RuntimeError):
    """A private torch API that this torch does not offer as checked; the message says what to do."""


@dataclass(frozen=True)
class PrivateApi:
    name: str
    """Where torch keeps it, as one would import it."""
    checked_on: tuple[str, ...]
    """torch releases (major.minor) on which this project's use of it was checked."""
    used_for: str
    """What the project does with it, and what it loses without it."""


AOTI_LOADER = PrivateApi(
    "torch._C._aoti.AOTIModelPackageLoader and torch.export.pt2_archive._package.AOTICompiledModel",
    ("2.11", "2.13"),
    "loading an AOTInductor package without torch's C++ ISA probe (compiler.aoti.load_runner); "
    "without it compile_tuned serves the preset from its compile-cache bundle",
)
FEEDBACK_SAVER = PrivateApi(
    "torch._inductor.select_algorithm.add_feedback_saver",
    ("2.11", "2.13"),
    "recording every candidate max-autotune timed (compiler.kernels.KernelChoiceRecorder); "
    "without it a job records no kernel choices",
)
TEMPLATE_SETTLEMENT = PrivateApi(
    "torch._inductor.ir.MultiTemplateBuffer.finalize_as_triton_caller(s) and "
    "torch._inductor.scheduler.Scheduler._replace_node",
    ("2.11", "2.13"),
    "learning which candidate of an op Inductor finally emitted after benchmarking epilogue fusion "
    "(compiler.kernels.KernelChoiceRecorder: `emitted`, `fusion_benchmarked`); "
    "without it kernel choices are recorded without them",
)
TRITON_AUTOTUNERS = PrivateApi(
    "torch._inductor.codecache.PyCodeCache and torch._inductor.runtime.triton_heuristics.CachingAutotuner",
    ("2.11", "2.13"),
    "finding the generated Triton kernels and the configs their first run settled on "
    "(compiler.kernels.triton_kernel_rows); without it a job records no triton_kernels",
)
COMPILE_METRICS = PrivateApi(
    "torch._dynamo.utils.counters / get_compilation_metrics / clear_compilation_metrics and "
    "torch._inductor.metrics",
    ("2.11", "2.13"),
    "graph breaks, recompiles, guards, generated kernels, the compile-time breakdown and the "
    "FX-graph cache counts (compiler.capture), and whether autotuning was served from its cache "
    "(compiler.kernels: from_cache); without it those fields are null",
)
ACCURACY_SAME = PrivateApi(
    "torch._dynamo.utils.same",
    ("2.11", "2.13"),
    "the accuracy rule of PyTorch's benchmark harness against an fp64 reference "
    "(compiler.measure.check_against_fp64); without it a job cannot judge its accuracy and ends "
    "with this error",
)
AOTI_BUILD = PrivateApi(
    "torch._inductor.cpp_builder.get_cpp_compiler and torch._inductor.runtime.cache_dir_utils.cache_dir",
    ("2.11", "2.13"),
    "linking an AOTInductor package's library against this process's shared libstdc++ where "
    "Inductor's C++ compiler would link the static one (compiler.aoti.runtime_link_options); "
    "without it packages are linked as Inductor links them",
)
REMOTE_CACHE = PrivateApi(
    "torch._inductor.remote_cache.RedisRemoteCache.backend_override_cls, RemoteCacheBackend and cache_stats",
    ("2.11", "2.13"),
    "routing Inductor's FX-graph and Triton autotune remote caches through the project's own backend "
    "(compiler.torch_private_cache.route_remote_caches: authenticated, sealed entries, short timeouts); "
    "without it a job compiles without the shared cache",
)
COMPILE_WORKERS = PrivateApi(
    "torch._inductor.async_compile._worker_compile_triton",
    ("2.11", "2.13"),
    "having Inductor's compile workers read the shared Triton autotune configs through the same backend "
    "(compiler.torch_private_cache.route_compile_workers); without it they do not read them",
)
AUTOTUNE_FILE = PrivateApi(
    "torch._inductor.codecache.PersistentCache (get_local_cache_path, get_system, update_local_cache, lookup) "
    "and torch._inductor.select_algorithm.AlgorithmSelectorCache",
    ("2.11", "2.13"),
    "sharing max-autotune's GEMM/conv timings through the shared cache (compiler.shared_cache.GemmBridge); "
    "without it they are not shared",
)
BUNDLE_FORMAT = PrivateApi(
    "torch.utils._appending_byte_serializer (_ENCODING_VERSION, CHECKSUM_DIGEST_SIZE) and "
    "torch.compiler._cache (CacheArtifactManager._ensure_cache_artifacts_registered, "
    "CacheArtifactFactory._artifact_types)",
    ("2.11", "2.13"),
    "checking a compile-cache bundle's container before torch's loader reads it "
    "(compiler.serving.bundle_check); without it compile_tuned loads no bundle and the preset compiles without it",
)
APIS = (
    REMOTE_CACHE,
    COMPILE_WORKERS,
    AUTOTUNE_FILE,
    AOTI_LOADER,
    AOTI_BUILD,
    FEEDBACK_SAVER,
    TEMPLATE_SETTLEMENT,
    TRITON_AUTOTUNERS,
    COMPILE_METRICS,
    ACCURACY_SAME,
    BUNDLE_FORMAT,
)


def torch_version() -> str:
    """This process's torch, as it names itself (e.g. "2.13.0+cpu")."""
    import torch

    return str(torch.__version__)


def release(version: str | None = None) -> str:
    """The major.minor of `version` (default: this torch's), e.g. "2.13" for "2.13.0+cpu"."""
    if version is None:
        version = torch_version()
    found = re.match(r"(\d+)\.(\d+)", str(version))
    return f"{found[1]}.{found[2]}" if found else str(version)


def _problem(api: PrivateApi, what: str, try_anyway: bool) -> TorchPrivateError:
    hint = f", or set {UNCHECKED_ENV}=1 to try this one" if try_anyway else ""
    return TorchPrivateError(
        f"{api.name} is a private torch API, checked on torch {', '.join(api.checked_on)}; {what} "
        f"(used for {api.used_for}). Install a checked torch (constraints.txt pins the one CI ran){hint}"
    )


def require(api: PrivateApi, version: str | None = None) -> None:
    """Raise `TorchPrivateError` unless `api` was checked on this torch (or `version`), or
    `UNCHECKED_ENV` is set."""
    if version is None:
        version = torch_version()
    if release(version) in api.checked_on or os.environ.get(UNCHECKED_ENV, "") not in ("", "0"):
        return
    raise _problem(api, f"this is torch {version}, where it was not checked", try_anyway=True)


def use(api: PrivateApi, call: Callable[[], T], version: str | None = None) -> T:
    """`call()`, once `require` passed; a missing or changed API (ImportError, AttributeError,
    TypeError from a changed signature) becomes `TorchPrivateError`."""
    require(api, version)
    try:
        return call()
    except (ImportError, AttributeError, TypeError) as exc:
        what = f"torch {version or torch_version()} lacks it or changed it ({type(exc).__name__}: {exc})"
        raise _problem(api, what, try_anyway=False) from exc


# --- AOTInductor packages ----------------------------------------------------------------------


def aoti_package_metadata(path: str) -> dict[str, str]:
    """The metadata of the AOTInductor package at `path` (`AOTI_DEVICE_KEY`, `AOTI_CPU_ISA`, ...)."""

    def call() -> dict[str, str]:
        import torch

        return dict(torch._C._aoti.AOTIModelPackageLoader.load_metadata_from_package(path, "model"))

    return use(AOTI_LOADER, call)


def aoti_package_runner(path: str, single_threaded: bool) -> Any:
    """The AOTInductor package at `path` loaded by torch's own loader class, as
    `torch._inductor.aoti_load_package` loads it but without its device-information probe
    (an `AOTICompiledModel`: call it as the model)."""

    def call() -> Any:
        import torch
        from torch.export.pt2_archive._package import AOTICompiledModel

        # (path, model name, run single-threaded, number of runners, device index: -1 = current)
        loader = torch._C._aoti.AOTIModelPackageLoader(path, "model", single_threaded, 1, -1)
        return AOTICompiledModel(loader)

    return use(AOTI_LOADER, call)


# --- max-autotune's feedback savers ----------------------------------------------------------------


def add_feedback_saver(saver: Callable[..., None]) -> None:
    """Have Inductor call `saver(timings, name, input_nodes, choices, ...)` after each op it
    autotunes, until `remove_feedback_saver`."""

    def call() -> None:
        from torch._inductor import select_algorithm

        select_algorithm.add_feedback_saver(saver)

    use(FEEDBACK_SAVER, call)


def remove_feedback_saver(saver: Callable[..., None]) -> None:
    """Undo `add_feedback_saver(saver)`: that saver alone where torch keeps a list of them
    (2.11, 2.13), else every saver (an older layout without a way to remove one)."""

    def call() -> None:
        from torch._inductor import select_algorithm

        savers = getattr(select_algorithm.get_algorithm_selector_cache(), "feedback_saver_fns", None)
        if isinstance(savers, list):
            if saver in savers:
                savers.remove(saver)
        else:
            select_algorithm.clear_feedback_savers()

    use(FEEDBACK_SAVER, call)


# --- where Inductor settles a MultiTemplateBuffer ----------------------------------------------------


def watch_template_settlement(
    on_template: Callable[..., None], on_templates: Callable[..., None], on_extern: Callable[..., None]
) -> Callable[[], None]:
    """Have Inductor call, before it settles a `MultiTemplateBuffer` during fusion,
    `on_template(multi, caller, ...)` (`finalize_as_triton_caller`: one template),
    `on_templates(multi, callers, ...)` (`finalize_as_triton_callers`, where torch has it: a
    template per size hint) or `on_extern(scheduler, out_buffer, multi, ...)` (the scheduler's
    `_replace_node`: the extern kernel); return the undo. A watcher that raises is ignored: the
    compile goes on as Inductor would run it."""

    def call() -> list[tuple[Any, str, Any]]:
        from torch._inductor import ir, scheduler

        targets = (
            (ir.MultiTemplateBuffer, "finalize_as_triton_caller", on_template),
            (ir.MultiTemplateBuffer, "finalize_as_triton_callers", on_templates),
            (scheduler.Scheduler, "_replace_node", on_extern),
        )
        found = [(owner, name, note) for owner, name, note in targets if callable(getattr(owner, name, None))]
        names = {name for _, name, _ in found}
        if "_replace_node" not in names or not names & {
            "finalize_as_triton_caller",
            "finalize_as_triton_callers",
        }:
            missing = [name for _, name, _ in targets if name not in names]
            raise AttributeError(f"no {' or '.join(missing)}")
        patches = []
        for owner, name, note in found:
            original = getattr(owner, name)
            patches.append((owner, name, original))
            setattr(owner, name, _noting(note, original))
        return patches

    patches = use(TEMPLATE_SETTLEMENT, call)

    def undo() -> None:
        for owner, name, original in reversed(patches):
            setattr(owner, name, original)
        patches.clear()

    return undo


def _noting(note: Callable[..., None], original: Callable[..., Any]) -> Callable[..., Any]:
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        with contextlib.suppress(Exception):  # a watcher's failure must not fail the compile
            note(*args, **kwargs)
        return original(*args, **kwargs)

    return wrapper


# --- the generated Triton kernels ------------------------------------------------------------------


def loaded_triton_autotuners() -> list[Any]:
    """Every `CachingAutotuner` (one per generated Triton kernel) in the modules Inductor has
    loaded in this process (`PyCodeCache`), once each; [] where Triton kernels cannot exist (a
    build whose Triton heuristics do not import). The autotuners' own attributes are the
    caller's to read (`compiler.kernels.triton_kernel_rows`, through `getattr` with defaults)."""

    def call() -> list[Any]:
        from torch._inductor.codecache import PyCodeCache

        try:
            from torch._inductor.runtime.triton_heuristics import CachingAutotuner
        except Exception:  # no Triton in this build
            return []
        modules = list(PyCodeCache.modules)
        # (a dict of modules loaded without attributes; older releases lack it)
        modules += list((getattr(PyCodeCache, "modules_no_attr", None) or {}).values())
        found: dict[int, Any] = {}
        for module in modules:
            for obj in list(vars(module).values()):
                if isinstance(obj, CachingAutotuner):
                    found.setdefault(id(obj), obj)
        return list(found.values())

    return use(TRITON_AUTOTUNERS, call)


# --- Dynamo's and Inductor's compile metrics -------------------------------------------------------


def dynamo_counters() -> Any:
    """Dynamo's counters (`torch._dynamo.utils.counters`: a dict of `collections.Counter` by
    group, "stats", "graph_break", "inductor", ...), live: they count on as torch compiles."""

    def call() -> Any:
        from torch._dynamo.utils import counters

        return counters

    return use(COMPILE_METRICS, call)


def compilation_metrics() -> list[Any]:
    """Dynamo's record of each frame compiled since the last `clear_compile_metrics` (phase times,
    guards, recompile reasons, why CUDA graphs were skipped): fields read by `getattr`."""

    def call() -> list[Any]:
        from torch._dynamo.utils import get_compilation_metrics

        return list(get_compilation_metrics())

    return use(COMPILE_METRICS, call)


def inductor_kernel_count() -> int:
    """The kernels Inductor generated since the last `clear_compile_metrics`."""

    def call() -> int:
        from torch._inductor import metrics

        return int(metrics.generated_kernel_count)

    return use(COMPILE_METRICS, call)


def clear_compile_metrics() -> None:
    """Clear Dynamo's counters and compilation metrics and Inductor's metrics."""

    def call() -> None:
        from torch._dynamo.utils import clear_compilation_metrics, counters
        from torch._inductor import metrics

        counters.clear()
        clear_compilation_metrics()
        metrics.reset()

    use(COMPILE_METRICS, call)


# --- the benchmark harness's accuracy rule ----------------------------------------------------------


def harness_same() -> Callable[..., bool]:
    """`torch._dynamo.utils.same` (PyTorch's benchmark-harness accuracy rule): a callable taking
    its arguments, whose calls also give `TorchPrivateError` where its signature changed."""

    def load() -> Callable[..., Any]:
        from torch._dynamo.utils import same

        return same

    same = use(ACCURACY_SAME, load)

    def call(*args: Any, **kwargs: Any) -> bool:
        return bool(use(ACCURACY_SAME, lambda: same(*args, **kwargs)))

    return call


# --- what AOTInductor builds with ------------------------------------------------------------------


def inductor_cpp_compiler() -> str:
    """The C++ compiler Inductor builds with (`cpp_builder.get_cpp_compiler`: `CXX`, else what it
    finds)."""

    def call() -> str:
        from torch._inductor.cpp_builder import get_cpp_compiler

        return str(get_cpp_compiler())

    return use(AOTI_BUILD, call)


def inductor_cache_dir() -> str:
    """Inductor's cache directory in this process (`TORCHINDUCTOR_CACHE_DIR`, else its default)."""

    def call() -> str:
        from torch._inductor.runtime.cache_dir_utils import cache_dir

        return str(cache_dir())

    return use(AOTI_BUILD, call)


# --- the compile-cache bundle's container ----------------------------------------------------------


def bundle_format() -> tuple[int, int, frozenset[str]]:
    """What `torch.compiler.save_cache_artifacts` writes here: (the container's format version,
    the size of its leading checksum, the artifact types torch registers and would load)."""

    def call() -> tuple[int, int, frozenset[str]]:
        from torch.compiler._cache import CacheArtifactFactory, CacheArtifactManager
        from torch.utils import _appending_byte_serializer as serializer

        CacheArtifactManager._ensure_cache_artifacts_registered()  # as torch's loader does first
        return (
            int(serializer._ENCODING_VERSION),
            int(serializer.CHECKSUM_DIGEST_SIZE),
            frozenset(CacheArtifactFactory._artifact_types),
        )

    return use(BUNDLE_FORMAT, call)
