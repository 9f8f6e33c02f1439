"""Undo pack.py: `python unpack.py PACKED.parquet OUT_DIR [RUN_JSON]` rebuilds OUT_DIR/results as a
hive-partitioned dataset (and copies run.json), so an output directory packed on another host can
be resumed, reported on, or used as `--history` here."""

import shutil
import sys
from pathlib import Path

import pyarrow.compute as pc
import pyarrow.parquet as pq

table = pq.read_table(sys.argv[1])
out = Path(sys.argv[2])
for hardware in sorted(set(table.column("hardware").to_pylist())):
    part = table.filter(pc.equal(table.column("hardware"), hardware)).drop_columns(["hardware"])
    dest = out / "results" / f"hardware={hardware}"
    dest.mkdir(parents=True, exist_ok=True)
    pq.write_table(part, dest / "part-unpacked.parquet")
if len(sys.argv) > 3:
    shutil.copy(sys.argv[3], out / "run.json")
print(f"unpacked {table.num_rows} rows into {out}")
