"""The one place every Arrow table of a sweep output is defined (their columns, with types and
descriptions: `store.fields`).

Layout of an output directory::

    <out>/run.json                              spec, versions and host of every invocation (appended)
    <out>/results/hardware=<class>/part-<uuid>.parquet          one row per job
    <out>/kernel_choices/hardware=<class>/part-<uuid>.parquet   one row per autotune candidate
    <out>/triton_kernels/hardware=<class>/part-<uuid>.parquet   one row per generated Triton kernel
    <out>/presets.parquet, presets.json         derived presets (`orchestrate presets`, `tune`)

`kernel_choices` and `triton_kernels` rows belong to the results row with the same `job_id` and `run_id` (a job
rerun after a driver crash may leave rows of the first try, under its own `run_id`).

`results/` is a hive-partitioned Parquet dataset: the `hardware` column lives in the directory
name, not in the files. Read it with :func:`read_results` (or
``pyarrow.dataset.dataset(path, partitioning="hive")``). Files are only ever created complete:
the sink writes a dot-file, fsyncs it and renames it into place, and hive readers skip dot-files.
``<out>`` is a local path or a ``pyarrow.fs`` URI (``s3://bucket/prefix``; see
:mod:`store.storage`); on an object store each file is one PUT under its final name.

Failures are rows: every planned job ends as exactly one row whose ``status`` says how it ended.
"""

from __future__ import annotations

import json
from typing import Any

import pyarrow as pa

from store.fields import HARNESS_ERROR, RESULT_FIELDS, STATUSES
from store.kernel_fields import KERNEL_CHOICE_FIELDS, TRITON_KERNEL_FIELDS
from store.latest import JOB_COLUMNS, latest_table
from store.layout import RESULTS_DIR
from store.preset_fields import PRESET_FIELDS
from store.storage import Location, Target, resolve

PARTITION_COLUMNS = ("hardware",)

SCHEMA_VERSION = 16
"""Version of the tables' schemas, written into every Parquet file this project writes
(`SCHEMA_VERSION_KEY` in the file's key-value metadata). Columns are only ever added, so a reader
with a newer schema reads older files with the columns they lack as nulls (`read_table`).

- 1 (files without the key): `results` only.
- 2: `kernel_choices`; results gain `freezing`, the phase times, clocks and repeats columns.
- 3: `triton_kernels`, the `presets` table; results gain `channels_last` and the `baseline_*`
  columns of a tune's confirmation jobs.
- 4: `kernel_choices` gains `emitted` (the candidate in the generated code) and `fusion_benchmarked`.
- 5: results gain `runtime` and `cudnn_benchmark` (runtime settings), `autotuned_ops`, and
  the shared compile cache's columns: `compile_cache`, `compile_from_cache`, `cache_namespace`,
  `fx_cache_*`, `autotune_cache_*`, `gemm_cache_*`; `kernel_choices` gains `partial` (rows kept
  from a compile that timed out or crashed mid-autotune).
- 6: results gain device time beside wall time on GPU rows: `eager_device_ms`, `compiled_device_ms`,
  their intervals and samples (`*_device_*`, `device_samples_per_repeat`) and the host-bound
  shares `eager_host_bound_share`, `compiled_host_bound_share`; the host's state per process
  during timing: `host_cpu_mhz`, `host_load_1m`, `timing_gc_collections`.
- 7: `presets` gains eager presets' columns: `runtime`, `eager_over_config`, `eager_over_compile`,
  `eager_over_ms`, `eager_gain` with its interval and processes, and `speedup_vs_stock_from`.
- 8: `presets` gains `serving_peak_mem_bytes` (the larger of the eager and compiled phases' peaks:
  a `cudnn_benchmark` search runs in the eager phase, which the compiled phase's peak leaves out).
- 9: `fp32` is the stock policy (torch's float32 defaults: cuDNN TF32 on, matmuls in float32); what
  it meant before, TF32 off everywhere, is `fp32-strict`, and rows of older files read so
  (`upgrade_results`). Results gain the float32 switches they ran under (`cudnn_allow_tf32`,
  `matmul_precision`), their weights (`weights`) and what judges precision: the errors against fp64
  (`fp64_max_rel_err`, `eager_fp64_max_rel_err`), `output_spread` and `output_sensitivity`.
  `presets` gain the accuracy budget and its judgement (`budget`, `accuracy_*`, `weights`,
  `max_rel_err`) and the figures against a stock PyTorch user (`stock_eager_ms`,
  `stock_compile_*`, `vs_stock_eager*`, `vs_stock_compile*`, `within_precision_*`).
- 10: results gain the start-up overlap of a job's processes (`workers.ahead`): `started_ahead`
  and `gate_wait_s` per process, `ahead_hidden_s`, `ahead_cpus` and `ahead_off`.
- 11: results gain `lane_wait_s`, the time a GPU job waited for its GPU behind another job with its
  first process started ahead (`workers.lanes`); `wall_s` leaves that wait out.
- 12: results gain which GPU of its host a job ran on (`gpu_index`, `gpu_uuid`, `gpu_pci_bus_id`)
  and where it and the timing thread sat (`gpu_numa_node`, `timing_numa_nodes`).
- 13: `job_efficiency` counts the accuracy phase as work, as `analysis.efficiency` always did
  (`compiler.job.MEASURING`); older files' rows are recomputed so on read (`upgrade_results`).
- 14: results gain `cache_rejected`, the shared-cache entries a job did not use: unsealed, sealed
  with another key, or handed back by a compile that then failed and succeeded without the cache.
- 15: results and `presets` gain `serving_profile`, the traffic the model's presets are to serve
  (the sweep file's `serving:`, `compiler.serving.traffic`).
- 16: results gain `host_other_share`, per process the share of the job's cores other processes
  took while it timed (what `compiler.statistics.trust` reads to doubt a row's timing), and the
  size of the host that ran the job: `host_cpus`, `host_mem_bytes`, `host_gpus`.
"""
FP32_MEANT_STRICT_BEFORE = 9
"""Schema versions below this wrote `fp32` for what is `fp32-strict` now."""
EFFICIENCY_WITHOUT_ACCURACY_BEFORE = 13
"""Schema versions below this wrote a `job_efficiency` that left the accuracy phase out."""


def upgrade_results(table: pa.Table, version: int) -> pa.Table:
    """Rows of a results file written at schema `version`, as this version names and computes
    them: before 9 `fp32` turned TF32 off for convolutions, which is `fp32-strict` now. Renamed,
    so a comparison of an old run with a new one never matches the two silently (a cell of each
    side alone). Before 13 `job_efficiency` left the accuracy phase out: recomputed from the
    row's phases (`compiler.job.job_efficiency`)."""
    if version < EFFICIENCY_WITHOUT_ACCURACY_BEFORE and "job_efficiency" in table.column_names:
        from compiler.job import MEASURING, job_efficiency

        needed = [c for c in ("wall_s", *(f"phase_{p}_s" for p in MEASURING)) if c in table.column_names]
        table = table.set_column(
            table.column_names.index("job_efficiency"),
            "job_efficiency",
            pa.array([job_efficiency(r) for r in table.select(needed).to_pylist()], pa.float64()),
        )
    if version >= FP32_MEANT_STRICT_BEFORE:
        return table
    from compiler.precision import STOCK, STRICT

    def rename(column: str, values: list) -> None:
        nonlocal table
        table = table.set_column(table.column_names.index(column), column, pa.array(values, pa.string()))

    if "dtype" in table.column_names:
        dtypes = table.column("dtype").to_pylist()
        if "job_name" in table.column_names:  # hardware/model/bsN/dtype/config[/vs/baseline]
            names = table.column("job_name").to_pylist()
            for i, (name, dtype) in enumerate(zip(names, dtypes, strict=True)):
                parts = (name or "").split("/")
                if dtype == STOCK and len(parts) > 3 and parts[3] == STOCK:
                    names[i] = "/".join([*parts[:3], STRICT, *parts[4:]])
            rename("job_name", names)
        rename("dtype", [STRICT if d == STOCK else d for d in dtypes])
    if "baseline_dtype" in table.column_names:
        rename(
            "baseline_dtype",
            [STRICT if d == STOCK else d for d in table.column("baseline_dtype").to_pylist()],
        )
    return table


SCHEMA_VERSION_KEY = b"compile_orchestrator.schema_version"


def _schema(fields: list[tuple[str, pa.DataType, str]]) -> pa.Schema:
    return pa.schema(
        [pa.field(name, typ, metadata={"description": doc}) for name, typ, doc in fields],
        metadata={SCHEMA_VERSION_KEY: str(SCHEMA_VERSION).encode()},
    )


def file_schema_version(metadata: dict[bytes, bytes] | None) -> int:
    """The schema version a Parquet file was written with, from its key-value metadata
    (`pyarrow.parquet.read_metadata(f).metadata`); 1 for a file from before versions existed."""
    value = (metadata or {}).get(SCHEMA_VERSION_KEY)
    return int(value) if value else 1


RESULTS_SCHEMA = _schema(RESULT_FIELDS)
KERNEL_CHOICES_SCHEMA = _schema(KERNEL_CHOICE_FIELDS)
TRITON_KERNELS_SCHEMA = _schema(TRITON_KERNEL_FIELDS)
TABLES: dict[str, pa.Schema] = {
    RESULTS_DIR: RESULTS_SCHEMA,
    "kernel_choices": KERNEL_CHOICES_SCHEMA,
    "triton_kernels": TRITON_KERNELS_SCHEMA,
}
"""Every table of an output directory, by the name of its folder."""
SIDE_TABLES: tuple[str, ...] = tuple(t for t in TABLES if t != RESULTS_DIR)
"""The tables beside `results` whose rows a job's result carries (keyed by its job_id)."""
PRESETS_SCHEMA = _schema(PRESET_FIELDS)
"""`presets.parquet`: one row per (hardware class, model, batch size, precision), derived from the
result tables (`orchestrate presets`, `orchestrate tune`) and rewritten whole, not appended."""


def file_schema(schema: pa.Schema) -> pa.Schema:
    """What the Parquet files hold: the partition columns come from the directory names."""
    return pa.schema([f for f in schema if f.name not in PARTITION_COLUMNS], metadata=schema.metadata)


RESULTS_FILE_SCHEMA = file_schema(RESULTS_SCHEMA)
RESULT_COLUMNS: tuple[str, ...] = tuple(RESULTS_SCHEMA.names)


OK_FIGURES = ("eager_ms", "compiled_ms")
"""Columns a results row with status `ok` always has (the job timed both sides; the strict reader
refuses one without). `speedup` is derived from them and null where the compiled median is 0."""
OK_DERIVED = ("speedup", "speedup_vs_baseline", "compile_s")
"""Figures an `ok` row may leave null but never holds as NaN, an infinity, 0 or a negative number
(latency ratios and a compile time): the strict reader refuses such a row whether or not a ledger
covers its part (a NaN `speedup` shows as `nanx` in a report and sorts anywhere)."""


class SchemaError(ValueError):
    """A row that does not fit its table."""


def check_row(row: dict[str, Any]) -> dict[str, Any]:
    """Return `row` with every results column present (missing ones null); reject unknown keys."""
    unknown = set(row) - set(RESULT_COLUMNS)
    if unknown:
        raise SchemaError(f"unknown result columns {sorted(unknown)}; valid: {list(RESULT_COLUMNS)}")
    status = row.get("status")
    if status not in STATUSES:
        raise SchemaError(f"status {status!r} is not one of {STATUSES}")
    for key in ("job_id", "run_id", "hardware"):
        if not row.get(key):
            raise SchemaError(f"result row lacks {key}")
    return {name: row.get(name) for name in RESULT_COLUMNS}


def check_side_row(table: str, row: dict[str, Any]) -> dict[str, Any]:
    """A row of a table other than results: every column present, no unknown keys, its job named."""
    names = TABLES[table].names
    unknown = set(row) - set(names)
    if unknown:
        raise SchemaError(f"unknown {table} columns {sorted(unknown)}; valid: {list(names)}")
    for key in ("job_id", "run_id", "hardware"):
        if not row.get(key):
            raise SchemaError(f"{table} row lacks {key}")
    return {name: row.get(name) for name in names}


def rows_to_table(
    rows: list[dict[str, Any]], *, with_partitions: bool = True, table: str = RESULTS_DIR
) -> pa.Table:
    schema = TABLES[table] if with_partitions else file_schema(TABLES[table])
    checked = [check_row(r) if table == RESULTS_DIR else check_side_row(table, r) for r in rows]
    return pa.Table.from_pylist([{k: r[k] for k in schema.names} for r in checked], schema=schema)


def table_path(out_dir: Target, table: str) -> Location:
    return resolve(out_dir).join(table)


def results_path(out_dir: Target) -> Location:
    return table_path(out_dir, RESULTS_DIR)


def table_spec(table: str):
    """What the strict reader (`store.reader`) checks the parts of `table` against."""
    from store import invariants
    from store.part_rules import TableSpec

    common = (table, TABLES[table], PARTITION_COLUMNS, SCHEMA_VERSION, SCHEMA_VERSION_KEY)
    if table == RESULTS_DIR:
        return TableSpec(
            *common,
            # the job's identity in every version's files (hardware is the partition, model_id
            # came later): a report, the presets and an export key their cells on them (a null
            # one made a cell `cpu/None/bsNone/None`)
            required=("job_id", "run_id", "status", "model", "batch_size", "dtype", "config"),
            statuses=STATUSES,
            ok_figures=OK_FIGURES,
            ok_derived=OK_DERIVED,
            unique="job_id",
            superseded=HARNESS_ERROR,
            invariant=invariants.results_problem,
            invariant_columns=invariants.INVARIANT_COLUMNS,
            upgrade=upgrade_results,
        )
    if table == "kernel_choices":
        return TableSpec(
            *common,
            # the candidate's identity, in every version's files (op_index may be 0: its negative
            # values are refused as counts are)
            required=("job_id", "run_id", "op", "choice", "input_shapes"),
            invariant=invariants.kernel_choices_problem,
            invariant_columns=invariants.KERNEL_CHOICES_COLUMNS,
        )
    return TableSpec(*common)


def read_table(out_dir: Target, table: str, columns: list[str] | None = None) -> pa.Table:
    """Every row of one table of an output directory (a local path or a URI), in its canonical
    schema (empty if none), from part files the strict reader verified
    (`store.reader`: listed in the commit ledger with these bytes, exact schema, sound
    rows). Dot-files (a local write in progress) are skipped; stray files are ignored with a
    `StrayFileWarning`; any part that fails raises `DamagedOutputError` naming it and the fix,
    rather than answering from part of the table."""
    from store.reader import read_verified
    from store.runlog import read_runs

    out = resolve(out_dir)
    read_runs(out)  # a damaged run.json: `RunLogError`, one line (the output is damaged, if not its rows)
    return read_verified(out, table_spec(table), columns, lambda: repair_hint(out))


def repair_hint(out: Location) -> str:
    """The command that repairs a damaged output, as a sentence."""
    return (
        f"`orchestrate sweep {_sweep_file(out)} --out {out} --resume` moves damaged and foreign files into "
        f"{out.join('quarantine')} and runs their jobs again; or move them aside yourself"
    )


def _sweep_file(out: Location) -> str:
    """The sweep file of the newest run in `out`'s run.json, for a command to suggest; else SWEEP."""
    import contextlib

    from store.runlog import RunLogError, read_runs

    with contextlib.suppress(RunLogError, OSError):
        for run in reversed(read_runs(out)):
            if run.get("spec_file"):
                return str(run["spec_file"])
    return "SWEEP"


def read_results(out_dir: Target, columns: list[str] | None = None, *, latest: bool = False) -> pa.Table:
    """The result rows of an output directory (a path or a URI), from the strict reader
    (`read_table`): one row per job id, a `harness_error` row left out once its job has another.

    `latest=False` (the default; every command's reader): all of them, rows of earlier attempts
    at a job included (ids of another software stack or other measure settings, after a resumed
    sweep ran its jobs again). `latest=True`: one row per job (`store.latest.JOB_COLUMNS`: its
    name), the one that started last (`store.latest.latest_rows`), as a report of the output's
    current state wants. `columns`: only these (the key columns are read for `latest` anyway)."""
    if not latest:
        return read_table(out_dir, RESULTS_DIR, columns)
    needed = None if columns is None else list(dict.fromkeys([*columns, *JOB_COLUMNS, "started_at"]))
    table = latest_table(read_table(out_dir, RESULTS_DIR, needed))
    return table.select(columns) if columns is not None else table


def options_json(options: dict[str, Any]) -> str:
    return json.dumps(options, sort_keys=True)
