"""One row per job: the latest attempt.

An output keeps every row it was given. A job whose row says `harness_error` (a failure of the
harness, not of the model) runs again on `--resume`, and a job's id includes the software stack
and the measure settings, so a sweep resumed after a torch upgrade, or with other `measure:`
settings, runs its jobs again under new ids beside the old rows. The job itself (its name,
`hardware/model/bsN/dtype/config[/vs/baseline]`) is the same, and `latest_rows` keeps the row
whose job started last.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable
from datetime import datetime
from typing import Any

import pyarrow as pa

JOB_COLUMNS = ("hardware", "model", "batch_size", "dtype", "config", "baseline_config")
"""The columns a job's name is made of (`job_name` is `hardware/model/bsN/dtype/config`, with
`/vs/<baseline_config>` for a job timed against another config): its rows share them, whatever
their job ids."""


def latest_rows(
    rows: Iterable[dict[str, Any]], key: Callable[[dict[str, Any]], Hashable]
) -> dict[Hashable, dict[str, Any]]:
    """One row per `key`: the one whose job started last (a row without a start time, a job lost
    before it started, counts as the oldest; of rows that started at once, the last given)."""

    def started(row: dict[str, Any]) -> float:
        when = row.get("started_at")
        return when.timestamp() if isinstance(when, datetime) else float("-inf")

    found: dict[Hashable, dict[str, Any]] = {}
    for row in sorted(rows, key=started):
        found[key(row)] = row
    return found


def latest_table(table: pa.Table) -> pa.Table:
    """`table`'s rows (results, with `JOB_COLUMNS` and `started_at`), one per job: the latest
    (`latest_rows`), in the order the table has them."""
    index = "__row"
    keys = table.select([*JOB_COLUMNS, "started_at"]).append_column(index, pa.array(range(table.num_rows)))
    kept = latest_rows(keys.to_pylist(), lambda r: tuple(r[c] for c in JOB_COLUMNS))
    return table.take(pa.array(sorted(r[index] for r in kept.values()), pa.int64()))
