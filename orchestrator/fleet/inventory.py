"""Hardware classes of a Ray cluster: which kinds of device it has, and how many job slots each.

A GPU node's class is its accelerator type (node label `ray.io/accelerator-type`, or resource
`accelerator_type:X`, both set by Ray from the NVML name: A100, V100, T4, H100, ...). A node with
no GPU belongs to the class `cpu`. A job slot is one GPU on GPU nodes, with its share of the
node's cores less the two a process started ahead uses (`workers.ahead.gpu_job_cores`), and
`cpus_per_job` cores on CPU nodes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from compiler.hardware import CPU_CLASS
from compiler.job import DeviceKind
from workers.ahead import gpu_job_cores

ACCEL_LABEL = "ray.io/accelerator-type"
ACCEL_RESOURCE_PREFIX = "accelerator_type:"


@dataclass
class HardwareClass:
    name: str
    device: DeviceKind
    node_ids: list[str] = field(default_factory=list)
    slots: int = 0
    """Jobs of this class that can run at once across its nodes."""
    cpus_per_job: int = 1
    """Cores each job of this class reserves (and the thread count it gets)."""
    labelled: bool = True
    """Every node of this GPU class carries its name as the accelerator label, so jobs can be
    placed by label as well as by resource (see `orchestrator.fleet.ray_tasks.remote_for`)."""


def node_class(node: dict[str, Any]) -> tuple[str, DeviceKind]:
    resources = node.get("Resources", {})
    labels = node.get("Labels", {}) or {}
    if resources.get("GPU", 0) > 0:
        if labels.get(ACCEL_LABEL):
            return labels[ACCEL_LABEL], "cuda"
        for key in resources:
            if key.startswith(ACCEL_RESOURCE_PREFIX):
                return key[len(ACCEL_RESOURCE_PREFIX) :], "cuda"
        return "GPU", "cuda"
    return CPU_CLASS, "cpu"


def classes_from_nodes(
    nodes: list[dict[str, Any]], cpus_per_job: int | None = None
) -> dict[str, HardwareClass]:
    """Hardware classes of the alive nodes (as `ray.nodes()` returns them).

    `cpus_per_job` for CPU nodes defaults to all cores of the smallest CPU node: concurrent jobs
    on one CPU node perturb each other's timings, so one job per CPU node is the honest default.
    """
    classes: dict[str, HardwareClass] = {}
    # A node with neither GPUs nor CPUs (a head started with --num-cpus=0) runs no jobs.
    alive = [
        n
        for n in nodes
        if n.get("Alive", n.get("alive", True))
        and (n.get("Resources", {}).get("CPU", 0) > 0 or n.get("Resources", {}).get("GPU", 0) > 0)
    ]
    cpu_nodes = [n for n in alive if node_class(n)[1] == "cpu"]
    cpu_job = cpus_per_job or max(1, int(min((n["Resources"].get("CPU", 1) for n in cpu_nodes), default=1)))
    for node in alive:
        name, device = node_class(node)
        hw = classes.setdefault(name, HardwareClass(name, device))
        hw.node_ids.append(node["NodeID"])
        hw.labelled = hw.labelled and (node.get("Labels") or {}).get(ACCEL_LABEL) == name
        res = node.get("Resources", {})
        cpus = int(res.get("CPU", 0))
        if device == "cuda":
            gpus = int(res.get("GPU", 0))
            mine = gpu_job_cores(cpus // max(gpus, 1))
            hw.cpus_per_job = max(1, min(hw.cpus_per_job if hw.slots else mine, mine))
            hw.slots += gpus
        else:
            hw.cpus_per_job = cpu_job
            hw.slots += cpus // cpu_job
    return {k: v for k, v in sorted(classes.items()) if v.slots > 0}


def local_cpus() -> int:
    """The cores an embedded local Ray on this machine plans with: Ray's own count (which reads a
    container's CPU quota) or this process's CPU affinity (`taskset`, a cpuset), whichever is
    fewer. Ray's count alone ignores the affinity, so a sweep started under `taskset` would plan
    cores its jobs may not pin to."""
    import os

    try:
        from ray._private.utils import get_num_cpus

        counted = int(get_num_cpus())
    except Exception:  # Ray moved it: the machine's count
        counted = os.cpu_count() or 1
    return max(1, min(counted, len(os.sched_getaffinity(0))))


def local_gpus() -> list[str]:
    """The GPUs an embedded local Ray on this machine would have, as Ray finds them: those
    `CUDA_VISIBLE_DEVICES` names where it is set (at most as many as the node has), else every GPU
    NVML counts; none without NVML, or where Ray moved the module (a CPU machine as far as we can
    tell)."""
    try:
        from ray._private.accelerators import NvidiaGPUAcceleratorManager as nv

        count = nv.get_current_node_num_accelerators()
        visible = nv.get_current_process_visible_accelerator_ids()
    except Exception:
        return []
    return [str(i) for i in range(count)] if visible is None else [str(v) for v in visible][:count]


def local_classes(cpus_per_job: int | None = None) -> dict[str, HardwareClass]:
    """The classes an embedded local Ray cluster on this machine would have, without starting Ray."""
    cpus = local_cpus()
    node: dict[str, Any] = {"NodeID": "local", "Resources": {"CPU": float(cpus)}, "Labels": {}}
    gpus = local_gpus()
    if gpus:
        node["Resources"]["GPU"] = float(len(gpus))
        try:
            from ray._private.accelerators import NvidiaGPUAcceleratorManager as nv

            accel = nv.get_current_node_accelerator_type()
        except Exception:  # the GPUs without their model's label
            accel = None
        if accel:
            node["Labels"][ACCEL_LABEL] = accel
    return classes_from_nodes([node], cpus_per_job)


def cluster_classes(cpus_per_job: int | None = None) -> dict[str, HardwareClass]:
    """The classes of the Ray cluster this process is connected to."""
    import ray

    return classes_from_nodes(ray.nodes(), cpus_per_job)


class MissingHardwareError(ValueError):
    pass


def resolve(
    requested: str | tuple[str, ...], present: dict[str, HardwareClass], allow_missing: bool = False
) -> dict[str, HardwareClass]:
    """The classes a sweep runs on: all present ones for `auto`, else the requested ones, which
    must all be present unless `allow_missing` (then the missing ones are left out)."""
    if not present:  # a run of nothing is no sweep (it printed "0 jobs" and exited 0)
        raise MissingHardwareError(
            "no node of the cluster can run a job (classes present: none): a CPU node needs at least "
            "--cpus-per-job cores (by default all of its own), a GPU node a GPU; lower --cpus-per-job or "
            "add nodes"
        )
    if requested == "auto":
        return dict(present)
    missing = [h for h in requested if h not in present]
    if missing and not allow_missing:
        raise MissingHardwareError(
            f"the sweep asks for hardware {missing} that the cluster lacks; classes present: "
            f"{', '.join(present) or 'none'}. Use `hardware: auto`, --allow-missing to run the rest, "
            "or a cluster with those node types."
        )
    return {h: present[h] for h in requested if h in present}
