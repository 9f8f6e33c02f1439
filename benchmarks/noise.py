"""Process-to-process noise of one cell: the same job in N fresh processes, one after another.

Default cell: ResNet-50 (HF config, random weights), batch 1, fp32, reduce-overhead, on the GPU
if there is one. Each process compiles cold in its own cache and measures eager and compiled
interleaved. Prints each process's medians and the spread, (max - min) / median, of the
compiled median and of the speedup. Target: compiled-median spread <= 3%.

    python benchmarks/noise.py [--processes 5] [--model hf:microsoft/resnet-50] [--mode reduce-overhead]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from compiler.config import CompileConfig  # noqa: E402
from workers.job import Job, MeasureSpec, ModelSpec, software_stack  # noqa: E402
from workers.runner import run_job  # noqa: E402


def spread(values: list[float]) -> float:
    return (max(values) - min(values)) / statistics.median(values)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--processes", type=int, default=5)
    parser.add_argument("--model", default="hf:microsoft/resnet-50")
    parser.add_argument("--batch-size", type=int, default=1)
    parser.add_argument("--dtype", default="fp32")
    parser.add_argument("--mode", default="reduce-overhead")
    parser.add_argument("--iterations", type=int, default=200)
    parser.add_argument("--device", choices=["auto", "cuda", "cpu"], default="auto")
    parser.add_argument(
        "--threads", type=int, default=os.cpu_count() or 1, help="OMP/compile threads per process"
    )
    args = parser.parse_args()

    device = args.device
    if device == "auto":
        import torch

        device = "cuda" if torch.cuda.is_available() else "cpu"
    job = Job(
        sweep="noise",
        hardware=device,
        device=device,
        model=ModelSpec(id=args.model, name=args.model.rsplit("/", 1)[-1]),
        batch_size=args.batch_size,
        dtype=args.dtype,
        config=CompileConfig(name=args.mode, mode=args.mode),
        measure=MeasureSpec(warmup=10, iterations=args.iterations, rounds=10, flops=False),
        timeout_s=900,
        stack=software_stack(),
    )
    print(f"{job.name} ({args.model}) in {args.processes} fresh processes on {device}\n")
    print(
        f"{'proc':>4} {'status':>8} {'eager ms':>10} {'compiled ms':>12} {'speedup':>8} {'95% CI':>15} {'compile s':>10}"
    )
    rows = []
    for i in range(args.processes):
        r = run_job(job, threads=args.threads)
        rows.append(r)
        if r.get("status") != "ok":
            print(f"{i + 1:>4} {r.get('status'):>8} {r.get('error', '')[:200]}")
            continue
        ci = f"[{r['speedup_ci_low']:.2f}, {r['speedup_ci_high']:.2f}]"
        print(
            f"{i + 1:>4} {'ok':>8} {r['eager_ms']:>10.3f} {r['compiled_ms']:>12.3f} {r['speedup']:>8.2f} "
            f"{ci:>15} {r['compile_s']:>10.1f}"
        )
    ok = [r for r in rows if r.get("status") == "ok"]
    if len(ok) < 2:
        print("fewer than two ok processes: no spread")
        return 1
    compiled = [r["compiled_ms"] for r in ok]
    eager = [r["eager_ms"] for r in ok]
    speedups = [r["speedup"] for r in ok]
    print(f"\n{'spread (max - min) / median':<32} {'value':>8}")
    print(f"{'compiled median':<32} {spread(compiled):>7.2%}")
    print(f"{'eager median':<32} {spread(eager):>7.2%}")
    print(f"{'speedup':<32} {spread(speedups):>7.2%}")
    met = spread(compiled) <= 0.03
    print(f"\ntarget compiled-median spread <= 3%: {'met' if met else 'MISSED'} ({len(ok)} processes)")
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
