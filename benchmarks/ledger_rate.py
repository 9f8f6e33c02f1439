"""The sink's write rate with and without the commit ledger: N one-row commits (one `flush` per
row, each a part file written, fsynced and renamed, then listed), and the strict read of the
result. Prints a Markdown table.

    python benchmarks/ledger_rate.py [--commits 10000] [--dir /tmp]
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from orchestrator.spec.matrix import expand  # noqa: E402
from orchestrator.spec.sweep import parse_spec  # noqa: E402
from store.rows import make_row  # noqa: E402
from store.schema import read_results  # noqa: E402
from store.sink import ResultSink  # noqa: E402

SPEC = """\
name: rate
models:
  - {id: "python:workers.toy:mlp", name: mlp}
batch_sizes: [1]
configs: {default: {}}
"""


def rows(n: int) -> list[dict]:
    job = expand(parse_spec(SPEC, "rate.yaml"), {"cpu": "cpu"})[0]
    result = {"status": "ok", "eager_ms": 2.0, "compiled_ms": 1.0, "speedup": 2.0}
    made = []
    for i in range(n):
        row = make_row(job, result, run_id="bench")
        row["job_id"] = f"{i:020x}"  # one job per commit
        made.append(row)
    return made


def run(out: Path, data: list[dict], ledger: bool) -> tuple[float, float]:
    sink = ResultSink(out, ledger=ledger)
    started = time.perf_counter()
    for row in data:
        sink.add(row)
        sink.flush()
    write_s = time.perf_counter() - started
    started = time.perf_counter()
    if ledger:
        assert read_results(out, ["job_id"]).num_rows == len(data)
    read_s = time.perf_counter() - started
    return write_s, read_s


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--commits", type=int, default=10_000)
    parser.add_argument("--dir", default=None, help="where the outputs go (default: the system temp dir)")
    args = parser.parse_args()
    data = rows(args.commits)
    print(f"{args.commits} one-row commits, one part file each\n")
    print("| sink | commits/s | write s | strict read s |")
    print("|---|---|---|---|")
    for ledger in (False, True):
        tmp = Path(tempfile.mkdtemp(dir=args.dir))
        try:
            write_s, read_s = run(tmp / "out", data, ledger)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        name = "with ledger" if ledger else "without ledger"
        shown = f"{read_s:.1f}" if ledger else "-"
        print(f"| {name} | {args.commits / write_s:.0f} | {write_s:.1f} | {shown} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
