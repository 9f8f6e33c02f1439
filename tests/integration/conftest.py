"""Integration tier: the real CLI, a real local Ray cluster, real torch.compile on CPU."""

from __future__ import annotations

import contextlib
import io
import os
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from tests.conftest import default_sigint

ROOT = Path(__file__).resolve().parents[2]


def orchestrate(*args: str, timeout: float = 600, check: bool = True) -> subprocess.CompletedProcess:
    """Run `python -m orchestrator ARGS` from the repository root, as a user would."""
    proc = subprocess.run(
        [sys.executable, "-m", "orchestrator", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    if check and proc.returncode != 0:
        raise AssertionError(
            f"orchestrate {' '.join(args)} -> {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
        )
    return proc


def start_sweep(sweep: Path, out: Path, scratch: Path, *flags: str, **popen_kwargs) -> subprocess.Popen:
    """`orchestrate sweep SWEEP --out OUT --scratch SCRATCH FLAGS` as a background process that takes
    Ctrl-C (SIGINT) the way a terminal's foreground command does (`default_sigint`)."""
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "orchestrator",
            "sweep",
            str(sweep),
            "--out",
            str(out),
            "--scratch",
            str(scratch),
            *flags,
        ],
        cwd=ROOT,
        preexec_fn=default_sigint,
        **popen_kwargs,
    )


def planned_count(sweep: Path, *extra: str) -> int:
    """How many jobs `orchestrate plan SWEEP EXTRA` plans. In this process (a plan starts no Ray),
    to spare an interpreter start; the CLI's own process is what the sweeps themselves run in."""
    from orchestrator.cli import main

    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        code = main(["plan", str(sweep), *extra])
    assert code == 0, printed.getvalue()
    return int(printed.getvalue().strip().splitlines()[-1].split()[0])


@pytest.fixture
def sweep_file(tmp_path):
    def write(text: str, name: str = "sweep.yaml") -> Path:
        path = tmp_path / name
        path.write_text(text)
        return path

    return write


def bench_processes(marker: str) -> list[psutil.Process]:
    """Job processes (`python -m workers.bench`) whose command line contains `marker`."""
    found = []
    for p in psutil.process_iter(["cmdline"]):
        cmd = " ".join(p.info["cmdline"] or [])
        if "workers.bench" in cmd and marker in cmd:
            found.append(p)
    return found


def one_job_sweep(name: str, model: str, config: str) -> str:
    """The text of a sweep file of one job: `model` (a `python:` factory, 600 s to run) at batch
    size 1 under `config` (`NAME: {...}`), measured briefly."""
    return (
        f"name: {name}\nmodels:\n  - {{id: {model}, name: m, timeout_s: 600}}\nbatch_sizes: [1]\n"
        f"configs:\n  {config}\nmeasure: {{warmup: 1, iterations: 3, flops: false}}\n"
    )
