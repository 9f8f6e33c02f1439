"""Spreading a plan's package builds over a node's GPUs (`workers.bench.serving.package_buckets`):
each build process starts on the GPU with the fewest builds running, so a GPU whose build
finished first gets the next one, not the next in turn."""

from __future__ import annotations

from workers.bench.serving import build_processes, least_busy


def test_each_build_starts_on_the_gpu_with_the_fewest_builds_running():
    gpus = ["0", "1"]
    running: list[str] = []
    for _ in range(4):  # four builds at once: two a GPU, alternating
        running.append(least_busy(gpus, running))
    assert running == ["0", "1", "0", "1"]
    running.remove("1")  # a build on GPU 1 finished first: the next goes there, not to GPU 0 in turn
    assert least_busy(gpus, running) == "1"
    assert least_busy(["GPU-a", "GPU-b", "GPU-c"], ["GPU-a", "GPU-c"]) == "GPU-b"  # names as listed
    assert least_busy(["3"], ["3", "3"]) == "3"


def test_builds_run_on_half_the_cores_at_least_one_at_most_one_per_bucket():
    import os

    cores = len(os.sched_getaffinity(0))
    assert build_processes(1) == 1
    assert build_processes(1000) == max(1, cores // 2)
