"""A table's rules (`TableSpec`) and one part file's bytes checked against them (`conform`); the
strict reader (`store.reader`) adds what takes the whole table (the commit ledger, duplicates
across parts):

- **pages**: page checksums are verified (a flipped bit inside a data page).
- **schema**: the file's columns, by name and Arrow type, are exactly those of its schema version:
  no cast, so a `speedup` stored as the string '99.5' or a `job_id` stored as an integer is
  refused; unknown and missing columns are named (a file of an older version may lack the
  columns added since; it must have the identity columns).
- **rows**: identity columns are never null or empty (nor a name with a control character, nor a
  batch size below 1), a status is one of the known ones, an `ok` row has its figures, a `unique`
  value appears once in the part, and the table's own invariant holds (`store.invariants`).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

import pyarrow as pa

from store.invariants import negative_count


@dataclass(frozen=True)
class TableSpec:
    """What the strict reader (`store.reader.check_table`) needs to know about one table (built by
    `store.schema`)."""

    name: str
    schema: pa.Schema
    """Its canonical schema, partition columns included."""
    partitions: tuple[str, ...]
    version: int
    version_key: bytes
    required: tuple[str, ...] = ("job_id", "run_id")
    """Columns every version has and no row leaves null."""
    statuses: tuple[str, ...] = ()
    """The values `status` may take (results only)."""
    ok_figures: tuple[str, ...] = ()
    """Columns an `ok` row never leaves null (results only)."""
    ok_derived: tuple[str, ...] = ()
    """Columns an `ok` row leaves null or holds a positive, finite number in (results only)."""
    unique: str | None = None
    """A column whose value appears in at most one row of the table (results: job_id), rows of
    the `superseded` status aside."""
    superseded: str | None = None
    """A status whose row a later row of the same `unique` value replaces (results:
    `harness_error`, a failure of the harness that `--resume` runs again): the file keeps it, the
    reader returns it only while its job has no other row."""
    invariant: Callable[[pa.Table, dict[str, str], set[str]], str | None] | None = None
    """Why a part's rows (given its partition values and the columns its file has) break what the
    writer guarantees, or None (`store.invariants`)."""
    invariant_columns: tuple[str, ...] = ()
    """The columns `invariant` reads (always read, whatever a command asks for)."""
    upgrade: Callable[[pa.Table, int], pa.Table] | None = None
    """A part's rows, written at the given schema version, as this version means them (a value
    whose meaning changed is renamed, never matched silently with the new one)."""


def conform(
    data: bytes, spec: TableSpec, rel: str, columns: list[str] | None = None
) -> tuple[pa.Table, str | None]:
    """(the part file's rows in the canonical schema, None), or (an empty table, why not). With
    `columns`, only those and the ones the row checks need are read (the schema is checked whole;
    the ledger's digest covers every byte)."""
    import pyarrow.parquet as pq

    schema = spec.schema
    if columns is not None:
        wanted = {
            *columns,
            *spec.required,
            *spec.ok_figures,
            *spec.ok_derived,
            *spec.invariant_columns,
            *(["status"] if spec.statuses else []),
        }
        schema = pa.schema([f for f in spec.schema if f.name in wanted], metadata=spec.schema.metadata)

    if not data:
        return spec.schema.empty_table(), "empty file (0 bytes)"
    try:
        pf = pq.ParquetFile(pa.BufferReader(data), page_checksum_verification=True)
        file_schema = pf.schema_arrow
        version = int((pf.metadata.metadata or {}).get(spec.version_key) or 1)
        reason = _schema_problem(file_schema, spec, version)
        if reason:
            return spec.schema.empty_table(), reason
        present = set(file_schema.names)
        # no worker threads: an Arrow pool thread still alive when the interpreter exits after an
        # error (a damaged part found) could abort it ("terminate called"), and parts are small
        table = pf.read(columns=[n for n in schema.names if n in present], use_threads=False)
    except (OSError, pa.ArrowException, ValueError) as exc:
        return spec.schema.empty_table(), " ".join(str(exc).split()) or type(exc).__name__
    values = _partition_values(rel, spec)
    arrays = []
    for f in schema:
        if f.name in values:
            arrays.append(pa.array([values[f.name]] * table.num_rows, f.type))
        elif f.name in present:
            arrays.append(table.column(f.name))
        else:  # a column added after the file's schema version
            arrays.append(pa.nulls(table.num_rows, f.type))
    table = pa.Table.from_arrays(arrays, schema=schema)
    if spec.upgrade is not None and version < spec.version:
        table = spec.upgrade(table, version)
    figures = tuple(c for c in spec.ok_figures if c in present)  # an old file may lack some
    derived = tuple(c for c in spec.ok_derived if c in present)
    empty = "no rows (the sink writes no part without rows)" if not table.num_rows else None
    reason = empty or _row_problem(table, spec, figures, derived) or negative_count(table)
    return table, reason or (spec.invariant(table, values, present) if spec.invariant else None)


def _schema_problem(schema: pa.Schema, spec: TableSpec, version: int) -> str | None:
    if version > spec.version:
        return f"schema version {version}, newer than this orchestrate reads ({spec.version}): upgrade it"
    wanted = {f.name: f.type for f in spec.schema if f.name not in spec.partitions}
    names = schema.names
    found = []
    twice = sorted(n for n, k in Counter(names).items() if k > 1)
    if twice:
        found.append(f"column(s) {', '.join(twice)} twice")
    unknown = [n for n in names if n not in wanted]
    if unknown:
        found.append(f"unknown column(s) {', '.join(unknown)}")
    mistyped = [
        f"{f.name} is {f.type}, not {wanted[f.name]}"
        for f in schema
        if f.name in wanted and not f.type.equals(wanted[f.name])
    ]
    found += mistyped
    # an older version may lack the columns added since, never the identity or an ok row's figures
    needed = list(wanted) if version == spec.version else [*spec.required, *spec.ok_figures]
    missing = [n for n in needed if n not in names]
    if missing:
        found.append(f"missing column(s) {', '.join(missing)}")
    return f"schema version {version}: " + "; ".join(found) if found else None


def _partition_values(rel: str, spec: TableSpec) -> dict[str, str]:
    pieces = dict(p.split("=", 1) for p in rel.split("/")[1:-1] if "=" in p)
    return {c: pieces[c] for c in spec.partitions if c in pieces}


def _row_problem(
    table: pa.Table, spec: TableSpec, figures: tuple[str, ...], derived: tuple[str, ...] = ()
) -> str | None:
    rows = table.select(
        [*spec.required, *figures, *derived, *(["status"] if spec.statuses else [])]
    ).to_pylist()
    seen: set[str] = set()
    for n, row in enumerate(rows, 1):
        who = f"row {n}" + (f" (job_id {row['job_id']})" if row.get("job_id") is not None else "")
        null = [c for c in spec.required if row[c] is None or row[c] == ""]  # "": no id either
        if null:
            return f"{who}: {', '.join(null)} null or empty"
        odd = _odd_identity(row, spec.required)
        if odd:
            return f"{who}: {odd}"
        if spec.statuses:
            if row["status"] not in spec.statuses:
                return f"{who}: status {row['status']!r} is not one of {', '.join(spec.statuses)}"
            null = [c for c in figures if row[c] is None]
            if row["status"] == "ok" and null:
                return f"{who}: status ok but {', '.join(null)} null"
            bad = [
                f"{c} {row[c]!r}"
                for c in (*figures, *derived)
                if row[c] is not None and not 0 < row[c] < math.inf
            ]
            if row["status"] == "ok" and bad:  # a latency (or their ratio) is a positive, finite number
                return f"{who}: status ok but {', '.join(bad)}"
        if spec.unique:
            if row[spec.unique] in seen:
                return f"{who}: a second row of {spec.unique} {row[spec.unique]}"
            seen.add(row[spec.unique])
    return None


def _odd_identity(row: dict, required: tuple[str, ...]) -> str | None:
    """An identity value this tool never writes (names are checked when the sweep file is read): a
    control character in a name, which a report would print raw; a batch size below 1."""
    for c in required:
        value = row[c]
        if isinstance(value, str) and any(ch < " " or ch == "\x7f" for ch in value):
            return f"{c} {value[:40]!r} holds a control character"
        if type(value) is int and value < 1:
            return f"{c} {value} is below 1"
    return None
