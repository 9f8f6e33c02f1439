"""Deprecated: the serving API is `compiler.serving` (`from compiler.serving import compile_tuned`).

This module only re-exports its names, for serving code written before the package existed, and
warns once, as it is imported (`DeprecationWarning`)."""

from __future__ import annotations

import warnings

from compiler import serving
from compiler.serving import *  # noqa: F403  (every name of its __all__, each imported on first use there)

__all__ = list(serving.__all__)


def __getattr__(name: str):
    """A deprecated name of `compiler.serving` (it warns there), as that package gives it."""
    return getattr(serving, name)


warnings.warn(
    "compiler.apply is deprecated: import compile_tuned and the serving API from compiler.serving",
    DeprecationWarning,
    stacklevel=2,
)
