"""benchmarks/bundle.py's warning when fresh processes would compile torch from source: a Python
that neither has nor writes bytecode (the H200 device image) inflates every timed first call."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"
CODE = (
    f"import sys; sys.path.insert(0, {str(BENCH)!r}); import bundle; print(bundle.bytecode_note() or 'none')"
)


def note(tmp_path: Path, **env: str) -> str:
    base = {
        k: v for k, v in os.environ.items() if k not in ("PYTHONDONTWRITEBYTECODE", "PYTHONPYCACHEPREFIX")
    }
    proc = subprocess.run([sys.executable, "-c", CODE], env={**base, **env}, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout.strip()


def test_no_bytecode_and_none_written_is_named(tmp_path):
    empty = str(tmp_path / "pyc")  # a bytecode tree with nothing in it: nothing cached for torch
    said = note(tmp_path, PYTHONDONTWRITEBYTECODE="1", PYTHONPYCACHEPREFIX=empty)
    assert said.startswith("note: no bytecode cache for torch here and PYTHONDONTWRITEBYTECODE is set")
    assert note(tmp_path, PYTHONPYCACHEPREFIX=empty) == "none"  # it writes them: only the first pays
    assert note(tmp_path, PYTHONDONTWRITEBYTECODE="1") == "none"  # pip wrote torch's at install
