"""A benchmark script (benchmarks/NAME.py) as a module, for tests of its functions."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def load_benchmark(name: str) -> ModuleType:
    """benchmarks/NAME.py as a module; the scripts import their neighbours from beside them, so
    that folder is on the path while it loads."""
    key = f"benchmark_{name}"  # registered, as a dataclass's module must be while it is made
    if key in sys.modules:
        return sys.modules[key]
    sys.path.insert(0, str(BENCHMARKS))
    try:
        spec = importlib.util.spec_from_file_location(key, BENCHMARKS / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[key] = module
        try:
            spec.loader.exec_module(module)
        except BaseException:
            del sys.modules[key]
            raise
    finally:
        sys.path.remove(str(BENCHMARKS))
    return module
