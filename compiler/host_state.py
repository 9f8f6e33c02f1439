"""The host's state around the timed rounds, read so that a row says what the host was doing while
its samples were taken: its dispatch speed (one tiny CPU tensor op), the CPU time a hypervisor
stole, the cores' clock and Python's garbage collections. None of it times the model: that is
`compiler.measure`."""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence

import torch


def host_probe_us(ops: int = 200, repeats: int = 5) -> float:
    """Host dispatch speed: median over `repeats` of the mean time of one tiny CPU tensor op, us.

    A launch-bound cell (a small batch whose kernels finish before the host issues the next)
    runs at the pace of PyTorch's dispatcher on the host, the code path this probe runs; a
    neighbour on a shared host that slows it (CPU time, caches, memory bandwidth) slows the cell."""
    x = torch.zeros(8)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(ops):
            x.add_(1.0)
        times.append((time.perf_counter() - t0) * 1e6 / ops)
    return statistics.median(times)


def cpu_steal_ticks() -> tuple[int, int] | None:
    """(steal, total) clock ticks of all CPUs so far, from /proc/stat (Linux); None elsewhere.
    Steal is time a hypervisor gave this VM's CPUs to someone else."""
    try:
        with open("/proc/stat") as f:
            fields = [int(v) for v in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    return (fields[7] if len(fields) > 7 else 0), sum(fields[:8])


def cpu_mhz(cores: Sequence[int]) -> float | None:
    """Mean current frequency of `cores`, MHz: cpufreq's `scaling_cur_freq` where the host has it,
    else the `cpu MHz` lines of /proc/cpuinfo; None where neither says (Linux only)."""
    found = []
    for n in cores:
        try:
            with open(f"/sys/devices/system/cpu/cpu{n}/cpufreq/scaling_cur_freq") as f:
                found.append(int(f.read().strip()) / 1e3)
        except (OSError, ValueError):
            break
    if len(found) == len(cores) and found:
        return statistics.fmean(found)
    try:
        with open("/proc/cpuinfo") as f:
            per_core, core = {}, None
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() == "processor":
                    core = int(value)
                elif key.strip() == "cpu MHz" and core is not None:
                    per_core[core] = float(value)
    except (OSError, ValueError):
        return None
    values = [per_core[n] for n in cores if n in per_core]
    return statistics.fmean(values) if values else None


def gc_collections() -> int:
    """Python garbage collections so far, all generations."""
    import gc

    return sum(s["collections"] for s in gc.get_stats())


def steal_share(before: tuple[int, int] | None, after: tuple[int, int] | None) -> float | None:
    """Share of the CPU time between two `cpu_steal_ticks` readings that the hypervisor stole."""
    if before is None or after is None or after[1] <= before[1]:
        return None
    return (after[0] - before[0]) / (after[1] - before[1])


def cores_busy() -> tuple[float, dict[int, float]] | None:
    """(now, per core busy seconds so far) for every core of /proc/stat (Linux; None elsewhere):
    busy is every kind of CPU time but idle and iowait. With `own_cpu_s` around the timed rounds it
    gives `other_share`: how much of the job's cores other processes took while it timed."""
    import os
    import time

    tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    busy: dict[int, float] = {}
    try:
        with open("/proc/stat") as f:
            for line in f:
                name, *values = line.split()
                if not name.startswith("cpu") or name == "cpu":
                    if busy:
                        break
                    continue
                ticks = [int(v) for v in values[:8]]
                busy[int(name[3:])] = (sum(ticks) - ticks[3] - (ticks[4] if len(ticks) > 4 else 0)) / tick
    except (OSError, ValueError):
        return None
    return time.monotonic(), busy


def own_cpu_s(children: bool = False) -> float:
    """CPU time of this process so far, every thread, user and system, s; with `children`, also
    that of its children it has waited for (a compiler it ran, say: its own work, not another's)."""
    import os

    t = os.times()
    return t.user + t.system + (t.children_user + t.children_system if children else 0.0)


def other_share(
    before: tuple[tuple[float, dict[int, float]] | None, float],
    after: tuple[tuple[float, dict[int, float]] | None, float],
    cores: Sequence[int],
) -> float | None:
    """Share of `cores`' time between two (`cores_busy`, `own_cpu_s`) readings that went to other
    processes: their busy time less this process's own CPU time, over the wall time they spanned
    times the number of cores (0 on an otherwise idle host, about 0.5 where a busy loop shares
    each of them). None where /proc/stat says nothing or no time passed."""
    (b, own_b), (a, own_a) = before, after
    if b is None or a is None or not cores:
        return None
    wall = a[0] - b[0]
    busy = sum(a[1].get(c, 0.0) - b[1].get(c, 0.0) for c in cores)
    if wall <= 0.05:
        return None
    return min(1.0, max(0.0, (busy - (own_a - own_b)) / (wall * len(cores))))


class HostShare:
    """The share of `cores` (by default this process's) that other processes took from now until
    `since()` (`other_share`; None where /proc/stat says nothing): what makes a measurement's
    seconds those of a busy host rather than of its own process (`compiler.statistics`' doubts).
    With `children`, the CPU time of children this process waited for is its own (the compiler a
    package's first load runs on the CPU, for a serving process's prepare)."""

    def __init__(self, cores: Sequence[int] | None = None, children: bool = False) -> None:
        import os

        self.cores = sorted(os.sched_getaffinity(0)) if cores is None else list(cores)
        self.children = children
        self.before = self._now()

    def _now(self) -> tuple[tuple[float, dict[int, float]] | None, float]:
        return cores_busy(), own_cpu_s(self.children)

    def since(self) -> float | None:
        return other_share(self.before, self._now(), self.cores)
