"""A preset compiled ahead of time: AOTInductor packages, built at export, loaded by `compile_tuned`.

A compile-cache bundle (`torch.compiler.save_cache_artifacts()`) spares Inductor's code
generation and autotuning, but every process that applies it still traces the model with Dynamo,
builds guards and loads (or, with freezing, re-runs) AOTAutograd: on an H200 that left 3.3 s of a
12.4 s cold start (`docs/results/h200-tune.md`). An AOTInductor package is the preset's compiled
graph as a shared library: `torch.export` then `torch._inductor.aoti_compile_and_package` with the
preset's Inductor options, for one input signature (the preset's batch size). Loading it skips
Dynamo, AOTAutograd and Inductor altogether.

The package holds no weights (`aot_inductor.package_constants_in_so=False`): the process that
applies it loads the caller's own parameters and buffers into it by name, and any folding of
weights the preset does (freezing: BatchNorm into convolutions, pre-transposed linears) runs
from them at load (`aot_inductor.use_runtime_constant_folding=True`), so no value of the
exporting process's random weights is baked in. A preset that runs under CUDA graphs (its mode's
or its options' `triton.cudagraphs`) is replayed from one graph captured around the package at
load, as `mode="reduce-overhead"` replays its own: the returned outputs are overwritten by the
next call.

`compiler.serving.packaged.PackagedModel` serves a loaded package's input signature and hands
any other to a fallback (the preset through `torch.compile`, built on first need).

The package's library links the shared C++ runtime (`runtime_link_options`): the H200 image's
compiler (`CXX=/opt/gcc/bin/g++`, GCC 13.3) has only a static libstdc++, and every package it
linked, CPU and CUDA alike, killed the loading process with SIGSEGV inside the library's own
`std::regex` code (`torch::aot_inductor::parse_device_str`, run by the model's constructor): two
copies of libstdc++'s locale machinery in one process. Linked against the libstdc++ torch runs,
the same packages load there.
A package is still only shipped if a fresh interpreter on the exporting node loaded it
(`probe_load`): a serving process must never meet a loader crash. Where one does not load, the
export keeps the bundle and records why the preset has no package.

This module imports neither Ray nor the orchestrator package.
"""

from __future__ import annotations

import time
import warnings
from pathlib import Path
from typing import Any

from compiler import durable
from compiler.config import CompileConfig

PACKAGE_OPTIONS = {
    "aot_inductor.package_constants_in_so": False,
    "aot_inductor.use_runtime_constant_folding": True,
}
"""Inductor options every package is built with: no weights inside, weight folding at load."""


def packageable(config: CompileConfig) -> str:
    """Why `config` cannot be built as a package, or "" when it can."""
    if config.backend != "inductor":
        return f"backend {config.backend!r} (packages are Inductor's)"
    if config.dynamic:
        return "dynamic=True (a package serves one input signature)"
    return ""


def package_options(config: CompileConfig) -> tuple[dict[str, Any], bool]:
    """(Inductor options for `aoti_compile_and_package`, whether the preset runs under CUDA
    graphs): the preset's mode expanded to its options (`torch._inductor.list_mode_options`), its
    own options over them, and `PACKAGE_OPTIONS`. CUDA graphs are not an AOTInductor option:
    `compiler.serving.packaged.PackagedModel` captures one around the package instead.

    Freezing is always off in a package, whatever the preset (and the process-wide setting the
    exporting job runs under) says: it folds the weights at compile time into new constants
    (`_frozen_param*`, BatchNorm folded into convolutions), computed from the exporting process's
    values, which the caller's weights could not replace. The package folds what depends on
    weights alone at load instead (`use_runtime_constant_folding`); `benchmarks/bundle.py`
    measures its latency against the preset's."""
    from compiler.config import inductor_modes

    options: dict[str, Any] = {}
    if config.mode:
        options.update(inductor_modes().get(config.mode, {}))
    options.update(config.options or {})
    cudagraphs = bool(options.pop("triton.cudagraphs", False))
    options["freezing"] = False
    options.update(PACKAGE_OPTIONS)
    return options, cudagraphs


def split_inputs(example_inputs: Any) -> tuple[tuple, dict]:
    """(args, kwargs) of a call with `example_inputs` (a dict of keyword arguments, a tuple or list
    of positional ones, or one tensor), as `compiler.serving.apply` calls models."""
    if isinstance(example_inputs, dict):
        return (), dict(example_inputs)
    if isinstance(example_inputs, (list, tuple)):
        return tuple(example_inputs), {}
    return (example_inputs,), {}


def tensors(tree: Any) -> list[Any]:
    """The tensors of a pytree (a call's (args, kwargs), a model's output), in flattening order."""
    import torch
    import torch.utils._pytree as pytree

    return [t for t in pytree.tree_leaves(tree) if isinstance(t, torch.Tensor)]


def describe(flat: list[Any]) -> list[list[Any]]:
    """[[shape, dtype, device type], ...] of flattened tensors (JSON-able): a package's signature."""
    return [[list(t.shape), str(t.dtype).removeprefix("torch."), t.device.type] for t in flat]


def signature(args: tuple, kwargs: dict, batch: int | None = None) -> list[list[Any]]:
    """The signature of a call: its tensors, flattened, described; with `batch`, the batch dimension
    (dimension 0 of each tensor with `batch` rows) is None: a package built for a batch range."""
    described = describe(tensors((args, kwargs)))
    if batch is not None:
        for shape, _, _ in described:
            if shape and shape[0] == batch:
                shape[0] = None
    return described


def fits(signature_: list[list[Any]], flat: list[Any], batch: tuple[int, int] | None) -> bool:
    """Whether the flattened tensors `flat` are a call a package of `signature_` serves: the same
    signature, a batch dimension (None) of any size within `batch` (low, high)."""
    got = describe(flat)
    if batch is None or len(got) != len(signature_):
        return got == signature_
    for (want_shape, *want), (shape, *rest) in zip(signature_, got, strict=True):
        if want != rest or len(want_shape) != len(shape):
            return False
        if want_shape and want_shape[0] is None:
            if not batch[0] <= shape[0] <= batch[1]:
                return False
            want_shape, shape = want_shape[1:], shape[1:]
        if want_shape != shape:
            return False
    return True


def scramble_weights(model: Any, seed: int = 0) -> None:
    """Give every floating-point parameter and buffer distinct random values in [0.5, 1.5) (in
    place): a package built from weights of one value (BatchNorm's ones and zeros at init) could
    have folded them; its constants must stay the caller's to fill."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for t in [*model.parameters(), *model.buffers()]:
            if t.is_floating_point():
                t.copy_(torch.rand(t.shape, generator=gen, dtype=torch.float32).to(t) + 0.5)


def build_package(
    model: Any, example_inputs: Any, config: CompileConfig, path: Path, batch: tuple[int, int] | None = None
) -> dict[str, Any]:
    """Export `model` at `example_inputs` and compile it with `config` into the AOTInductor
    package `path` (written whole, and only once a fresh process loaded it: `probe_load`; else
    PackageError); return `package_export_s`, `package_compile_s`, `package_probe_s`,
    `package_bytes`, `package_inputs` (the signature it serves) and `package_cudagraphs`. The
    process's precision policy must already be set. Scrambles the model's weights.

    With `batch` (low, high), the batch dimension is a `torch.export.Dim` over that range: one
    package serves every batch size in it (`package_batch`; a serving plan's dynamic graph). The
    example's batch must be at least 2 (export specializes a size of 1)."""

    import torch

    from compiler.serving.padding import batch_size

    why = packageable(config)
    if why:
        raise ValueError(f"no package for config {config.name!r}: {why}")
    options, cudagraphs = package_options(config)
    options.update(runtime_link_options())
    args, kwargs = split_inputs(example_inputs)
    # a CUDA graph is captured around the package only on CUDA: a CPU reduce-overhead preset's
    # package runs plainly (marked for CUDA graphs, it failed to serve on a CPU-only torch)
    cudagraphs = cudagraphs and any(t.device.type == "cuda" for t in tensors((args, kwargs)))
    if cudagraphs and hasattr(torch._inductor.config.aot_inductor, "compile_wrapper_opt_level"):
        # a CUDA graph replays the kernels, not the wrapper that launched them at capture: its
        # C++ need not be optimized (ResNet-50 bf16 on an H200: 42 s to build against 64 s)
        options["aot_inductor.compile_wrapper_opt_level"] = "O0"
    scramble_weights(model)
    rows = batch_size(args, kwargs) if batch is not None else None
    dynamic_shapes = None
    if batch is not None:
        dim = torch.export.Dim("batch", min=batch[0], max=batch[1])
        shapes = torch.export.ShapesCollection()
        for t in tensors((args, kwargs)):
            if t.dim() and t.shape[0] == rows:
                shapes[t] = {0: dim}
        dynamic_shapes = shapes.dynamic_shapes(model, args, kwargs)
    t0 = time.perf_counter()
    with torch.no_grad():
        program = torch.export.export(model, args, kwargs, dynamic_shapes=dynamic_shapes, strict=False)
    t1 = time.perf_counter()
    path = Path(path)
    with durable.atomic_path(path, suffix=".pt2") as tmp:  # (torch wants the .pt2 suffix)
        with torch.no_grad():
            torch._inductor.aoti_compile_and_package(program, package_path=str(tmp), inductor_configs=options)
        t2 = time.perf_counter()
        why = probe_load(tmp)
        if why:
            raise PackageError(why)  # (the temporary file is removed)
    return {
        "package_export_s": t1 - t0,
        "package_compile_s": t2 - t1,
        "package_probe_s": time.perf_counter() - t2,
        "package_bytes": path.stat().st_size,
        "package_inputs": signature(args, kwargs, rows),
        "package_cudagraphs": cudagraphs,
        **({"package_batch": list(batch)} if batch is not None else {}),
    }


RUNTIME_CXX = """#!/bin/sh
# Written by compile-orchestrator's compiler/aoti.py: {real} has no shared libstdc++ and would
# link the C++ runtime statically into an AOTInductor package's library; this links shared
# libraries against the one processes running torch use ({runtime}) instead.
for arg in "$@"; do
  if [ "$arg" = "-shared" ]; then exec '{real}' "$@" '{runtime}'; fi
done
exec '{real}' "$@"
"""


def process_libstdcxx() -> str:
    """The path of the libstdc++ this process has mapped (torch's C++ runtime), or ""."""
    try:
        with open("/proc/self/maps") as maps:
            found = sorted({line.split()[-1] for line in maps if "/libstdc++.so" in line})
    except OSError:
        return ""
    return found[0] if found else ""


def links_shared_runtime(cxx: str) -> bool:
    """Whether the C++ compiler `cxx` finds a shared libstdc++ to link against (`g++
    -print-file-name` answers a bare name when it has none, and then links the static archive)."""
    import subprocess

    try:
        found = subprocess.run(
            [cxx, "-print-file-name=libstdc++.so"], capture_output=True, text=True, timeout=60
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return True  # not a compiler that answers: leave it as it is
    return Path(found).is_absolute() and Path(found).exists()


def runtime_link_options(cxx: str | None = None) -> dict[str, Any]:
    """Inductor options under which a package's library links the shared C++ runtime this process
    uses: {} when the compiler Inductor picks (or `cxx`) does so anyway; else `cpp.cxx` set to a
    small script (in Inductor's cache directory, named as the compiler so Inductor still
    recognises gcc or clang) that adds this process's libstdc++ to link commands.

    A library with a static copy of libstdc++, loaded into a process that already runs the shared
    one (every torch process), mixes two copies of the locale machinery: its `std::regex` code
    (which AOTInductor's model constructor runs) then reads a facet that is not there, and the
    process dies (SIGSEGV on the H200 image, `std::bad_cast` on GCC 12; the fast tier reproduces
    it). The H200 image's compiler (`CXX=/opt/gcc/bin/g++`) ships only the static archive.

    Inductor's compiler and cache directory come through `compiler.torch_private` (`AOTI_BUILD`):
    on a torch they were not checked on this warns and returns {}, as on any other error."""
    import hashlib
    import shutil
    import sys

    if not sys.platform.startswith("linux"):
        return {}
    from compiler import torch_private

    try:
        real = shutil.which(cxx or torch_private.inductor_cpp_compiler())
        runtime = process_libstdcxx()
        if not real or not runtime or "'" in real + runtime or links_shared_runtime(real):
            return {}
        root = Path(torch_private.inductor_cache_dir())
    except torch_private.TorchPrivateError as exc:
        warnings.warn(
            f"the package links libstdc++ as Inductor links it: {exc}", RuntimeWarning, stacklevel=2
        )
        return {}
    except Exception:  # no C++ compiler: AOTInductor will say so itself
        return {}
    text = RUNTIME_CXX.format(real=real, runtime=runtime)
    digest = hashlib.sha256(text.encode()).hexdigest()[:16]
    script = root / "aoti-runtime" / digest / Path(real).name
    if not script.exists() or script.read_text() != text:
        script.parent.mkdir(parents=True, exist_ok=True)
        with durable.atomic_path(script) as tmp:
            tmp.write_text(text)
            tmp.chmod(0o755)
    return {"cpp.cxx": (None, str(script))}


class PackageError(RuntimeError):
    """A package that cannot serve this model (its weights do not fit it, its outputs differ), or
    that a fresh process could not load."""


ISA_RANK = {"": 0, "DEFAULT": 0, "NO AVX": 0, "AVX2": 1, "AVX512": 2}
"""x86 vector ISAs by what they include (an AVX512 CPU runs AVX2 code, not the other way)."""


def isa_mismatch(built: str, here: str) -> str:
    """Why code built for the CPU vector ISA `built` may not run on a CPU reporting `here`
    (`torch.backends.cpu.get_cpu_capability()`), or ""."""
    built, here = built.upper(), here.upper()
    if built in ISA_RANK and here in ISA_RANK and ISA_RANK[built] > ISA_RANK[here]:
        return f"the package was built for CPU vector ISA {built}; this CPU reports {here}"
    return ""


def load_runner(path: Path, device_check: bool | None = None, single_threaded: bool = False) -> Any:
    """The AOTInductor package at `path`, loaded (torch's `AOTICompiledModel`); `single_threaded`
    for a runner a CUDA graph will capture (see `compiler.serving.packaged.PackagedModel.capture`).

    `torch._inductor.aoti_load_package` first collects this machine's device information to log
    a warning when it differs from the package's, and that runs the C++ compiler's ISA probe:
    per vector ISA a compile and a `python -c "import torch ..."`, 35-57 s in a fresh process
    on the H200 image, for a CUDA package whose GPU code never asks for it. So a CUDA package
    (`device_check` None: every package but a CPU one) is loaded by the same loader without that
    probe, its CPU ISA compared with what this CPU reports instead (`isa_mismatch`: a warning, as
    torch's). A CPU package goes through `aoti_load_package`: its CPU code needs the probe.
    The loader and the package's metadata are private torch APIs (`compiler.torch_private`): on
    a torch they were not checked on this raises `TorchPrivateError`."""
    import torch

    from compiler import torch_private

    metadata = torch_private.aoti_package_metadata(str(path))
    if device_check is None:
        device_check = metadata.get("AOTI_DEVICE_KEY") == "cpu"
    if device_check:
        return torch._inductor.aoti_load_package(str(path), run_single_threaded=single_threaded)
    why = isa_mismatch(metadata.get("AOTI_CPU_ISA", ""), torch.backends.cpu.get_cpu_capability())
    if why:
        warnings.warn(f"{path}: {why}; loading it may crash", RuntimeWarning, stacklevel=2)
    return torch_private.aoti_package_runner(str(path), single_threaded)


PROBE = "import sys; from compiler.aoti import load_runner; load_runner(sys.argv[1]).get_constant_fqns()"
LOADER_CRASHED = "killed a fresh process"
"""In `probe_load`'s answer when the loader crashed the process: the stack cannot load packages."""


def probe_load(path: Path, timeout_s: float = 300.0, code: str = PROBE) -> str:
    """Load the package at `path` in a fresh interpreter (running `code` with `path` as its
    argument); "" when it loaded, else why not (the loader raising, the process killed by a
    signal, a timeout)."""
    import os
    import signal
    import subprocess
    import sys

    from compiler.env import project_pythonpath

    env = {**os.environ, "PYTHONPATH": project_pythonpath(os.environ.get("PYTHONPATH"))}  # `code` imports us
    try:
        proc = subprocess.run(
            [sys.executable, "-c", code, str(path)],
            capture_output=True,
            text=True,
            timeout=timeout_s,
            env=env,
        )
    except subprocess.TimeoutExpired:
        return f"loading it in a fresh process did not finish in {timeout_s:.0f} s"
    if proc.returncode == 0:
        return ""
    if proc.returncode < 0:
        name = signal.Signals(-proc.returncode).name
        return f"loading it {LOADER_CRASHED} ({name}): the AOTInductor loader crashes on this stack"
    said = [x for x in proc.stderr.strip().splitlines() if x.strip()]
    return f"loading it in a fresh process failed: {said[-1][:300] if said else f'exit {proc.returncode}'}"
