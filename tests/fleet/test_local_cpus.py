"""A sweep started under `taskset` (or in a cpuset) plans only the cores it may run on: the
embedded local Ray and the classes planned before it starts count this process's CPU affinity,
not the machine's cores (`orchestrator.fleet.inventory.local_cpus`)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

CORES = sorted(os.sched_getaffinity(0))

CHILD = textwrap.dedent(
    """
    import json, ray
    from orchestrator.fleet.driver import ray_session
    from orchestrator.fleet.inventory import local_classes, local_cpus
    cpu = local_classes()["cpu"]
    with ray_session(None):
        ray_cpus = ray.cluster_resources().get("CPU")
    print(json.dumps({"local": local_cpus(), "cpus_per_job": cpu.cpus_per_job, "slots": cpu.slots,
                      "ray_cpus": ray_cpus}))
    """
)


@pytest.mark.integration
@pytest.mark.skipif(len(CORES) < 2, reason="needs a core to leave out")
def test_a_sweep_under_taskset_plans_and_starts_ray_with_its_cores_only():
    one = CORES[-1]
    done = subprocess.run(
        [sys.executable, "-c", CHILD],
        capture_output=True,
        text=True,
        timeout=180,
        cwd=Path(__file__).resolve().parents[2],
        preexec_fn=lambda: os.sched_setaffinity(0, {one}),  # as `taskset -c <one>` would
    )
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got == {"local": 1, "cpus_per_job": 1, "slots": 1, "ray_cpus": 1.0}
