"""Turn a job and what its task returned into one results row."""

from __future__ import annotations

import json
import logging
import os
from datetime import datetime
from typing import Any

from compiler import runtime
from compiler.job import Job, job_efficiency
from store.latest import latest_rows  # noqa: F401 (its callers import it from here too)
from store.schema import (
    RESULT_COLUMNS,
    SIDE_TABLES,
    SchemaError,
    check_row,
    check_side_row,
    options_json,
)
from workers.text import plain

log = logging.getLogger(__name__)

STRICT_ENV = "CO_STRICT_ROWS"
"""Set (the tests set it): a result key that is no column is an error, not a logged warning."""


def _unknown_keys(job: Job, result: dict[str, Any]) -> None:
    """A key of a job's result that is neither a column nor a side table would vanish from the
    row: an error under $CO_STRICT_ROWS (the tests), else a logged warning; never silent."""
    unknown = sorted(set(result) - set(RESULT_COLUMNS) - set(SIDE_TABLES))
    if not unknown:
        return
    message = (
        f"job {job.name}: its result has keys that are no column of the results table, left out of "
        f"the row: {unknown} (a misspelled key in the worker? columns are declared in "
        "store/fields.py)"
    )
    if os.environ.get(STRICT_ENV):
        raise SchemaError(message)
    log.warning(message)


def _timestamp(value: Any) -> datetime | None:
    if isinstance(value, str):
        try:
            return datetime.fromisoformat(value)
        except ValueError:
            return None
    return value


def make_row(
    job: Job,
    result: dict[str, Any],
    *,
    run_id: str,
    wall_s: float | None = None,
    attempt: int = 1,
) -> dict[str, Any]:
    # What the job measured goes in as it is; the job's identity comes from the job itself.
    _unknown_keys(job, result)
    row = {k: v for k, v in result.items() if k in RESULT_COLUMNS}
    row.update(
        job_id=job.job_id,
        run_id=run_id,
        hardware=job.hardware,
        sweep=job.sweep,
        job_name=job.name,
        model=job.model.name,
        model_id=job.model.id,
        task=result.get("task") or job.model.task,
        batch_size=job.batch_size,
        dtype=job.dtype,
        config=job.config.name,
        mode=job.config.mode,
        backend=job.config.backend,
        fullgraph=job.config.fullgraph,
        dynamic=job.config.dynamic,
        options=options_json(job.config.options),
        freezing=job.config.freezing,
        channels_last=job.config.channels_last,
        # what the job process read back after setting them; the config's for a job that never ran
        runtime=result.get("runtime") or runtime.to_json(job.config.runtime),
        baseline_config=job.baseline.config.name if job.baseline else None,
        baseline_dtype=job.baseline.dtype if job.baseline else None,
        serving_profile=json.dumps(job.serving, sort_keys=True) if job.serving else None,
        status=result.get("status", "crash"),
        started_at=_timestamp(result.get("started_at")),
        wall_s=wall_s,
        attempt=attempt,
    )
    row["cudnn_benchmark"] = bool(json.loads(row["runtime"]).get("cudnn_benchmark"))
    if row["status"] == "ok":
        row["error"] = None
    for key in ("error", "notes"):  # no terminal colour codes in a row, whoever wrote the text
        if isinstance(row.get(key), str):
            row[key] = plain(row[key])
    row["job_efficiency"] = job_efficiency(row)
    return check_row(row)


def failure_row(
    job: Job, status: str, error: str, *, run_id: str, wall_s: float | None = None, attempt: int = 1
) -> dict[str, Any]:
    """A row for a job whose task never reported (its worker or node died, its class is gone)."""
    return make_row(job, {"status": status, "error": error}, run_id=run_id, wall_s=wall_s, attempt=attempt)


def side_rows(job: Job, result: dict[str, Any], *, run_id: str) -> dict[str, list[dict[str, Any]]]:
    """The rows a job's result carries for the tables beside `results` (`kernel_choices`), each
    keyed by the job (job_id, run_id, hardware)."""
    key = {"job_id": job.job_id, "run_id": run_id, "hardware": job.hardware}
    tables = {}
    for table in SIDE_TABLES:
        rows = result.get(table) or []
        if rows:
            tables[table] = [check_side_row(table, {**r, **key}) for r in rows]
    return tables
