"""Every benchmark that runs on a CPU runs here in a small mode, so a benchmark the code outgrew
fails a test (`benchmarks/dispatch.py` once failed on main: its synthetic rows broke the strict
reader's rules, and nothing ran it). What a benchmark measures is checked by its own targets when
it runs at full size, not here: these assert that it runs to its table, not how fast."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def bench(script: str, *args: str) -> str:
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / script), *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    # exit 1 only for a target missed (a loaded machine), never for an error
    assert done.returncode in (0, 1), done.stderr[-3000:]
    return done.stdout


def test_ledger_rate_prints_its_table():
    out = bench("ledger_rate.py", "--commits", "20")
    assert "| with ledger |" in out and "| without ledger |" in out


@pytest.mark.integration
def test_dispatch_prints_its_rate():
    out = bench("dispatch.py", "--jobs", "20")
    assert "targets >= 200 jobs/s and < 1 GiB:" in out
    [row] = [line.split() for line in out.splitlines() if line.split()[:1] == ["20"]]
    assert float(row[3]) > 0  # jobs/s


@pytest.mark.integration
def test_overhead_prints_its_percentiles():
    out = bench("overhead.py", "--jobs", "3")
    assert "3 jobs on {" in out and "target median overhead <= 1 s:" in out
    [row] = [line.split() for line in out.splitlines() if line.startswith("orchestration overhead")]
    assert float(row[-3].rstrip("s")) >= 0  # the median, in seconds
