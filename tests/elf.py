"""Reading shared libraries the way the dynamic loader will: `readelf -d` (binutils, which the C++
toolchain Inductor needs brings along)."""

from __future__ import annotations

import re
import subprocess
import tempfile
import zipfile
from pathlib import Path


def needed(library: Path) -> list[str]:
    """The shared libraries `library` names as NEEDED in its dynamic section."""
    dynamic = subprocess.run(["readelf", "-d", str(library)], capture_output=True, text=True, check=True)
    return re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", dynamic.stdout)


def package_needed(package: Path) -> list[list[str]]:
    """`needed` of every shared library in an AOTInductor package (a zip archive)."""
    with tempfile.TemporaryDirectory() as tmp, zipfile.ZipFile(package) as archive:
        names = [n for n in archive.namelist() if n.endswith(".so")]
        return [needed(Path(archive.extract(name, tmp))) for name in names]
