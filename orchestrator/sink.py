"""Crash-safe Parquet sink for result rows.

Rows are buffered briefly and written as whole files: `.part-<uuid>.parquet` is written and
fsynced, then renamed to `part-<uuid>.parquet`. A killed driver leaves only complete files
(plus at most a dot-file that readers ignore and the next run removes). Rows still in the
buffer when the driver dies were never recorded, so `--resume` runs those jobs again.

On an object store (s3://, gs://) there is no rename, and none is needed: the file is encoded in
memory and sent as one object under its final, unique name, which becomes visible only whole.
"""

from __future__ import annotations

import os
import time
import uuid
from collections import defaultdict
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from orchestrator.schema import PARTITION_COLUMNS, read_results, results_path, rows_to_table
from orchestrator.storage import Location, Target


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class ResultSink:
    """Buffers rows and writes them to `<out>/results/hardware=<class>/` in complete files.

    A flush happens when `max_rows` rows are waiting or the oldest has waited `max_delay_s`
    (checked on `add` and `tick`), so an expensive job's row reaches disk within a second while
    thousands of cheap rows still land in few files.
    """

    def __init__(self, out_dir: Target, max_rows: int = 1000, max_delay_s: float = 1.0):
        self.root = results_path(out_dir)
        self.max_rows = max_rows
        self.max_delay_s = max_delay_s
        self._buffer: list[dict[str, Any]] = []
        self._oldest: float | None = None
        self.rows_written = 0
        self.files_written = 0
        if self.root.is_local:
            root = self.root.local_path
            root.mkdir(parents=True, exist_ok=True)
            for stale in root.rglob(".part-*.parquet"):  # left by a driver killed mid-write
                stale.unlink(missing_ok=True)

    def add(self, row: dict[str, Any]) -> None:
        self._buffer.append(row)
        if self._oldest is None:
            self._oldest = time.monotonic()
        self.tick()

    def tick(self) -> None:
        if self._buffer and (
            len(self._buffer) >= self.max_rows or time.monotonic() - (self._oldest or 0) >= self.max_delay_s
        ):
            self.flush()

    def flush(self) -> None:
        if not self._buffer:
            return
        groups: dict[tuple, list[dict[str, Any]]] = defaultdict(list)
        for row in self._buffer:
            groups[tuple(row[c] for c in PARTITION_COLUMNS)].append(row)
        for key, rows in groups.items():
            part_dir = self.root.join(*(f"{c}={v}" for c, v in zip(PARTITION_COLUMNS, key, strict=False)))
            table = rows_to_table(rows, with_partitions=False)
            name = f"part-{uuid.uuid4().hex}.parquet"
            if part_dir.is_local:
                _write_local(part_dir.local_path, name, table)
            else:
                _write_object(part_dir.join(name), table)
            self.files_written += 1
        self.rows_written += len(self._buffer)
        self._buffer.clear()
        self._oldest = None

    def close(self) -> None:
        self.flush()


def _write_local(part_dir: Path, name: str, table: pa.Table) -> None:
    """`.name` written and fsynced, then renamed to `name`: a crash leaves only the dot-file."""
    part_dir.mkdir(parents=True, exist_ok=True)
    tmp = part_dir / f".{name}"
    with open(tmp, "wb") as f:
        pq.write_table(table, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, part_dir / name)
    _fsync_dir(part_dir)


def _write_object(path: Location, table: pa.Table) -> None:
    """Encoded in memory first, so a failure to encode sends nothing; then one whole object."""
    buffer = pa.BufferOutputStream()
    pq.write_table(table, buffer)
    path.write_bytes(buffer.getvalue().to_pybytes())


def finished_job_ids(out_dir: Target) -> set[str]:
    """Job ids that already have a row in `out_dir`."""
    table = read_results(out_dir, columns=["job_id"])
    return set(table.column("job_id").to_pylist()) if table.num_rows else set()
