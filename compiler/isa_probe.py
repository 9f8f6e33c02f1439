"""Inductor's CPU vector-ISA probe, built once per machine instead of once per job.

Before its first CPU kernel, Inductor finds which vector instruction sets this CPU and compiler
support (`torch._inductor.cpu_vec_isa.valid_vec_isa_list`): it builds a small C++ library per
candidate ISA with g++ into its cache directory, then loads each in a child process. Every job here
has a fresh cache directory, so that its compile is cold, and so paid the builds, 5-8 s on a 2-core
machine, inside `compile_s`, though they depend on the machine, not on the model or the config.

`probe` runs the check in the job's "imports" phase, before the compile is timed. The libraries it
built are kept in the user's cache (`compiler.serving.files.cache_root`, under `cpu-isa/`, keyed by
torch version, machine and compiler) and copied into the next job's fresh cache directory, so that a
later job skips the g++ builds. The load check in a child process still runs for each ISA in every
job, and the kept libraries are first loaded in a child process of their own: where one no longer
loads (it would read as an unsupported ISA, since Inductor only builds what is missing), they are
dropped and the job runs the check from scratch.
"""

from __future__ import annotations

import hashlib
import os
import platform
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

_done = False


def _key() -> str:
    import torch
    from torch._inductor import cpp_builder

    compiler = cpp_builder.get_cpp_compiler()
    found = shutil.which(compiler) or compiler
    try:
        stat = os.stat(found)
        stamp = f"{stat.st_size}:{stat.st_mtime_ns}"
    except OSError:
        stamp = "?"
    text = f"{torch.__version__}|{platform.machine()}|{found}|{stamp}"
    return hashlib.sha256(text.encode()).hexdigest()[:24]


def _files(root: Path) -> set[Path]:
    return {p.relative_to(root) for p in root.rglob("*") if p.is_file()} if root.is_dir() else set()


def probe(cache_root: Path | None = None) -> bool:
    """Run Inductor's ISA check in this process (once), seeding its cache directory from the kept
    probe libraries and keeping them where none were. True where the kept ones were used. A cache
    that cannot be read or written only costs the g++ builds, never the job."""
    global _done
    if _done:
        return False
    _done = True
    from torch._inductor import cpu_vec_isa
    from torch._inductor.runtime.cache_dir_utils import cache_dir

    from compiler.serving.files import cache_root as default_root

    job_cache = Path(cache_dir())
    kept = (cache_root or default_root()) / "cpu-isa" / _key()
    record = kept / "valid-isas.txt"
    used = False
    try:
        if record.is_file() and _all_load(sorted(kept.rglob("*.so"))):
            shutil.copytree(kept, job_cache, dirs_exist_ok=True)
            used = True
        elif kept.exists():  # a kept library that no longer loads would read as an unsupported ISA
            shutil.rmtree(kept, ignore_errors=True)
    except OSError:
        pass
    before = _files(job_cache)
    found = _names(cpu_vec_isa.valid_vec_isa_list())
    built = [p for p in _files(job_cache) - before if p.suffix in (".so", ".cpp")]
    if built and not kept.exists():
        try:
            kept.parent.mkdir(parents=True, exist_ok=True)
            tmp = Path(tempfile.mkdtemp(prefix=".isa-", dir=kept.parent))
            for rel in built:
                (tmp / rel).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(job_cache / rel, tmp / rel)
            (tmp / record.name).write_text(found)
            try:
                os.rename(tmp, kept)  # whole or not at all; another job may have kept its own first
            except OSError:
                shutil.rmtree(tmp, ignore_errors=True)
        except OSError:
            pass
    return used


def _all_load(libraries: list[Path]) -> bool:
    """Whether every kept library loads, in one child process (with torch's libraries on the
    path, as Inductor's own load check has them)."""
    import torch

    if not libraries:
        return False
    env = dict(os.environ)
    lib = str(Path(torch.__file__).parent / "lib")
    env["LD_LIBRARY_PATH"] = os.pathsep.join(filter(None, [lib, env.get("LD_LIBRARY_PATH")]))
    code = "import ctypes, sys\nfor p in sys.argv[1:]: ctypes.CDLL(p)"
    try:
        done = subprocess.run(
            [sys.executable, "-c", code, *map(str, libraries)], env=env, capture_output=True, timeout=60
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0


def _names(isas) -> str:
    return ",".join(sorted(type(i).__name__ for i in isas))
