"""The one strict reader of an output's tables (every consumer reads through `schema.read_table`).

A table is answered from part files that pass every check, or not at all:

- **ledger**: a part must be listed in the commit ledger (`store.ledger`) with the
  sha256 of its bytes. An unlisted part is *foreign* (a copy, a rename, a file someone added); a
  listed part whose bytes differ is *damaged*; a listed part that is gone is *missing*. An output
  without a ledger (written before ledgers existed) is read with a one-line note.
- **the part itself**: its pages, its schema and its rows, checked against the table's rules
  (`store.part_rules`: page checksums, exact columns and types, identity values, statuses, an `ok`
  row's figures).
- **the whole table**: a `job_id` has at most one results row in the whole table, besides
  `harness_error` rows (failures of the harness that `--resume` ran again; a table read leaves
  such a row out once its job has another), and no part holds rows of a sweep other than those
  run.json records.

`repair` is what `sweep --resume` does with what these checks find: moves every failing file into
`<out>/quarantine/<time>/` (never deletes), and writes a ledger that lists exactly the parts kept.
"""

from __future__ import annotations

import hashlib
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field

import pyarrow as pa

from store import ledger as ledgers
from store.integrity import (
    MAX_REASON_CHARS,
    DamagedFile,
    DamagedOutputError,
    OutputWarning,
    list_parts,
    quarantine,
    warn_strays,
)
from store.lock import held_by_live_driver
from store.part_rules import TableSpec, conform
from store.storage import Location


class LegacyOutputWarning(OutputWarning):
    """An output written before the commit ledger: read, with a note."""

    prefix = "note"


class LedgerWarning(OutputWarning):
    """Lines of the commit ledger that could not be read (they list nothing)."""


@dataclass(frozen=True)
class Verified:
    entry: ledgers.Entry
    table: pa.Table


@dataclass
class TableCheck:
    good: list[Verified] = field(default_factory=list)
    problems: list[DamagedFile] = field(default_factory=list)
    strays: list[str] = field(default_factory=list)


def _problem(out: Location, rel: str, kind: str, reason: str) -> DamagedFile:
    return DamagedFile(out.join(*rel.split("/")), rel, reason[:MAX_REASON_CHARS], kind)


MAX_PART_BYTES = 2 * 2**30
"""A part larger than this is not read (the sink writes at most 1000 rows a part, each at most a
few MiB with its samples); a sparse or runaway file would take the reader's memory and minutes."""

IN_FLIGHT_S = 120.0
"""While a live driver holds the output's lock, an unlisted part younger than this may be a commit
in progress (the sink lists a part just after writing it): readers leave it out, unread, instead
of calling it foreign."""


def check_table(
    out: Location,
    spec: TableSpec,
    ledger: ledgers.Ledger | None,
    in_flight_s: float = IN_FLIGHT_S,
    columns: list[str] | None = None,
    sweeps: set[str] | None = None,
) -> TableCheck:
    """Every part of table `spec.name` of `out`, verified (see the module's docstring), its rows
    read (only `columns` and those the checks need, if given). While a live driver holds the
    lock, an unlisted part younger than `in_flight_s` is left out: neither read nor named."""
    table_dir = out.join(spec.name)
    sizes: dict[str, int] = {}
    parts, strays = list_parts(table_dir, sizes)
    if in_flight_s > 0 and ledger is not None and not held_by_live_driver(out):
        in_flight_s = 0  # nobody is writing: every unlisted part is foreign
    check = TableCheck(strays=strays)
    root = table_dir.path.rstrip("/")
    present = set()
    for loc in parts:
        rel = f"{spec.name}/{loc.path[len(root) + 1 :]}"
        present.add(rel)
        listed = ledger.entries.get(rel) if ledger is not None else None
        if ledger is not None and not listed:  # named without reading it (it may be huge)
            if _younger_than(loc, in_flight_s):
                continue
            reason = "not listed in the commit ledger (a copy, a rename, or a file this tool did not commit)"
            check.problems.append(_problem(out, rel, "foreign", reason))
            continue
        if sizes.get(loc.path, 0) > MAX_PART_BYTES:
            reason = f"{sizes[loc.path]} bytes, larger than any part this tool writes (at most {MAX_PART_BYTES}): not read"
            check.problems.append(_problem(out, rel, "damaged", reason))
            continue
        try:
            data = loc.read_bytes()
        except OSError as exc:
            check.problems.append(_problem(out, rel, "damaged", f"cannot be read ({exc})"))
            continue
        digest = hashlib.sha256(data).hexdigest()
        if listed and all(e.sha256 != digest for e in listed):
            reason = f"its bytes differ from the commit ledger's (sha256 {digest[:12]}, listed {listed[0].sha256[:12]})"
            check.problems.append(_problem(out, rel, "damaged", reason))
            continue
        table, reason = conform(data, spec, rel, columns)
        found = ledgers.Entry(
            rel, digest, table.num_rows, tuple(sorted(set(table.column("job_id").to_pylist())))
        )
        reason = reason or _listed_otherwise(found, listed)
        if not reason and (other := _other_sweeps(table, sweeps)):
            check.problems.append(_problem(out, rel, "foreign", other))
            continue
        if reason:
            check.problems.append(_problem(out, rel, "damaged", reason))
            continue
        check.good.append(Verified(found, table))
    if ledger is not None:
        for rel in sorted(ledger.entries):
            if rel.startswith(spec.name + "/") and rel not in present:
                reason = "listed in the commit ledger, but the file is gone (deleted or renamed)"
                check.problems.append(_problem(out, rel, "missing", reason))
    if spec.unique:
        _refuse_duplicates(out, spec, check)
    return check


def _listed_otherwise(found: ledgers.Entry, listed: list[ledgers.Entry] | None) -> str | None:
    """Where the ledger line with the part's digest gives other rows or job_ids than the part
    holds: the line was edited (the sink writes both from the rows it commits), so neither it
    nor the part is vouched for."""
    line = next((e for e in listed or () if e.sha256 == found.sha256), None)
    if line is None:
        return None
    if line.rows != found.rows:
        said = f"{line.rows} rows, the file (sha256 as listed) holds {found.rows}"
    elif set(line.job_ids) != set(found.job_ids):

        def ids(e: ledgers.Entry) -> str:
            return ", ".join(i[:12] for i in sorted(set(e.job_ids))[:2]) or "none"

        said = f"job_id(s) {ids(line)}, the file (sha256 as listed) holds {ids(found)}"
    else:
        return None
    return f"the commit ledger lists {said}: its line was changed"


def _other_sweeps(table: pa.Table, sweeps: set[str] | None) -> str | None:
    """Rows of another sweep than the ones run.json records (`sweeps`; None or empty: unknown): a
    part copied from another output. An output holds one sweep."""
    if not sweeps or "sweep" not in table.column_names:
        return None
    other = sorted(set(table.column("sweep").to_pylist()) - sweeps - {None})
    if not other:
        return None
    return f"rows of sweep {other[0]!r}, while run.json records {', '.join(map(repr, sorted(sweeps)))} (copied from another output?)"


def _younger_than(loc: Location, seconds: float) -> bool:
    if seconds <= 0:
        return False
    mtime = loc.fs.get_file_info(loc.path).mtime
    return mtime is not None and time.time() - mtime.timestamp() < seconds


def _refuse_duplicates(out: Location, spec: TableSpec, check: TableCheck) -> None:
    """A value of `spec.unique` in two rows (besides rows of the `superseded` status): both parts
    are damaged (which one is right is unknown)."""
    column = spec.unique
    assert column is not None
    where: dict[str, list[tuple[str, str | None]]] = {}
    for v in check.good:
        values = v.table.column(column).to_pylist()
        statuses = v.table.column("status").to_pylist() if spec.superseded else [None] * len(values)
        for value, status in zip(values, statuses, strict=True):
            where.setdefault(value, []).append((v.entry.part, status))
    bad: dict[str, str] = {}
    for value, found in where.items():
        rels = [rel for rel, status in found if status != spec.superseded]
        if len(rels) > 1:
            for rel in rels:
                other = next((r for r in rels if r != rel), rel)
                bad.setdefault(rel, f"{column} {value} also has a row in {other}")
    check.good = [v for v in check.good if v.entry.part not in bad]
    check.problems += [_problem(out, rel, "damaged", reason) for rel, reason in sorted(bad.items())]


def _drop_superseded(table: pa.Table, spec: TableSpec) -> pa.Table:
    """`table` without the rows of the `superseded` status whose `unique` value has another row."""
    import pyarrow.compute as pc

    if not spec.superseded or not spec.unique or table.num_rows == 0:
        return table
    mine = pc.equal(table.column("status"), spec.superseded).fill_null(False)
    if not pc.any(mine).as_py():
        return table
    others = pc.unique(table.filter(pc.invert(mine)).column(spec.unique))
    replaced = pc.and_(mine, pc.is_in(table.column(spec.unique), value_set=others))
    return table.filter(pc.invert(replaced))


def read_verified(
    out: Location, spec: TableSpec, columns: list[str] | None, fix: Callable[[], str]
) -> pa.Table:
    """The rows of one table of `out` from verified parts only; `DamagedOutputError` (naming every
    file that failed, and `fix()`: the repair, looked up only then) when any part fails."""
    try:
        ledger = ledgers.load(out)
    except ledgers.NotALedgerError as exc:
        raise ledgers.NotALedgerError(f"{exc}. {fix()}") from None
    check = check_table(out, spec, ledger, columns=columns, sweeps=_sweeps(out))
    warn_strays(out.join(spec.name), check.strays)
    note_ledger(out, ledger, bool(check.good or check.problems))
    if check.problems:
        raise DamagedOutputError(out, check.problems, fix())
    table = pa.concat_tables([v.table for v in check.good]) if check.good else spec.schema.empty_table()
    table = _drop_superseded(table, spec)
    return table.select(columns) if columns else table


def _sweeps(out: Location) -> set[str]:
    from store.runlog import recorded_sweeps

    return set(recorded_sweeps(out))


def note_ledger(out: Location, ledger: ledgers.Ledger | None, has_parts: bool) -> None:
    if ledger is None and has_parts:
        warnings.warn(
            f"{out} was written before outputs had a commit ledger: its parts are checked for schema and "
            f"duplicates, not against digests; `orchestrate sweep SWEEP --out {out} --resume` lists them",
            LegacyOutputWarning,
            stacklevel=3,
        )
    elif ledger is not None and ledger.unreadable:
        shown = ", ".join(ledger.unreadable[:3]) + (" ..." if len(ledger.unreadable) > 3 else "")
        warnings.warn(
            f"{ledgers.ledger_dir(out)}: unreadable line(s) {shown} list nothing (a torn write)",
            LedgerWarning,
            stacklevel=3,
        )


@dataclass
class Repair:
    moved: list[tuple[DamagedFile, Location | None]]
    """Each failing file and where it went (None: it was missing)."""
    strays: list[str]
    adopted: int = 0
    """Parts of an output without a ledger that are now listed."""
    ledger_moved: tuple[str, Location] | None = None
    """A `_ledger` that was not a folder (what it was, where it went): the parts were adopted."""


def find_damaged(
    out: Location, specs: list[TableSpec], in_flight_s: float = IN_FLIGHT_S
) -> tuple[list[DamagedFile], list[str], list[ledgers.Entry], ledgers.Ledger | None]:
    """Every part of the tables `specs` of `out` that fails the checks, every stray (relative to
    `out`), the entries of the parts that pass, and the ledger; reads every part whole, changes
    nothing."""
    ledger = ledgers.load(out)
    checks = [check_table(out, spec, ledger, in_flight_s, sweeps=_sweeps(out)) for spec in specs]
    strays = [f"{spec.name}/{s}" for spec, c in zip(specs, checks, strict=True) for s in c.strays]
    good = [v.entry for c in checks for v in c.good]
    return [p for c in checks for p in c.problems], strays, good, ledger


def repair(out: Location, specs: list[TableSpec], stamp: str) -> Repair:
    """Move every part that fails `check_table` into `out/quarantine/<stamp>/`, and leave a ledger
    that lists exactly the parts kept (old segments go to quarantine too, whole). A `_ledger` that
    is not a folder goes to quarantine first: the parts are then those of an output without one."""
    what = ledgers.not_a_folder(out)
    moved = (what, quarantine(out, [ledgers.LEDGER_DIR], stamp)[0][1]) if what else None
    problems, strays, good, ledger = find_damaged(out, specs, in_flight_s=0)  # the caller holds the lock
    present = [p for p in problems if p.kind != "missing"]
    dests = dict(quarantine(out, [p.rel for p in present], stamp))
    result = Repair([(p, dests.get(p.rel)) for p in problems], strays, ledger_moved=moved)
    if ledger is None:
        if good:
            ledgers.LedgerWriter(out, "adopted").append(good)
            result.adopted = len(good)
    elif problems or ledger.unreadable:
        ledgers.LedgerWriter(out, "repaired").append(good)  # listed first, then the old ones go
        rels = [f"{ledgers.LEDGER_DIR}/{s.path.rsplit('/', 1)[-1]}" for s in ledger.segments]
        quarantine(out, rels, stamp)
    return result
