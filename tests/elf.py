"""Reading shared libraries the way the dynamic loader will: `readelf -d` (binutils, which the C++
toolchain Inductor needs brings along)."""

from __future__ import annotations

import subprocess
import tempfile
import zipfile
from pathlib import Path


def symbolic(library: Path) -> bool:
    """Whether the shared library's dynamic section carries the SYMBOLIC flag (`-Wl,-Bsymbolic`)."""
    dynamic = subprocess.run(["readelf", "-d", str(library)], capture_output=True, text=True, check=True)
    return "SYMBOLIC" in dynamic.stdout


def symbolic_libraries(package: Path) -> list[bool]:
    """`symbolic` of every shared library in an AOTInductor package (a zip archive)."""
    with tempfile.TemporaryDirectory() as tmp, zipfile.ZipFile(package) as archive:
        names = [n for n in archive.namelist() if n.endswith(".so")]
        return [symbolic(Path(archive.extract(name, tmp))) for name in names]
