"""Pack a sweep output directory into one Parquet file (hardware column included), so the
results of a GPU-machine run come back as a single file: `python pack.py OUT_DIR DEST.parquet`."""

import sys
from pathlib import Path

import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from orchestrator.schema import read_results  # noqa: E402

table = read_results(sys.argv[1])
pq.write_table(table, sys.argv[2])
print(f"packed {table.num_rows} rows of {sys.argv[1]} into {sys.argv[2]}")
