"""Do a cell's figures hold from sweep to sweep? The same cell in several separate sweeps.

Two cells by default, as in the seed vision suite: a launch-bound one (ResNet-50, batch 1,
tf32, default mode: the host issuing kernels is most of its time) and a GPU-bound one (ViT-base,
batch 16, fp32, default). Each sweep runs the cell as `orchestrate sweep` would, through
`workers.runner.run_job`: `--repeats` fresh processes (the first compiles cold in its own cache,
the later ones warm against it), samples pooled, intervals from the hierarchical bootstrap of
`compiler.statistics`. Sweeps share nothing but the machine.

For each cell it prints every sweep's medians with their 95% intervals, clocks and compile
times, then the spread (max / min - 1) of the eager median, the compiled median and the speedup
across the sweeps, and whether each sweep's interval contains the median of all sweeps. Target
(the reproducibility target): speedup spread <= 5%, or every sweep's speedup interval contains that median.

    python benchmarks/noise.py                        # both cells, 5 sweeps of 3 processes, GPU if any
    python benchmarks/noise.py --cells resnet-50 --sweeps 5 --repeats 3 --save noise.json
    python benchmarks/noise.py --small --device cpu --sweeps 3 --repeats 2   # reduced models, minutes on CPU
    python benchmarks/noise.py --small --device cpu --cells mlp --sweeps 2 --repeats 1 --warmup 1 \
        --iterations 5 --rounds 1 --threads 1   # tests/test_benchmarks.py: the toy MLP, seconds
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from compiler.config import CompileConfig  # noqa: E402
from compiler.job import Job, MeasureSpec, ModelSpec, software_stack  # noqa: E402
from reports.measurement import spread_table, sweep_table  # noqa: E402
from workers.runner import run_job  # noqa: E402


@dataclass(frozen=True)
class Cell:
    name: str
    kind: str
    model_id: str
    batch_size: int
    dtype: str
    mode: str | None


CELLS = {
    "resnet-50": Cell(
        "resnet-50/bs1/tf32/default", "launch-bound", "hf:microsoft/resnet-50", 1, "tf32", None
    ),
    "vit": Cell("vit/bs16/fp32/default", "GPU-bound", "hf:google/vit-base-patch16-224", 16, "fp32", None),
    # the two cells of sweeps/regression-gpu.yaml: vit above and this one
    "resnet-50-fp32": Cell(
        "resnet-50/bs16/fp32/default", "GPU-bound", "hf:microsoft/resnet-50", 16, "fp32", None
    ),
    # an H100 sweep saw bimodal compiled samples here (p10 2.76 ms, median 4.04, p90 4.53)
    "resnet-50-bs16": Cell(
        "resnet-50/bs16/tf32/default", "bimodal on an H100", "hf:microsoft/resnet-50", 16, "tf32", None
    ),
    # the toy MLP: a cell that compiles in seconds on a CPU, for the benchmark's own test
    "mlp": Cell("mlp/bs1/fp32/default", "toy", "python:workers.toy:mlp", 1, "fp32", None),
}


def make_job(cell: Cell, args: argparse.Namespace, device: str) -> Job:
    overrides, input_size = {}, None
    if args.small and cell.model_id.startswith("hf:"):  # the zoo's reduced architecture, for a CPU
        from workers import zoo

        overrides = copy.deepcopy(zoo.SMALL_OVERRIDES[cell.model_id])
        input_size = 64
    return Job(
        sweep="noise",
        hardware=device,
        device=device,
        model=ModelSpec(
            id=cell.model_id, name=cell.name.split("/")[0], input_size=input_size, overrides=overrides
        ),
        batch_size=cell.batch_size,
        dtype=cell.dtype,
        config=CompileConfig(name=cell.mode or "default", mode=cell.mode),
        measure=MeasureSpec(
            warmup=args.warmup,
            iterations=args.iterations,
            rounds=args.rounds,
            repeats=args.repeats,
            flops=False,
        ),
        timeout_s=args.timeout,
        stack=software_stack(),
    )


def print_cell(cell: Cell, rows: list[dict]) -> bool:
    print(f"\n### {cell.name} ({cell.kind})\n")
    print(sweep_table(rows))
    text, met = spread_table(rows)
    print("\n" + text)
    return met


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--cells",
        default="resnet-50,vit",
        help=f"comma-separated cells among {', '.join(CELLS)} (default: resnet-50,vit)",
    )
    parser.add_argument("--sweeps", type=int, default=5, help="separate sweeps of each cell (default 5)")
    parser.add_argument(
        "--repeats", type=int, default=3, help="measure.repeats: processes per sweep (default 3)"
    )
    parser.add_argument("--warmup", type=int, default=10, help="measure.warmup (default 10)")
    parser.add_argument(
        "--iterations", type=int, default=50, help="measure.iterations per process (default 50)"
    )
    parser.add_argument("--rounds", type=int, default=10, help="measure.rounds (default 10)")
    parser.add_argument("--timeout", type=float, default=900, help="per-process time limit, s (default 900)")
    parser.add_argument("--device", choices=["auto", "cuda", "cpu"], default="auto")
    parser.add_argument(
        "--threads", type=int, default=os.cpu_count() or 1, help="cores (OMP/compile threads) per job process"
    )
    parser.add_argument("--small", action="store_true", help="reduced architectures (for a CPU machine)")
    parser.add_argument(
        "--pin-timing-thread",
        action="store_true",
        help="experiment: the thread that times the calls stays on one core during the timed rounds",
    )
    parser.add_argument(
        "--save", metavar="FILE", help="write every sweep's row fields as JSON (after each sweep)"
    )
    args = parser.parse_args()

    unknown = [c for c in args.cells.split(",") if c not in CELLS]
    if unknown:
        parser.error(f"unknown cell(s) {unknown}; choose among {', '.join(CELLS)}")
    if args.pin_timing_thread:
        from workers.bench import PIN_TIMING_THREAD_ENV

        os.environ[PIN_TIMING_THREAD_ENV] = "1"  # inherited by the job processes
    device = args.device
    if device == "auto":
        import torch

        device = "cuda" if torch.cuda.is_available() else "cpu"
    saved: dict[str, list[dict]] = {}
    met_all = True
    for key in args.cells.split(","):
        cell = CELLS[key]
        job = make_job(cell, args, device)
        print(
            f"\n{cell.name}: {args.sweeps} sweeps x {args.repeats} processes on {device} "
            f"({args.iterations} timed calls per side per process)",
            flush=True,
        )
        rows = []
        for i in range(args.sweeps):
            t0 = time.monotonic()
            row = run_job(job, threads=args.threads)
            row["wall_s"] = time.monotonic() - t0
            rows.append(row)
            print(
                f"  sweep {i + 1}/{args.sweeps}: {row.get('status')} in {row['wall_s']:.0f} s"
                + (f", speedup {row['speedup']:.3f}" if row.get("speedup") else ""),
                flush=True,
            )
            saved[cell.name] = rows
            if args.save:
                Path(args.save).write_text(json.dumps({"args": vars(args), "device": device, "cells": saved}))
        met_all &= print_cell(cell, rows)
    return 0 if met_all else 1


if __name__ == "__main__":
    sys.exit(main())
