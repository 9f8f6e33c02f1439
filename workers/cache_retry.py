"""The shared compile cache never decides a result: a job process that failed after the cache
handed it an entry runs once more without the cache (`settle`).

An entry that passes the cache's seal can still be wrong for the compile that reads it (a holder
of the fleet's secret who sealed the wrong bytes, a torch bug across processes). Such an entry
fails the compile (Inductor loads another graph's code: a size assertion, a crash) or its result
(an accuracy failure). So where a process failed (`CACHE_MAY_FAIL`) and its RESULT.json says the
cache had handed it something (`workers.bench.record.CACHE_SERVED`), the process runs again with
the cache off for it, and with the job's local compile caches emptied (torch keeps what the
remote cache served it there, and the retry would find it again):
- it succeeds: its result is the job's, `ok`, with the entry counted in `cache_rejected` and a
  note naming the first failure;
- it fails: the failure is the model's, and the note says the cache had no part in it.
Either way the row names the cache's part. After such a retry, or where the cache could not be
used, the job's later processes run without the cache (`drop_after`).
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from compiler.cache_access import URL_ENV
from compiler.shared_cache import cache_environment
from workers.ahead import Step
from workers.bench.record import CACHE_SERVED

CACHE_MAY_FAIL = ("compile_error", "runtime_error", "accuracy_fail", "crash")
"""The statuses an entry that passed the seal but was wrong can cause (not a timeout: a retry
would double a job's time for what is nearly always the model's own slowness)."""


def _first_line(text: Any) -> str:
    line = str(text or "").strip().partition("\n")[0]
    return line if len(line) <= 200 else line[:197] + "..."


def settle(
    result: dict[str, Any],
    step: Step,
    env: dict[str, str],
    rerun: Callable[[Step, dict[str, str]], dict[str, Any]],
) -> dict[str, Any]:
    """`result` of `step`'s process, or, where it failed after the shared cache handed it an
    entry, the result of `rerun(step's twin, env without the cache)` with the cache's part in its
    notes and `cache_rejected` (see the module's docstring)."""
    served = result.pop(CACHE_SERVED, False)
    status = result.get("status")
    if not served or status not in CACHE_MAY_FAIL:
        return result
    off = dict(env)
    cache_environment(off, None)
    for name in ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR"):  # what it read, torch kept locally
        if off.get(name):
            shutil.rmtree(off[name], ignore_errors=True)
    twin = replace(
        step,
        result_file=step.result_file.with_name(f"nocache-{step.result_file.name}"),
        log_file=step.log_file.with_name(f"nocache-{step.log_file.name}"),
    )
    again = rerun(twin, off)
    again.pop(CACHE_SERVED, None)
    first = f"{status}: {_first_line(result.get('error'))}"
    rejected = int(result.get("cache_rejected") or 0)
    if again.get("status") == "ok":
        again["cache_rejected"] = rejected + 1
        said = (
            f"shared cache: the process failed after the cache handed it an entry ({first}); run again without "
            "the cache, it succeeded: that entry was rejected"
        )
    else:
        again["cache_rejected"] = rejected
        how = "the same way" if again.get("status") == status else f"too ({again.get('status')})"
        said = (
            f"shared cache: the process failed after the cache handed it an entry ({first}); run again without "
            f"the cache, it failed {how}: the failure is the model's, not the cache's"
        )
    earlier = [n for n in str(result.get("notes") or "").split("; ") if n.startswith("shared cache")]
    again["notes"] = "; ".join(filter(None, [*earlier, said, again.get("notes")]))
    return again


def drop_after(result: dict[str, Any], env: dict[str, str]) -> None:
    """The job's later processes (those not started yet: they read `env` when they start) run
    without the shared cache where this one could not use it, or ran again without it."""
    if URL_ENV in env and result.get("compile_cache") != "shared":
        cache_environment(env, None)
