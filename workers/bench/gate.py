"""The gate of a job process started ahead (`workers.ahead`), on the job process's side.

A later process of a job may start while the one before it still times the model: it imports,
builds the model and its inputs on the host, pinned to cores of its own (`AHEAD_AFFINITY_ENV`),
then waits here, before it touches the device or makes its first compute call. The runner opens
the gate when the process before it has ended: it writes one line of JSON into the pipe whose
read end is `GATE_FD_ENV`: `at`, the time it did so (its clock, seconds since the epoch), `cpus`,
the job's own cores, and `env`, variables the process takes before it goes on (the GPU it runs
on, `CUDA_VISIBLE_DEVICES`, for a job that waited for a GPU: `workers.lanes`). The process then
moves every one of its threads onto the job's cores and goes on as any other process of the job.
A gate closed without that line means the runner dropped the process (the one before it failed,
the job was cancelled): it exits at once.
"""

from __future__ import annotations

import json
import os
from contextlib import suppress
from typing import Any

GATE_FD_ENV = "CO_GATE_FD"
"""The read end of the pipe a process started ahead waits on (set only for such a process)."""
AT_GATE = "at_gate"
"""A RESULT.json field, true while the process waits at its gate: its start-up is done, and it
runs nothing until the gate opens, so the runner gives its spare core to another process started
ahead (`workers.ahead.Overlap.free_at_gate`)."""
NVML_CHECK_ENV = "PYTORCH_NVML_BASED_CUDA_CHECK"
"""torch counts CUDA devices through NVML where this is set, without initialising CUDA: a GPU
process started ahead learns its device only at its gate (set until then)."""


def gate_fd() -> int | None:
    """The gate's file descriptor, in a process started ahead; None in any other."""
    value = os.environ.get(GATE_FD_ENV, "")
    return int(value) if value.isdigit() else None


def wait_at_gate(fd: int) -> dict[str, Any] | None:
    """Block until the runner opens the gate; its message (`at`, the time it opened it, and
    `cpus` and `env` where it gave them), or None where it closed the gate without opening it
    (or wrote something that is no such message)."""
    data = b""
    try:
        while not data.endswith(b"\n"):
            chunk = os.read(fd, 64)
            if not chunk:
                return None
            data += chunk
    finally:
        with suppress(OSError):
            os.close(fd)
    try:
        message = json.loads(data)
        message["at"] = float(message["at"])
    except (ValueError, TypeError, KeyError):
        return None
    return message


def pin_every_thread(cpus: set[int]) -> bool:
    """Move every thread of this process (the main one, torch's intra-op pool, any other) onto
    `cpus`: `os.sched_setaffinity(0, ...)` moves the calling thread only, and the threads started
    while the process was built keep the cores they were started on. Threads created later
    inherit the calling thread's set. False where the calling thread could not be moved."""
    for tid in os.listdir("/proc/self/task"):
        with suppress(OSError, ValueError):  # a thread that ended meanwhile
            os.sched_setaffinity(int(tid), cpus)
    try:
        os.sched_setaffinity(0, cpus)
    except OSError:
        return False
    return True


class WrongDevice(RuntimeError):
    """A process started ahead runs on another GPU than the one its gate gave it."""


def check_device(visible: str) -> None:
    """After the gate gave this process its GPU (`visible`, the `CUDA_VISIBLE_DEVICES` it took
    then): raise `WrongDevice` where CUDA's device 0 is another GPU, as it is where something
    initialised CUDA before the gate, under the variable the process was started with."""
    import torch

    from compiler import clocks

    try:
        with clocks.nvml_device(0) as (pynvml, handle):
            expected = str(pynvml.nvmlDeviceGetUUID(handle))
    except Exception:  # no NVML: nothing to check against
        return
    got = str(torch.cuda.get_device_properties(0).uuid)
    if expected.removeprefix("GPU-") != got.removeprefix("GPU-"):
        raise WrongDevice(
            f"CUDA's device 0 is GPU {got}, not the GPU {visible} ({expected}) this process was given "
            f"at its gate: CUDA was initialised before the gate (some import called it), so the job "
            f"would have shared another job's GPU"
        )
