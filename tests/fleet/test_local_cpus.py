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
    from orchestrator.fleet.ray_tasks import ray_session
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


def test_local_gpus_are_those_cuda_visible_devices_names_no_more_than_the_node_has(monkeypatch):
    """`local_gpus`, which local_classes counts and benchmarks/overlap.py --side-by-side splits:
    as Ray finds them, `CUDA_VISIBLE_DEVICES` names the GPUs, at most as many as NVML counts."""
    from ray._private.accelerators import NvidiaGPUAcceleratorManager as nv

    from orchestrator.fleet.inventory import local_classes, local_gpus

    count = nv.get_current_node_num_accelerators()
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert local_gpus() == [str(i) for i in range(count)]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,1,7,5")
    assert local_gpus() == ["3", "1", "7", "5"][:count]  # none on a machine without GPUs
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert local_gpus() == [] and "GPU" not in str(local_classes())
