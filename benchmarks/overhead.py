"""Per-job orchestration overhead of the real driver on the embedded local Ray.

Overhead of a job = driver-side wall time from dispatch to result (`wall_s`) minus the
lifetime of the job's subprocess (`subprocess_s`): Ray task dispatch, the result's trip back,
sink and progress bookkeeping, process spawn and reaping. The subprocess's own work (Python
start, imports, the measurement) is excluded. Target: median <= 1 s.

    python benchmarks/overhead.py [--jobs 20] [--cpus-per-job N]
"""

from __future__ import annotations

import argparse
import io
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from compiler.statistics import percentile  # noqa: E402
from orchestrator.fleet.driver import SweepOptions, run_sweep  # noqa: E402
from orchestrator.spec.sweep import parse_spec  # noqa: E402
from store.schema import read_results  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--jobs", type=int, default=20, help="number of jobs (tiny MLPs, Dynamo + eager backend)"
    )
    parser.add_argument("--cpus-per-job", type=int, default=None, help="as for `orchestrate sweep`")
    args = parser.parse_args()

    sizes = ", ".join(str(i + 1) for i in range(args.jobs))
    spec = parse_spec(
        f"""
name: overhead
models: [python:workers.toy:mlp]
batch_sizes: [{sizes}]
configs: {{dynamo: {{backend: eager}}}}
measure: {{warmup: 1, iterations: 3}}
""",
        "overhead.yaml",
    )
    with tempfile.TemporaryDirectory() as tmp:
        summary = run_sweep(
            spec, SweepOptions(out_dir=Path(tmp), cpus_per_job=args.cpus_per_job), stream=io.StringIO()
        )
        rows = read_results(tmp).to_pylist()
    bad = [r for r in rows if r["status"] != "ok"]
    if bad:
        print(f"{len(bad)} jobs failed: {bad[0]['error']}", file=sys.stderr)
        return 1
    overhead = sorted(r["wall_s"] - r["subprocess_s"] for r in rows)
    proc = sorted(r["subprocess_s"] for r in rows)
    print(f"{len(rows)} jobs on {summary.hardware} in {summary.wall_s:.1f} s (incl. Ray start/stop)\n")
    print(f"{'per job':<40} {'median':>8} {'p90':>8} {'max':>8}")
    for name, values in (
        ("orchestration overhead (wall - subprocess)", overhead),
        ("job subprocess lifetime (for scale)", proc),
    ):
        print(
            f"{name:<40} {statistics.median(values):>7.3f}s {percentile(values, 90):>7.3f}s {values[-1]:>7.3f}s"
        )
    target = statistics.median(overhead) <= 1.0
    print(f"\ntarget median overhead <= 1 s: {'met' if target else 'MISSED'}")
    return 0 if target else 1


if __name__ == "__main__":
    sys.exit(main())
