"""What the rows of a table always satisfy when this tool wrote them, so the strict reader
(`store.reader`) refuses a part whose rows break it, with or without a commit ledger:
a part edited or moved by hand, a copy from another output, a file of an output from before
ledgers. Each check is one the writer guarantees by construction; none is a judgement of whether a
figure is plausible.

- every table: counts, sizes and indices (its integer columns) are never negative;
- results: `job_name` is `hardware/model/bsN/dtype/config[/vs/baseline]` of the row's own columns
  and folder (a part moved to another `hardware=` folder, a model or config renamed in place);
  `speedup` is `eager_ms / compiled_ms` and `speedup_vs_baseline` is `baseline_ms / compiled_ms`
  (`workers.repeats` computes them from the same medians; null is shown as `-`), and that ratio of
  the figures is a finite number;
- kernel_choices: an op's winner (per job, run and op) is its one fastest timed candidate
  (`compiler.kernels.KernelChoiceRecorder`), and a time is a finite number of ms, never negative.
"""

from __future__ import annotations

import math
from collections import defaultdict

import pyarrow as pa
import pyarrow.compute as pc

RATIOS = (("speedup", "eager_ms", "compiled_ms"), ("speedup_vs_baseline", "baseline_ms", "compiled_ms"))
"""(ratio, numerator, denominator) columns of a results row."""
IDENTITY = ("job_name", "model", "batch_size", "dtype", "config", "baseline_config")
# the columns of a results part that `results_problem` reads (not every column: `RESULT_COLUMNS`)
INVARIANT_COLUMNS = (*IDENTITY, "sweep", *dict.fromkeys(c for r in RATIOS for c in r))
KERNEL_CHOICES_COLUMNS = ("job_id", "run_id", "op_index", "is_winner", "time_ms")
REL_TOL = 1e-9


def negative_count(table: pa.Table) -> str | None:
    """The first integer column with a negative value, as a reason."""
    for f in table.schema:
        if pa.types.is_integer(f.type) and table.num_rows:
            low = pc.min(table.column(f.name)).as_py()
            if low is not None and low < 0:
                return f"{f.name} {low} is negative (a count, size or index)"
    return None


def results_problem(table: pa.Table, folder: dict[str, str], present: set[str]) -> str | None:
    """Why the rows of a results part are not ones this tool wrote (`folder`: the partition values
    from its path, e.g. {"hardware": "cpu"}; `present`: the columns its file has), or None."""
    read = [c for c in INVARIANT_COLUMNS if c in table.column_names]
    for n, row in enumerate(table.select(read).to_pylist(), 1):
        row = {**dict.fromkeys(INVARIANT_COLUMNS), **row, **folder}
        name = row["job_name"]
        if name is not None and row["hardware"] is not None:
            cell = f"{row['hardware']}/{row['model']}/bs{row['batch_size']}/{row['dtype']}/{row['config']}"
            expected = cell + (f"/vs/{row['baseline_config']}" if row["baseline_config"] else "")
            if name != expected:
                return f"row {n}: job_name {name[:80]!r} is not its cell {expected[:80]!r} (moved or edited)"
        for ratio, top, bottom in RATIOS:
            value, a, b = row[ratio], row[top], row[bottom]
            if a is None or not b or ratio not in present:
                continue
            expected = a / b if abs(a) < abs(b) * 1e300 else math.inf  # no OverflowError
            if math.isinf(expected) or (
                value is not None and not math.isclose(value, expected, rel_tol=REL_TOL)
            ):
                return f"row {n}: {ratio} {value!r} is not {top} / {bottom} = {expected!r}"
    return None


def kernel_choices_problem(table: pa.Table, folder: dict[str, str], present: set[str]) -> str | None:
    """Why the rows of a kernel_choices part are not ones this tool wrote, or None."""
    if not set(KERNEL_CHOICES_COLUMNS) <= set(table.column_names):
        return None
    ops: dict[tuple, list[dict]] = defaultdict(list)
    for row in table.select(list(KERNEL_CHOICES_COLUMNS)).to_pylist():
        ms = row["time_ms"]
        if ms is not None and not 0 <= ms < math.inf:
            return f"op {row['op_index']} of job_id {row['job_id']}: time_ms {ms!r} is not a time"
        ops[(row["job_id"], row["run_id"], row["op_index"])].append(row)
    for (job, _, op), rows in ops.items():
        winners = [r for r in rows if r["is_winner"]]
        timed = [r["time_ms"] for r in rows if r["time_ms"] is not None]
        if len(winners) > 1 or (timed and (not winners or winners[0]["time_ms"] != min(timed))):
            return (
                f"op {op} of job_id {job}: {len(winners)} winner(s) among {len(rows)} candidates, where the "
                "recorder marks exactly the fastest timed one"
            )
    return None
