"""A `python:` model factory for the tests of processes started ahead (tests/test_ahead.py).

Each call of its forward sleeps `CALL_S`, so a process spends a second or more timing after its
compile, whatever the machine's load. Where `LOG_ENV` names a file, the process appends a JSON
line there when it builds the model and at its first forward call: its pid, the time, and the
cores of each of its threads. The factory starts a thread of its own, as a model's code may, so
the log shows where a thread started before a process's gate runs after it.
"""

from __future__ import annotations

import json
import os
import threading
import time

import torch

from compiler.env import format_cpus

LOG_ENV = "CO_TEST_AHEAD_LOG"
CALL_S = 0.03
_called: list[bool] = []


def _log(event: str) -> None:
    path = os.environ.get(LOG_ENV)
    if not path:
        return
    threads = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            threads[tid] = format_cpus(os.sched_getaffinity(int(tid)))
        except OSError:  # it ended meanwhile
            continue
    line = {"pid": os.getpid(), "event": event, "t": time.time(), "threads": threads}
    with open(path, "a") as f:
        f.write(json.dumps(line) + "\n")


@torch._dynamo.disable
def _slow(x: torch.Tensor) -> torch.Tensor:
    if not _called:
        _called.append(True)
        _log("first_call")
    time.sleep(CALL_S)
    return x


class _Slow(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _slow(self.lin(x))


def slow_logged(batch_size: int, input_size: int | None = None, overrides: dict | None = None):
    """A linear layer whose every call sleeps `CALL_S`; logs its build (see the module)."""
    threading.Thread(target=time.sleep, args=(3600,), name="model-helper", daemon=True).start()
    _log("build")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = _Slow()
    return model.eval(), {"x": torch.randn(batch_size, 8, generator=torch.Generator().manual_seed(0))}
