"""A node lost mid-sweep, on its own cluster (`test_fleet`'s tests share one they leave intact):
its jobs are retried on another node of the class, and a class that loses its last node ends
with rows instead of hanging."""

from __future__ import annotations

import io
import threading
import time

import pytest

from orchestrator.fleet.driver import SweepOptions, run_sweep
from orchestrator.spec.sweep import parse_spec
from store.schema import read_results
from tests.integration.test_fleet import SWEEP, make_cluster, task_body

pytestmark = pytest.mark.integration


@pytest.mark.slow  # a tier of its own, after the default one (docs/testing.md)
def test_lost_node_is_retried_and_a_lost_class_finishes_with_rows(tmp_path):
    cluster, node_ids, nodes = make_cluster()
    spec = parse_spec(SWEEP.format(batch_sizes="1, 2, 3, 4", hardware="[A100, T4]"), "fleet.yaml")
    out = tmp_path / "out"

    started = tmp_path / "started"
    started.mkdir()

    def kill_nodes():
        victims = [nodes["A100"][0], nodes["T4"][0]]
        deadline = time.monotonic() + 120
        while not all((started / n.node_id).exists() for n in victims) and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(0.5)  # both victims are running a 3 s job now
        cluster.remove_node(nodes["A100"][0], allow_graceful=False)
        cluster.remove_node(nodes["T4"][0], allow_graceful=False)

    killer = threading.Thread(target=kill_nodes)
    try:
        killer.start()
        summary = run_sweep(
            spec,
            SweepOptions(out_dir=out, address=cluster.address, cpus_per_job=1, max_attempts=3),
            stream=io.StringIO(),
            task_body=task_body(3.0, str(started)),
        )
        killer.join()
    finally:
        cluster.shutdown()
    rows = read_results(out).to_pylist()
    assert len(rows) == summary.planned == 2 * 4 * 2
    assert len({r["job_id"] for r in rows}) == len(rows)
    a100 = [r for r in rows if r["hardware"] == "A100"]
    t4 = [r for r in rows if r["hardware"] == "T4"]
    # The A100 class survives on its second node: every job ends ok, some on a second attempt.
    assert {r["status"] for r in a100} == {"ok"}
    assert any(r["attempt"] > 1 for r in a100)
    assert all(r["node_id"] in node_ids["A100"] for r in a100)
    # The T4 class is gone: what had not finished is recorded as hardware_lost, not left hanging.
    lost = [r for r in t4 if r["status"] == "hardware_lost"]
    assert lost and all("T4" in r["error"] for r in lost)
    assert {r["status"] for r in t4} <= {"ok", "hardware_lost"}
