"""Whether the modules of a sweep's `python:` model ids can be found, checked in a child process.

Finding `pkg.mod` imports `pkg` (its `__init__` runs), and a user's package may do anything on
import: raise, never return, call `sys.exit` or `os._exit`, crash the interpreter. So the check
runs in a fresh interpreter with a time limit, and each way it can end becomes a message for the
model's line in the sweep file; the driver process never imports user code (the job processes
do, and a failure there is a row)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys

TIMEOUT_S = 10.0
MAX_ID_CHARS = 300
"""A dotted module path longer than this is refused before any import (Python's import
machinery recurses once per dot)."""

_CHILD = r"""
import importlib.util, json, os, sys
events = os.fdopen(os.dup(1), "w")  # the check's own channel; what the module prints goes nowhere
quiet = os.open(os.devnull, os.O_WRONLY)
os.dup2(quiet, 1)
os.dup2(quiet, 2)
def say(*event):
    events.write(json.dumps(list(event)) + "\n")
    events.flush()
for module in json.loads(sys.argv[1]):
    say("start", module)
    try:
        spec = importlib.util.find_spec(module)
        origin = getattr(spec, "origin", None) or ""
        say("done", module, "" if spec is not None else "not found", origin)
    except ModuleNotFoundError as exc:  # the module or a package on its path is missing
        mine = exc.name and (module == exc.name or module.startswith(exc.name + "."))
        say("done", module, ("not found" if mine else f"importing it raised ModuleNotFoundError: {exc}")[:300])
    except SystemExit as exc:
        say("done", module, f"importing it called sys.exit({exc.code!r})"[:300])
    except BaseException as exc:
        say("done", module, f"importing it raised {type(exc).__name__}: {exc}"[:300])
os._exit(0)  # threads or processes the modules started do not hold the check up
"""


def module_problems(
    modules: list[str], timeout_s: float | None = None, origins: dict[str, str] | None = None
) -> dict[str, str]:
    """Module -> why it cannot be used, for each of `modules` that cannot (found in a child
    interpreter with this process's search path and working directory). `origins`, if given,
    gets each found module's file. The child's answers go to a file, not a pipe, and the child
    runs in a session of its own that is killed as a whole at the time limit, so neither what a
    module prints nor a process it leaves behind makes the check wait."""
    import tempfile

    problems = {
        m: f"the module path is {len(m)} characters long (at most {MAX_ID_CHARS})"
        for m in modules
        if len(m) > MAX_ID_CHARS
    }
    timeout_s = TIMEOUT_S if timeout_s is None else timeout_s
    todo = sorted({m for m in modules if m not in problems})
    if not todo:
        return problems
    env_path = [p for p in sys.path if p]  # the console script's path, as the job processes see it
    cmd = [sys.executable, "-c", _CHILD, json.dumps(todo)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(env_path)}
    with tempfile.TemporaryFile() as answers:
        proc = subprocess.Popen(
            cmd,
            stdin=subprocess.DEVNULL,
            stdout=answers,
            stderr=subprocess.DEVNULL,
            env=env,
            start_new_session=True,
        )
        try:
            code, timed_out = proc.wait(timeout=timeout_s), False
        except subprocess.TimeoutExpired:
            code, timed_out = None, True
        finally:
            with contextlib.suppress(OSError):  # the child and whatever its modules started
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        answers.seek(0)
        out = answers.read(1 << 20).decode("utf-8", "replace")
    started, done = None, set()
    for line in out.splitlines():
        try:
            event = json.loads(line)
        except ValueError:
            continue  # the module printed something of its own
        if not isinstance(event, list) or len(event) < 2:
            continue
        if event[0] == "start":
            started = event[1]
        elif event[0] == "done" and len(event) in (3, 4):
            done.add(event[1])
            if event[2]:
                problems[event[1]] = event[2]
            elif len(event) == 4 and origins is not None and isinstance(event[3], str):
                origins[event[1]] = event[3]
    if started is not None and started not in done:
        if timed_out:
            problems[started] = f"importing it did not finish within {timeout_s:.0f} s"
        else:
            problems[started] = f"importing it ended the interpreter ({_ending(code)})"
    for module in todo:
        if module not in done and module not in problems:
            problems[module] = "not checked: an earlier module's import ended the check"
    return problems


MAX_SOURCE_BYTES = 4 << 20
"""A module source larger than this is not parsed for its names (the factory is then assumed)."""


def missing_name(origin: str, name: str) -> str | None:
    """Why the module at `origin` (a .py file) has no top-level `name`, read without running it
    (its syntax tree: a def, class, assignment or import of that name); None where it has one or
    where that cannot be told without running it (not a .py file, a module-level `__getattr__`, a
    star import, names set through `globals()`)."""
    import ast

    try:
        if not origin.endswith(".py") or os.path.getsize(origin) > MAX_SOURCE_BYTES:
            return None
        with open(origin, "rb") as f:
            tree = ast.parse(f.read(), origin)
    except (OSError, SyntaxError, ValueError, RecursionError, MemoryError):
        return None  # the job's import will say what is wrong with it
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Import | ast.ImportFrom):
            if any(a.name == "*" for a in node.names):
                return None
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
        else:  # assignments, and names bound inside if/try/with blocks at module level
            for sub in ast.walk(node):
                if isinstance(sub, ast.Name) and isinstance(sub.ctx, ast.Store):
                    names.add(sub.id)
                elif isinstance(sub, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                    names.add(sub.name)
                elif isinstance(sub, ast.Import | ast.ImportFrom):
                    names.update((a.asname or a.name).split(".")[0] for a in sub.names)
                elif isinstance(sub, ast.Name) and sub.id == "globals":
                    return None
    if name in names or "__getattr__" in names:
        return None
    close = sorted(n for n in names if n.lower() == name.lower() or n.startswith(name[:3]))[:3]
    hint = f" (did you mean {', '.join(close)}?)" if close else ""
    where = os.path.basename(origin)
    return f"has no top-level {name!r}: no def, class, assignment or import of it in its {where}{hint}"


def _ending(code: int | None) -> str:
    if code is not None and code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}: os._exit or a crash"
