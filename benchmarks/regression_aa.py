"""Calibrate the regression report on real repeated runs: every pair of sweeps of one cell
(same stack, separate processes) compared by `reports.regression.compare`, as they are (A/A:
no regression expected) and with the current side's compiled samples slowed 10%, wall and
device time alike, as the `ORCHESTRATE_TEST_SLOWDOWN` hook does in a job (expected flagged). A
host-bound cell is judged on its device time, a device-bound one on its wall time
(`compiler.statistics.judged_figure`); the table says which.

Input: the JSON files `benchmarks/noise.py --save FILE` writes (N sweeps of `--repeats`
processes of the same cells). Prints one line per pair and the verdict counts.

    python benchmarks/regression_aa.py noise-resnet.json noise-vit.json [--slowdown 1.10]
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from collections import Counter
from pathlib import Path

import pyarrow as pa

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from compiler import statistics as cstats  # noqa: E402
from reports.regression import compare  # noqa: E402

KEEP = (
    "status",
    "compiled_ms",
    "compile_s",
    "peak_mem_bytes",
    "graph_breaks",
    "recompiles",
    "samples_per_repeat",
    "device_samples_per_repeat",
    "compiled_device_ms",
    "compiled_host_bound_share",
)


def _table(cell: str, row: dict, slow: float, tag: str) -> pa.Table:
    model, bs, dtype, config = cell.split("/")
    data = {k: row.get(k) for k in KEEP}
    data["compiled_samples_ms"] = [x * slow for x in row["compiled_samples_ms"]]
    data["compiled_device_samples_ms"] = [
        x * slow for x in row.get("compiled_device_samples_ms") or []
    ] or None
    if data.get("compiled_device_ms") is not None:
        data["compiled_device_ms"] *= slow
    data.update(hardware=row.get("device_name") or "GPU", model=model, batch_size=int(bs[2:]), dtype=dtype)
    data.update(config=config, job_id=tag, started_at=None)
    return pa.Table.from_pylist([data])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("files", nargs="+", type=Path, help="noise.py --save outputs")
    parser.add_argument(
        "--slowdown", type=float, default=1.10, help="factor applied to one side (default 1.10)"
    )
    args = parser.parse_args(argv)
    thresholds = cstats.load_thresholds()
    counts: dict[float, dict[str, int]] = {1.0: {}, args.slowdown: {}}
    latency: dict[float, Counter] = {1.0: Counter(), args.slowdown: Counter()}
    print(
        "| cell | sweeps | slowdown | verdict | latency | compile time | judged on "
        "| wall: current / baseline [CI] | device: current / baseline [CI] |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for path in args.files:
        for cell, runs in json.loads(path.read_text())["cells"].items():
            for a, b in itertools.combinations(range(len(runs)), 2):
                for slow in (1.0, args.slowdown):
                    tag = f"{cell}-{a}-{b}-{slow}"
                    got = compare(
                        _table(cell, runs[a], slow, tag), _table(cell, runs[b], 1.0, tag + "b"), thresholds
                    )
                    c = got.cells[0]
                    counts[slow][c.verdict] = counts[slow].get(c.verdict, 0) + 1
                    ci = f"{c.latency_ratio:.3f} [{c.latency_ci[0]:.3f}, {c.latency_ci[1]:.3f}]"
                    dev = (
                        "-"
                        if c.device_ratio is None
                        else f"{c.device_ratio:.3f} [{c.device_ci[0]:.3f}, {c.device_ci[1]:.3f}]"
                    )
                    share = c.host_bound_share[1]
                    judged = f"{c.judged_on}" + ("" if share is None else f" (idle {share:.0%})")
                    figures = " | ".join(c.by_figure.get(f, "unchanged") for f in ("latency", "compile_time"))
                    latency[slow][c.by_figure.get("latency", "unchanged")] += 1
                    print(
                        f"| {cell} | {a} vs {b} | x{slow:g} | {c.verdict} | {figures} | {judged} | {ci} | {dev} |"
                    )
    for slow, found in counts.items():
        print(f"slowdown x{slow:g}: {found}; latency alone: {dict(latency[slow])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
