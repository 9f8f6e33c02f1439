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


class _LossyEager(torch.nn.Module):
    """Eager rounds its output through fp32 at 1e5 (steps of 2**-7), the compiled graph does not:
    compiled and eager differ by up to 4e-3 for outputs of magnitude about 1, but the compiled
    output is the closer of the two to the fp64 reference (which rounds at fp64). A correct
    compile that fails a max-relative-error check against eager and passes the fp64 rule."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)

    def forward(self, x):
        y = self.lin(x)
        if not torch.compiler.is_compiling():
            y = (y + 1e5) - 1e5
        return y


def closer_to_fp64_when_compiled(batch_size, input_size=None, overrides=None):
    return _LossyEager(), _inputs(batch_size)


def hang_with_child(batch_size, input_size=None, overrides=None):
    """Starts a grandchild process, then hangs: the timeout must kill both."""
    import os
    import subprocess
    import sys

    marker = os.environ.get("CO_TEST_MARKER", "co-test-marker")
    subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)", marker])
    while True:
        time.sleep(1)


def held(batch_size, input_size=None, overrides=None):
    """workers.toy's MLP, built once the file named by $CO_TEST_HOLD is gone: a job that stays
    running until the test lets it go (a sweep surely still running when the test kills it)."""
    import os
    from pathlib import Path

    from workers.toy import mlp

    hold = os.environ.get("CO_TEST_HOLD")
    while hold and Path(hold).exists():
        time.sleep(0.2)
    return mlp(batch_size, input_size, overrides)


def _a_row_within(results, seconds: float) -> bool:
    """Whether the results folder `results` holds a part file, or comes to within `seconds`."""
    import time

    deadline = time.monotonic() + seconds
    while not (found := any(results.rglob("*.parquet"))) and time.monotonic() < deadline:
        time.sleep(0.1)
    return found


def forgets_earlier_rows(batch_size, input_size=None, overrides=None):
    """workers.toy's MLP. The first job built while the folder named by $CO_TEST_FORGET (a round's
    output, such as a tune's rung0) holds a row removes that folder's rows and commit ledger, as a
    copy put back over the folder from before those rows would: rows the driver wrote are gone.
    Once only: the job that renames the file $CO_TEST_FORGET_ONCE does it.

    A job built while the folder holds none waits up to 3 s for one: the driver writes a row up
    to a second after its job ended (`store.sink`), and the next job may be built sooner, so the
    round's second job would otherwise find its first job's row only on a slow machine."""
    import os
    import shutil
    from pathlib import Path

    from workers.toy import mlp

    where, token = os.environ.get("CO_TEST_FORGET"), os.environ.get("CO_TEST_FORGET_ONCE")
    if where and token and os.path.exists(token) and _a_row_within(Path(where, "results"), 3.0):
        try:
            os.rename(token, token + ".used")
        except FileNotFoundError:  # another job did it
            pass
        else:
            for sub in ("results", "_ledger"):
                shutil.rmtree(Path(where, sub), ignore_errors=True)
    return mlp(batch_size, input_size, overrides)


def oom(batch_size, input_size=None, overrides=None):
    """The forward asks the allocator for 1 PiB: a real allocation failure."""

    def alloc(x):
        return x + torch.empty(2**50, dtype=torch.uint8, device=x.device).sum()

    return _Fn(alloc), _inputs(batch_size)


class _ManyKernels(torch.nn.Module):
    """Dozens of distinct pointwise kernels between linears: a CPU Inductor compile of many
    seconds, one `g++` run after another."""

    def __init__(self, layers: int = 40):
        super().__init__()
        self.lins = torch.nn.ModuleList(torch.nn.Linear(64, 64) for _ in range(layers))

    def forward(self, x):
        for i, lin in enumerate(self.lins):
            x = lin(x)
            x = torch.sin(x) * (i + 1) + torch.cos(x) ** 2 if i % 2 else torch.tanh(x) + x.sigmoid() * i
        return x


def compile_with_child(batch_size, input_size=None, overrides=None):
    """Starts a grandchild that never ends and never looks at its parent (as a long `g++` would
    not), then returns a model whose compile runs `g++` for many seconds: for the test that a
    killed driver leaves no job process behind."""
    import subprocess
    import sys

    subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)", "co-test-grandchild"])
    return _ManyKernels(), {"x": torch.randn(batch_size, 64)}


def os_error(batch_size, input_size=None, overrides=None):
    """Raises the model's own OSError while building: `overrides` names its `errno` and its `path`
    (environment variables expanded: `$TORCHINDUCTOR_CACHE_DIR/x` lies in the job's scratch)."""
    import os

    code = int((overrides or {}).get("errno", 2))
    path = os.path.expandvars(str((overrides or {}).get("path", "/nonexistent/weights.bin")))
    raise OSError(code, os.strerror(code), path)


def colourful_crash(batch_size, input_size=None, overrides=None):
    """Prints a line in a terminal's colours, as a logger or a compiler may, then ends its process
    with exit code 3: a crash whose output's tail goes into the row's error."""
    import os
    import sys

    print("\x1b[1;31merror:\x1b[0m the model gave up", flush=True)
    sys.stderr.flush()
    os._exit(3)
