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

What each use costs when it stops: `compiler.aoti.load_runner` (AOTInductor packages) raises,
so `compile_tuned` serves the preset from its bundle instead and the export records
`package_error`; `compiler.kernels.KernelChoiceRecorder` records no kernel choices, and the
compile goes on.

Left outside on purpose: `torch._dynamo` and `torch._inductor.config` (the compile knobs every
torch.compile user sets), the shared cache's hooks into `torch._inductor.remote_cache` and
`codecache` (`compiler.shared_cache`: each already checks what it finds and says in the row's
`notes` what it skipped), and the CPU ISA probe's cache (`compiler.isa_probe`: an optimisation
its caller skips on any error).

This module imports only torch, and that lazily.
"""

from __future__ import annotations

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
APIS = (AOTI_LOADER, FEEDBACK_SAVER)


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
