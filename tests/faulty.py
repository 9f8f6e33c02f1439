"""`python:` model factories that fail on purpose, for the fault-handling tests.

Each is a real subprocess failure: a segfault, a hang, an exception, an accuracy bug.
"""

from __future__ import annotations

import ctypes
import time

import torch


class _Fn(torch.nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn
        self.lin = torch.nn.Linear(8, 8)

    def forward(self, x):
        return self.fn(self.lin(x))


def _inputs(batch_size: int) -> dict:
    return {"x": torch.randn(batch_size, 8)}


def segfault(batch_size, input_size=None, overrides=None):
    """Dereferences NULL while building: the job process dies of SIGSEGV."""
    ctypes.string_at(0)
    raise AssertionError("unreachable")


def hang(batch_size, input_size=None, overrides=None):
    """Never returns: the job must be killed by its timeout."""
    while True:
        time.sleep(1)


def raising(batch_size, input_size=None, overrides=None):
    """The model's forward raises."""

    def boom(x):
        raise ValueError("this model always fails")

    return _Fn(boom), _inputs(batch_size)


class _EagerOnlyNoise(torch.nn.Module):
    """Returns different values when traced by Dynamo than in eager: an accuracy failure."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)

    def forward(self, x):
        y = self.lin(x)
        if torch.compiler.is_compiling():
            y = y + 1.0
        return y


def wrong_when_compiled(batch_size, input_size=None, overrides=None):
    return _EagerOnlyNoise(), _inputs(batch_size)


def hang_with_child(batch_size, input_size=None, overrides=None):
    """Starts a grandchild process, then hangs: the timeout must kill both."""
    import os
    import subprocess
    import sys

    marker = os.environ.get("CO_TEST_MARKER", "co-test-marker")
    subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)", marker])
    while True:
        time.sleep(1)


def oom(batch_size, input_size=None, overrides=None):
    """The forward asks the allocator for 1 PiB: a real allocation failure."""

    def alloc(x):
        return x + torch.empty(2**50, dtype=torch.uint8, device=x.device).sum()

    return _Fn(alloc), _inputs(batch_size)
