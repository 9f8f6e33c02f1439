"""The serving API: apply an exported preset in a production process. This package is the one
import path production code uses, and the names below are its stable API (docs/production.md):

    from compiler.serving import compile_tuned

    compiled, applied = compile_tuned(model, {"pixel_values": x}, "/opt/presets/H100", model_name="vit")
    print(applied.summary())

`compile_tuned` (`apply.py`, one call's steps in order) compiles a model with the preset that
`orchestrate export` wrote for this hardware class and software stack, and returns it with an
`Applied` (`applied.py`), the record of what it did. Its parts: `choice.py` which preset serves
the model, `settings.py` the process-wide settings a preset sets and checks, `artifacts.py` the
preset's compile-cache bundle and AOTInductor package (`compiler.aoti`, which the export side
builds packages with), `bundle_check.py` a bundle's container checked before torch's loader reads
it, `files.py` the export's files (shapes checked, every path confined to the export, an export at
a URI read through a content-addressed cache) and `signature.py` signed manifests.

Each name is imported on first use, so `import compiler.serving` imports nothing more, and the
export side imports `compiler.serving.files` or `compiler.serving.signature` alone. Nothing in
this package imports outside `compiler/`: no Ray, no `orchestrator`, `workers`, `store` or
`reports` (tests/test_layout.py). `compiler.apply`, the import path before this package, is a
deprecated alias of it.
"""

from __future__ import annotations

import warnings
from importlib import import_module
from typing import TYPE_CHECKING, Any

_EXPORTS = {
    "compile_tuned": "compiler.serving.apply",
    "Applied": "compiler.serving.applied",
    "CastInputs": "compiler.serving.applied",
    "PresetFallbackWarning": "compiler.serving.applied",
    "find_preset": "compiler.serving.choice",
    "RuntimeSettingWarning": "compiler.serving.settings",
    "SettingMismatchWarning": "compiler.serving.settings",
    "CACHE_ENV": "compiler.serving.files",
    "EXPORT_FORMAT": "compiler.serving.files",
    "MANIFEST": "compiler.serving.files",
    "SERVING_FILE": "compiler.serving.files",
    "ExportCacheWarning": "compiler.serving.files",
    "ExportError": "compiler.serving.files",
    "cache_root": "compiler.serving.files",
    "sha256_file": "compiler.serving.files",
    "KEY_ENV": "compiler.serving.signature",
    "SIGNATURE": "compiler.serving.signature",
    "SignatureError": "compiler.serving.signature",
}
"""Public name -> the module that defines it."""

_DEPRECATED = {"PRESETS": "SERVING_FILE"}
"""Deprecated name -> the public name it stands for: still importable, with a `DeprecationWarning`
(`PRESETS` was `serving.json`'s name before the tune's own `presets.json` made it ambiguous)."""

__all__ = [  # the names of `_EXPORTS` (a test checks), written out for linters and editors
    "CACHE_ENV",
    "EXPORT_FORMAT",
    "KEY_ENV",
    "MANIFEST",
    "SERVING_FILE",
    "SIGNATURE",
    "Applied",
    "CastInputs",
    "ExportCacheWarning",
    "ExportError",
    "PresetFallbackWarning",
    "RuntimeSettingWarning",
    "SettingMismatchWarning",
    "SignatureError",
    "cache_root",
    "compile_tuned",
    "find_preset",
    "sha256_file",
]

if TYPE_CHECKING:  # for type checkers and editors; at run time `__getattr__` imports them
    from compiler.serving.applied import Applied, CastInputs, PresetFallbackWarning
    from compiler.serving.apply import compile_tuned
    from compiler.serving.choice import find_preset
    from compiler.serving.files import (
        CACHE_ENV,
        EXPORT_FORMAT,
        MANIFEST,
        SERVING_FILE,
        ExportCacheWarning,
        ExportError,
        cache_root,
        sha256_file,
    )
    from compiler.serving.settings import RuntimeSettingWarning, SettingMismatchWarning
    from compiler.serving.signature import KEY_ENV, SIGNATURE, SignatureError


def __getattr__(name: str) -> Any:
    """A public name, imported from its module on first use (PEP 562); a deprecated one warns."""
    if name in _DEPRECATED:
        warnings.warn(
            f"compiler.serving.{name} is deprecated: use {_DEPRECATED[name]}",
            DeprecationWarning,
            stacklevel=2,
        )
        return __getattr__(_DEPRECATED[name])
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(import_module(module), name)
    globals()[name] = value  # later uses skip this function
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
