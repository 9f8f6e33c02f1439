"""Crash-safe Parquet sink for result rows (and the rows of the other tables a job reports).

Rows are buffered briefly and written as whole files: `.part-<uuid>.parquet` is written and
fsynced, then renamed to `part-<uuid>.parquet`. A killed driver leaves only complete files
(plus at most a dot-file that readers ignore and the next run removes). Rows still in the
buffer when the driver dies were never recorded, so `--resume` runs those jobs again.

On an object store (s3://, gs://) there is no rename, and none is needed: the file is encoded in
memory and sent as one object under its final, unique name, which becomes visible only whole.

Once the parts of a flush are durable, each is listed in the output's commit ledger with the
sha256 of its bytes, its row count and its job ids (`store.ledger`); readers trust
listed parts only (`store.reader`). A crash in between leaves unlisted parts, which
`--resume` moves into quarantine and whose jobs it runs again.

A write the filesystem refuses (full, over quota, read-only) raises `storage.WriteRefused`, which
names the part and its size; its dot-file is removed, and the sink writes nothing more (the rows
it still holds are not recorded: `--resume` runs their jobs again).
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

from store.ledger import Entry, LedgerWriter, entry, fsync_path
from store.schema import (
    PARTITION_COLUMNS,
    RESULTS_DIR,
    SIDE_TABLES,
    TABLES,
    read_results,
    rows_to_table,
    table_path,
)
from store.storage import (
    Location,
    Target,
    WriteRefused,
    is_refused_write,
    removed_on_failure,
    resolve,
)


class ResultSink:
    """Buffers rows and writes them to `<out>/<table>/hardware=<class>/` in complete files.

    Result rows go to `results/`; a job's rows of the other tables (`kernel_choices`) come with
    its result row and go to their own folders, written *before* the result rows of the same
    flush: a result row on disk means its job is done and its other rows are on disk too (a
    crash in between leaves rows of a job without a result, which `--resume` runs again under a
    new `run_id`).

    A flush happens when `max_rows` rows are waiting or the oldest has waited `max_delay_s`
    (checked on `add` and `tick`), so an expensive job's row reaches disk within a second while
    thousands of cheap rows still land in few files.
    """

    def __init__(self, out_dir: Target, max_rows: int = 1000, max_delay_s: float = 1.0, ledger: bool = True):
        self.out = resolve(out_dir)
        self.ledger = LedgerWriter(self.out) if ledger else None
        """None: parts are not listed (only the write-rate benchmark turns it off)."""
        self.max_rows = max_rows
        self.max_delay_s = max_delay_s
        self._buffer: list[dict[str, Any]] = []
        self._side: dict[str, list[dict[str, Any]]] = defaultdict(list)
        self._oldest: float | None = None
        self.rows_written = 0
        """Result rows on disk and listed; a flush refused halfway counts the partitions it wrote."""
        self.files_written = 0
        self.refused: WriteRefused | None = None
        """The write the filesystem refused; every later flush raises it again."""
        if self.out.is_local:
            for table in TABLES:
                root = table_path(self.out, table).local_path
                if table == RESULTS_DIR:
                    root.mkdir(parents=True, exist_ok=True)
                if root.is_dir():
                    for stale in root.rglob(".part-*.parquet"):  # left by a driver killed mid-write
                        stale.unlink(missing_ok=True)
        self.adopted = adopt_unlisted(self.out) if ledger else 0
        """Parts of an output written before ledgers, listed now (normally `--resume` did it)."""

    def add(self, row: dict[str, Any], tables: dict[str, list[dict[str, Any]]] | None = None) -> None:
        """One job's result row, and its rows of the other tables."""
        self._buffer.append(row)
        self.add_side(tables or {})
        self.tick()

    def add_side(self, tables: dict[str, list[dict[str, Any]]]) -> None:
        """Rows of the other tables without a results row: what a cancelled job left (its job has
        no row, so it runs again on `--resume`; these rows keep the first try's run_id). Written
        with the next flush (`close` at the latest)."""
        for table, rows in tables.items():
            if table not in SIDE_TABLES:
                raise ValueError(f"unknown side table {table!r}; valid: {sorted(SIDE_TABLES)}")
            self._side[table].extend(rows)
        if self._oldest is None:
            self._oldest = time.monotonic()

    def tick(self) -> None:
        if self._buffer and (
            len(self._buffer) >= self.max_rows or time.monotonic() - (self._oldest or 0) >= self.max_delay_s
        ):
            self.flush()

    def flush(self) -> None:
        if self.refused is not None:  # rows of that flush may be on disk: never write them twice
            raise self.refused
        if not self._buffer and not any(self._side.values()):
            return
        committed: list[Entry] = []
        try:
            for table, rows in self._side.items():
                self._write(table, rows, committed)
            self._side.clear()
            self._write(RESULTS_DIR, self._buffer, committed)
        except WriteRefused as exc:
            self.refused = exc
            raise
        finally:  # the parts on disk, durable by now, are listed, even those of a refused flush
            self._list(committed)
        self._buffer.clear()
        self._oldest = None

    def _list(self, committed: list[Entry]) -> None:
        """List the parts of a flush. A listing the filesystem refuses (full, read-only) leaves
        them unlisted, like rows never written (`--resume` moves them aside and runs their jobs
        again), and refuses the flush, unless a refused part write is already on its way."""
        try:
            if self.ledger is not None:
                self.ledger.append(committed)
        except OSError as exc:
            if not is_refused_write(exc):
                raise
            if self.refused is None:
                self.refused = WriteRefused(self.ledger.segment, exc)
                raise self.refused from exc
            return
        self.rows_written += sum(e.rows for e in committed if e.part.startswith(f"{RESULTS_DIR}/"))

    def _write(self, table: str, rows: list[dict[str, Any]], committed: list[Entry]) -> None:
        groups: dict[tuple, list[dict[str, Any]]] = defaultdict(list)
        for row in rows:
            groups[tuple(row[c] for c in PARTITION_COLUMNS)].append(row)
        for key, part in groups.items():
            part_dir = table_path(self.out, table).join(
                *(f"{c}={v}" for c, v in zip(PARTITION_COLUMNS, key, strict=False))
            )
            data = _encode(rows_to_table(part, with_partitions=False, table=table))
            name = f"part-{uuid.uuid4().hex}.parquet"
            try:
                if part_dir.is_local:
                    _write_local(part_dir.local_path, name, data)
                else:
                    part_dir.join(name).write_bytes(data.to_pybytes())  # one whole object
            except OSError as exc:
                if not is_refused_write(exc):
                    raise
                raise WriteRefused(part_dir.join(name), exc, needed=data.size) from exc
            committed.append(
                entry(
                    f"{table}/{part_dir.path.rsplit('/', 1)[-1]}/{name}",
                    data,
                    len(part),
                    (r["job_id"] for r in part),
                )
            )
            self.files_written += 1

    def close(self) -> None:
        self.flush()


def _encode(table: pa.Table) -> pa.Buffer:
    """The Parquet file, in memory: a failure to encode writes nothing, and its size is known
    before the write (to say how much space a refused write needed)."""
    buffer = pa.BufferOutputStream()
    pq.write_table(table, buffer, write_page_checksum=True)
    return buffer.getvalue()


def _write_local(part_dir: Path, name: str, data: pa.Buffer) -> None:
    """`.name` written and fsynced, then renamed to `name`: a crash leaves only the dot-file, and
    a failed write (a full disk) not even that."""
    part_dir.mkdir(parents=True, exist_ok=True)
    with removed_on_failure(part_dir / f".{name}") as tmp:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, part_dir / name)
    fsync_path(part_dir)


def adopt_unlisted(out: Location) -> int:
    """For an output without a ledger: list the parts it has (as they are) and return how many."""
    from store import ledger as ledgers
    from store.integrity import list_parts

    if ledgers.load(out) is not None:
        return 0
    found = []
    for table in TABLES:
        table_dir = table_path(out, table)
        root = table_dir.path.rstrip("/")
        for loc in list_parts(table_dir)[0]:
            try:
                data = loc.read_bytes()
                rows = pq.read_table(pa.BufferReader(data), columns=["job_id"]).column("job_id").to_pylist()
            except (OSError, pa.ArrowException, ValueError):
                continue  # unlisted: the reader names it, `--resume` moves it aside
            found.append(
                entry(f"{table}/{loc.path[len(root) + 1 :]}", data, len(rows), (str(i) for i in rows))
            )
    LedgerWriter(out, "adopted").append(found)
    return len(found)


def finished_job_ids(out_dir: Target) -> set[str]:
    """Job ids that already have a row in `out_dir`."""
    table = read_results(out_dir, columns=["job_id"])
    return set(table.column("job_id").to_pylist()) if table.num_rows else set()
