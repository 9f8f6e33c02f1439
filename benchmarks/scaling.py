"""Scaling: the same job set on one slot and on N slots, through the real driver.

``run`` starts an embedded Ray cluster with one job slot (one GPU, or ``--cpus-per-job`` cores on a
CPU machine), runs the sweep into ``OUT/serial``, stops Ray, then starts one with N slots and runs
the same jobs into ``OUT/parallel``, ordered longest-first by the times the serial run measured
(``--history``). Each slot gets the same cores in both runs, so a job has the same resources in
both and only contention between concurrent jobs can make it slower. ``table`` prints the figures of
an existing OUT (the two runs may come from separate invocations with ``--phase``):

- makespan: first job dispatched to last row on disk (``dispatch_s`` in run.json), per run;
- scaling efficiency: serial makespan / (N x parallel makespan); target >= 0.85;
- slot utilization: the time job subprocesses ran, summed, / (N x makespan); target >= 90%;
- job-time inflation: mean job time in the parallel run / in the serial run (contention between
  concurrent jobs for host cores, memory bandwidth or PCIe shows here).

    python benchmarks/scaling.py run sweeps/scaling.yaml --out /tmp/scaling [--gpus 2]
    python benchmarks/scaling.py run sweeps/smoke.yaml --out /tmp/s --cpu-slots 2 --cpus-per-job 1
    python benchmarks/scaling.py table /tmp/scaling [--md docs/results/scaling.md]
"""

from __future__ import annotations

import argparse
import io
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from orchestrator.fleet.driver import SweepOptions, run_sweep  # noqa: E402
from orchestrator.spec.sweep import load_spec  # noqa: E402
from store.runlog import read_runs  # noqa: E402
from store.schema import read_results  # noqa: E402

EFFICIENCY_TARGET = 0.85
UTILIZATION_TARGET = 0.90
PHASES = ("serial", "parallel")


def _visible_gpus() -> int:
    try:
        import torch

        return torch.cuda.device_count()
    except Exception:
        return 0


def run_phase(spec_file: str, out: Path, phase: str, args: argparse.Namespace) -> None:
    import ray

    slots = 1 if phase == "serial" else args.slots
    if args.gpus:
        resources = {"num_gpus": slots, "num_cpus": slots * args.cpus_per_job}
    else:
        resources = {"num_gpus": 0, "num_cpus": slots * args.cpus_per_job}
    history = [str(out / "serial")] if phase == "parallel" and (out / "serial" / "results").is_dir() else []
    print(f"== {phase}: {slots} slot(s), {args.cpus_per_job} cores each", flush=True)
    ray.init(address="local", include_dashboard=False, log_to_driver=False, **resources)
    try:
        summary = run_sweep(
            load_spec(spec_file),
            SweepOptions(
                out_dir=out / phase,
                only=args.only,
                cpus_per_job=None if args.gpus else args.cpus_per_job,
                timeout_cap_s=args.timeout_cap,
                history_dirs=history,
                argv=sys.argv,
            ),
            stream=sys.stdout if args.verbose else io.StringIO(),
        )
    finally:
        ray.shutdown()
    print(f"   {summary.counts} in {summary.dispatch_s:.1f} s", flush=True)


def phase_figures(run_dir: Path) -> dict:
    """Makespan, slots, job count and busy time of the last run in `run_dir`."""
    run = read_runs(run_dir)[-1]
    if run.get("dispatch_s") is None:
        raise SystemExit(f"{run_dir}: its last run did not finish (no dispatch_s in run.json)")
    rows = [
        r
        for r in read_results(
            run_dir, columns=["run_id", "status", "subprocess_s", "device_name"]
        ).to_pylist()
        if r["run_id"] == run["run_id"]
    ]
    busy = [r["subprocess_s"] for r in rows if r["subprocess_s"] is not None]
    return {
        "slots": sum(hw["slots"] for hw in run["hardware"].values()),
        "classes": ", ".join(run["hardware"]),
        "device": next((r["device_name"] for r in rows if r.get("device_name")), "?"),
        "jobs": len(rows),
        "ok": sum(r["status"] == "ok" for r in rows),
        "makespan_s": run["dispatch_s"],
        "busy_s": sum(busy),
        "mean_job_s": sum(busy) / len(busy) if busy else float("nan"),
    }


def table(out: Path) -> tuple[str, bool]:
    """The scaling table in Markdown, and whether both targets are met."""
    s, p = (phase_figures(out / phase) for phase in PHASES)
    n = p["slots"]
    efficiency = s["makespan_s"] / (n * p["makespan_s"])
    lines = [
        "| run | slots | jobs | ok | makespan s | job time, summed s | mean job s | slot utilization |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, f in (("serial", s), ("parallel", p)):
        util = f["busy_s"] / (f["slots"] * f["makespan_s"])
        lines.append(
            f"| {name} | {f['slots']} | {f['jobs']} | {f['ok']} | {f['makespan_s']:.1f} | {f['busy_s']:.1f} "
            f"| {f['mean_job_s']:.1f} | {util:.1%} |"
        )
    util = p["busy_s"] / (n * p["makespan_s"])
    inflation = p["mean_job_s"] / s["mean_job_s"]
    met = efficiency >= EFFICIENCY_TARGET and util >= UTILIZATION_TARGET
    lines += [
        "",
        f"- device: {p['device']} (classes: {p['classes']})",
        f"- scaling efficiency = serial makespan / ({n} x parallel makespan) = "
        f"{s['makespan_s']:.1f} / ({n} x {p['makespan_s']:.1f}) = **{efficiency:.3f}** "
        f"(target >= {EFFICIENCY_TARGET})",
        f"- slot utilization over the parallel makespan: **{util:.1%}** (target >= {UTILIZATION_TARGET:.0%})",
        f"- job-time inflation, parallel / serial mean job time: {inflation:.3f}",
        f"- targets: {'met' if met else 'MISSED'}",
    ]
    return "\n".join(lines), met


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run", help="run the serial and the parallel sweep, then print the table")
    r.add_argument("sweep", help="sweep file; every job runs once per phase")
    r.add_argument("--out", type=Path, required=True, help="writes OUT/serial and OUT/parallel")
    r.add_argument("--gpus", type=int, help="GPU slots of the parallel run (default: every visible GPU)")
    r.add_argument(
        "--cpu-slots", type=int, help="on a machine without GPUs: CPU job slots of the parallel run"
    )
    r.add_argument("--cpus-per-job", type=int, help="cores per slot (default: cores / GPUs)")
    r.add_argument("--only", help="as for `orchestrate sweep --only`")
    r.add_argument("--timeout-cap", type=float, help="as for `orchestrate sweep --timeout-cap`")
    r.add_argument("--phase", choices=("both", *PHASES), default="both", help="run one phase only")
    r.add_argument("--verbose", action="store_true", help="show the sweeps' progress lines")
    t = sub.add_parser("table", help="print the table of an existing OUT")
    t.add_argument("out", type=Path)
    for p in (r, t):
        p.add_argument("--md", type=Path, help="also write the table to this Markdown file")
    args = parser.parse_args()

    if args.command == "run":
        if args.cpu_slots:
            args.gpus, args.slots = 0, args.cpu_slots
            args.cpus_per_job = args.cpus_per_job or 1
        else:
            args.gpus = args.gpus or _visible_gpus()
            if not args.gpus:
                parser.error("no GPU visible: pass --cpu-slots N to measure CPU job slots instead")
            args.slots = args.gpus
            args.cpus_per_job = args.cpus_per_job or max(1, (os.cpu_count() or 1) // args.gpus)
        for phase in PHASES if args.phase == "both" else (args.phase,):
            if (args.out / phase / "results").is_dir():
                parser.error(f"{args.out / phase} already holds results; pick another --out")
            run_phase(args.sweep, args.out, phase, args)
        if not all((args.out / phase / "run.json").is_file() for phase in PHASES):
            return 0
    text, met = table(args.out)
    print(text)
    if args.md:
        args.md.parent.mkdir(parents=True, exist_ok=True)
        args.md.write_text(text + "\n")
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
