"""`<out>/run.json`: one entry per `orchestrate sweep` invocation with spec, versions and host.

Read, changed and written whole: locally through a dot-file renamed into place, on an object
store (s3://, gs://) as one PUT. `<out>` is a local path or a URI (`orchestrator.store.storage`)."""

from __future__ import annotations

import json
import os
import platform
import socket
import sys
import time
from importlib import metadata
from typing import Any

from orchestrator.spec.sweep import SweepSpec
from orchestrator.store.storage import StorageError, Target, redact, resolve
from workers.job import software_stack

RUN_FILE = "run.json"


def _versions() -> dict[str, str]:
    versions = dict(software_stack())
    for dist in ("ray", "pyarrow", "numpy", "compile-orchestrator"):
        try:
            versions[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            versions[dist] = "absent"
    return versions


class RunLogError(StorageError):
    """A run.json that cannot be read; the message names it and the fix."""


MAX_RUN_FILE_BYTES = 16 * 2**20
"""A run.json larger than this is not read (an entry is a few KiB; thousands of runs fit)."""


def read_runs(out_dir: Target) -> list[dict[str, Any]]:
    """The entries of `<out>/run.json` ([] when it is missing); `RunLogError` when it is damaged:
    empty, not the JSON this tool writes, nested too deeply, or larger than `MAX_RUN_FILE_BYTES`
    (not read at all: its size is known first)."""
    import pyarrow.fs as pafs

    path = resolve(out_dir).join(RUN_FILE)
    info = path.fs.get_file_info(path.path)
    dangling = path.is_local and path.local_path.is_symlink()
    if info.type == pafs.FileType.NotFound and not dangling:
        return []
    try:
        if info.type == pafs.FileType.NotFound:
            raise ValueError("a symbolic link to a missing target")
        if info.type != pafs.FileType.File:
            raise ValueError("not a regular file")
        if info.size is not None and info.size > MAX_RUN_FILE_BYTES:
            raise ValueError(f"{info.size} bytes, more than any run log ({MAX_RUN_FILE_BYTES} bytes at most)")
        data = path.read_bytes()
        if not data.strip():
            raise ValueError("empty")
        doc = json.loads(data.decode("utf-8"))
        if not isinstance(doc, dict):
            raise ValueError(f"a JSON {type(doc).__name__}, not an object with 'runs'")
        runs = doc["runs"]
        if not isinstance(runs, list) or not all(isinstance(r, dict) for r in runs):
            raise ValueError("'runs' is not a list of objects")
        for n, run in enumerate(runs, 1):
            if not isinstance(run.get("run_id"), str) or not isinstance(run.get("spec") or {}, dict):
                raise ValueError(f"run {n} is not one this tool writes (a run_id string, a spec object)")
    except (ValueError, KeyError, TypeError, RecursionError, OSError) as exc:
        reason = " ".join(str(exc).split())[:200]
        raise RunLogError(
            f"{path}: damaged ({type(exc).__name__}: {reason}); it only describes earlier runs (the rows "
            f"are in results/, none is lost): `orchestrate sweep SWEEP --out {resolve(out_dir)} --resume` moves it "
            "into quarantine/ and starts a new one"
        ) from None
    return runs


def _write(out_dir: Target, runs: list[dict[str, Any]]) -> None:
    resolve(out_dir).join(RUN_FILE).write_text(json.dumps({"runs": runs}, indent=2, default=str))


def start_run(
    out_dir: Target,
    run_id: str,
    spec: SweepSpec,
    argv: list[str],
    hardware: dict[str, Any],
    planned: int,
    skipped: int,
) -> None:
    runs = read_runs(out_dir)
    runs.append(
        {
            "run_id": run_id,
            "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "finished_at": None,
            "argv": [redact(a) for a in argv],  # a URI's user:secret@ must not land in the output
            "spec_file": spec.source,
            "spec": spec.raw,
            "versions": _versions(),
            "host": {
                "hostname": socket.gethostname(),
                "platform": platform.platform(),
                "python": sys.version.split()[0],
                "cpus": os.cpu_count(),
            },
            "hardware": hardware,
            "planned": planned,
            "skipped": skipped,
        }
    )
    _write(out_dir, runs)


def finish_run(
    out_dir: Target,
    run_id: str,
    counts: dict[str, int],
    interrupted: bool = False,
    dispatch_s: float | None = None,
) -> None:
    """Mark a run finished. `dispatch_s`: first job dispatched to last row recorded (the makespan)."""
    runs = read_runs(out_dir)
    for run in runs:
        if run["run_id"] == run_id:
            run.update(
                finished_at=time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                counts=counts,
                interrupted=interrupted,
                dispatch_s=dispatch_s,
            )
    _write(out_dir, runs)
