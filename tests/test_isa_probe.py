"""Inductor's CPU ISA check built once per machine (compiler.isa_probe): real torch, real g++, each
step in a fresh process with a fresh Inductor cache directory, as a job has."""

from __future__ import annotations

import json
import os
import subprocess
import sys

STEP = """
import json
from torch._inductor import cpu_vec_isa
from compiler import isa_probe
used = isa_probe.probe()
print(json.dumps([used, sorted(type(i).__name__ for i in cpu_vec_isa.valid_vec_isa_list())]))
"""


def _step(tmp_path, n):
    env = dict(os.environ, COMPILE_ORCHESTRATOR_CACHE=str(tmp_path / "kept"))
    env["TORCHINDUCTOR_CACHE_DIR"] = str(tmp_path / f"job{n}")
    out = subprocess.run([sys.executable, "-c", STEP], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_the_second_job_uses_the_kept_probe_and_a_damaged_one_is_rebuilt(tmp_path):
    used, isas = _step(tmp_path, 1)
    assert not used
    [kept] = (tmp_path / "kept" / "cpu-isa").iterdir()
    assert (kept / "valid-isas.txt").read_text() == ",".join(isas)
    libraries = sorted(kept.rglob("*.so"))
    assert libraries  # what g++ built for the check

    assert _step(tmp_path, 2) == [True, isas]  # same answer, no g++ build
    assert sorted(p.relative_to(tmp_path / "job2") for p in (tmp_path / "job2").rglob("*.so")) == sorted(
        p.relative_to(kept) for p in libraries
    )

    if isas:  # a kept library that no longer loads would read as an unsupported ISA: found, rebuilt
        libraries[0].write_bytes(b"not a library")
        used, again = _step(tmp_path, 3)
        assert again == isas and not used
        [rebuilt] = (tmp_path / "kept" / "cpu-isa").iterdir()
        assert all(p.read_bytes() != b"not a library" for p in rebuilt.rglob("*.so"))
