"""Pack a sweep output directory into single Parquet files (hardware column included), so a run's
results move to another host as few files (and `python -m reports.measurement --phases` reads
them): `python pack.py OUT_DIR DEST.parquet` writes the results table to DEST.parquet and each
side table that has rows (kernel_choices, ...) to DEST-<table>.parquet. `unpack.py` undoes it."""

import sys
from pathlib import Path

import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from store.schema import SIDE_TABLES, read_results, read_table  # noqa: E402

out, dest = sys.argv[1], Path(sys.argv[2])
table = read_results(out)
pq.write_table(table, dest)
print(f"packed {table.num_rows} rows of {out} into {dest}")
for name in SIDE_TABLES:
    side = read_table(out, name)
    if side.num_rows:
        path = dest.with_name(f"{dest.stem}-{name}{dest.suffix}")
        pq.write_table(side, path)
        print(f"packed {side.num_rows} {name} rows into {path}")
