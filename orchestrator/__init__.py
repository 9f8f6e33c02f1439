"""The Ray driver side: sweep specs, job matrix, scheduling, result sink, presets and the CLI.

The Python API (docs/python-api.md)::

    from orchestrator import SweepOptions, load_spec, read_results, run_sweep

    spec = load_spec({"name": "demo", "models": [...], "batch_sizes": [1], "configs": {"default": {}}})
    run_sweep(spec, SweepOptions(out_dir="runs/demo"))
    rows = read_results("runs/demo", latest=True)

Each name is imported on first use, so `import orchestrator` imports neither Ray nor torch.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

_EXPORTS = {
    "load_spec": "orchestrator.spec.sweep",
    "SweepSpec": "orchestrator.spec.sweep",
    "SpecError": "orchestrator.spec.sweep",
    "run_sweep": "orchestrator.fleet.driver",
    "SweepSummary": "orchestrator.fleet.driver",
    "SweepInterrupted": "orchestrator.fleet.driver",
    "SweepOptions": "orchestrator.fleet.options",
    "OptionsError": "orchestrator.fleet.options",
    "read_results": "store.schema",
}
"""Public name -> the module that defines it."""

__all__ = [  # the names of `_EXPORTS` (a test checks), written out for linters and editors
    "OptionsError",
    "SpecError",
    "SweepInterrupted",
    "SweepOptions",
    "SweepSpec",
    "SweepSummary",
    "load_spec",
    "read_results",
    "run_sweep",
]

if TYPE_CHECKING:  # for type checkers and editors; at run time `__getattr__` imports them
    from orchestrator.fleet.driver import SweepInterrupted, SweepSummary, run_sweep
    from orchestrator.fleet.options import OptionsError, SweepOptions
    from orchestrator.spec.sweep import SpecError, SweepSpec, load_spec
    from store.schema import read_results


def _version() -> str:
    """The installed distribution's version (pyproject.toml's, as pip recorded it), or
    `0+unknown` where this checkout runs without being installed."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("compile-orchestrator")
    except PackageNotFoundError:
        return "0+unknown"


def __getattr__(name: str) -> Any:
    """A public name, imported from its module on first use (PEP 562); `__version__`, the
    distribution's version."""
    if name == "__version__":
        globals()[name] = _version()
        return globals()[name]
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(import_module(module), name)
    globals()[name] = value  # later uses skip this function
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
