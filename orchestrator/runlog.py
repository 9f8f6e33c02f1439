"""`<out>/run.json`: one entry per `orchestrate sweep` invocation with spec, versions and host."""

from __future__ import annotations

import json
import os
import platform
import socket
import sys
import time
from importlib import metadata
from pathlib import Path
from typing import Any

from orchestrator.spec import SweepSpec
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


def read_runs(out_dir: str | Path) -> list[dict[str, Any]]:
    path = Path(out_dir) / RUN_FILE
    if not path.exists():
        return []
    return json.loads(path.read_text())["runs"]


def _write(out_dir: Path, runs: list[dict[str, Any]]) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    tmp = out_dir / f".{RUN_FILE}.tmp"
    tmp.write_text(json.dumps({"runs": runs}, indent=2, default=str))
    os.replace(tmp, out_dir / RUN_FILE)


def start_run(
    out_dir: Path,
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
            "argv": argv,
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
    out_dir: Path,
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
