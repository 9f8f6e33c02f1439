"""`<out>/run.json`: one entry per `orchestrate sweep` invocation with spec, versions and host.

Read, changed and written whole: locally through a dot-file renamed into place, on an object
store (s3://, gs://) as one PUT. `<out>` is a local path or a URI (`store.storage`)."""

from __future__ import annotations

import contextlib
import json
import os
import platform
import socket
import sys
import time
from collections.abc import Iterable
from importlib import metadata
from typing import Any, Protocol, TextIO

from compiler.job import software_stack
from store.layout import RUN_FILE
from store.storage import StorageError, Target, redact, resolve


class SweepSpec(Protocol):
    """What a run's entry records of its sweep (`orchestrator.spec.sweep.SweepSpec`; the store is
    the floor below the spec, so it names the fields it reads rather than importing the class)."""

    name: str
    source: Any
    raw: Any


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


class OtherSweepError(StorageError):
    """An output that holds the rows or runs of another sweep than the one given."""


def recorded_sweeps(out_dir: Target) -> dict[str, str | None]:
    """The sweeps run.json records (name -> its file, where known); {} where it is missing or
    damaged (it tells nothing then)."""
    found: dict[str, str | None] = {}
    with contextlib.suppress(RunLogError):
        for run in read_runs(out_dir):
            name, where = (run.get("spec") or {}).get("name"), run.get("spec_file")
            if isinstance(name, str):
                found.setdefault(name, where if isinstance(where, str) else None)
    return found


def check_same_sweep(out_dir: Target, spec: SweepSpec, row_sweeps: Iterable[str | None] = ()) -> None:
    """`OtherSweepError` when `out_dir` records another sweep than `spec` (by name): in run.json
    (a damaged one tells nothing here) or in `row_sweeps`, the `sweep` column of its rows. An
    output holds one sweep: resuming another into it would mix their rows under one report."""
    found = recorded_sweeps(out_dir)
    for name in row_sweeps:
        if name:
            found.setdefault(name, None)
    others = [n for n in found if n != spec.name]
    if not others:
        return
    names = ", ".join(repr(n) for n in others)
    files = ", ".join(f for n in others if (f := found[n]))
    raise OtherSweepError(
        f"{resolve(out_dir)} holds sweep {names}{f' ({files})' if files else ''}, and "
        f"{spec.source or 'the sweep file'} is sweep {spec.name!r}: an output holds one sweep. Resume {names} "
        f"with its own file, or give {spec.name!r} another --out; no job of {spec.name!r} ran"
    )


def set_aside_if_damaged(out_dir: Target, stream: TextIO, stamp: str) -> None:
    """A damaged run.json (it only describes runs) is moved into quarantine, so a new one can start."""
    from store.integrity import quarantine

    try:
        read_runs(out_dir)
    except RunLogError as exc:
        [(_, dest)] = quarantine(resolve(out_dir), [RUN_FILE], stamp)
        print(f"warning: {exc}\n  moved it to {dest}; a new {RUN_FILE} starts now", file=stream)


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
