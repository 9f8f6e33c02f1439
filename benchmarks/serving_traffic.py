"""Serving real traffic: a seeded trace of requests drawn from a serving profile, replayed against
three ways of serving one model, each in fresh processes.

- `served`: the project's plan (`compiler.serving.served`), prepared before the first request:
  `compile_tuned(model, inputs, EXPORT, model_name=..., serving=PROFILE)` with `--export`, else
  the plan `compile_tuned` would decide at load for `--mode` (the padding check, then buckets or
  one dynamic-batch graph);
- `oracle`: the per-size optimum, one graph specialized for every batch size of the range, all
  prepared before the first request (what an exact preset per batch size would serve): compiled
  with `torch.compile` (`--oracle compile`), or an AOTInductor package per size (`--oracle
  packages`, built before it starts; with `--export`, its bucket packages serve their own
  sizes), the fair oracle for a served plan of packages; with `--export`, in the config and
  precision of its preset (mode, freezing, options, runtime settings such as `cudnn_enabled:
  false`), as the served plan runs;
- `stock`: what a stock PyTorch user runs, plain `torch.compile(model)` in the model's own dtype
  (`--stock-dtype`, fp32) under torch's runtime defaults, in each `--stock-mode` (compiled on its
  first request, recompiling as new sizes arrive: the stalls are reported apart and left out of
  its latencies); the faster mode is the stock user.

Each process builds the model from its sweep id with random weights (as a sweep's job does, in
the precision `--dtype`), runs the trace once as the requests arrive (the first request of each
size is its first call), and reports per request its wall time. Each side compiles into Inductor
caches of its own, cold. The oracle's sizes may be spread over `--oracle-processes` processes,
prepared at once and replayed one after another (each only its sizes' requests). The table gives
each side's preparation time, Dynamo graphs compiled after preparation (Dynamo's own counter; the
served plan and the oracle must show 0), the largest first call of a size, the stalls, p50 and p99
(stalls excluded) and the traffic-weighted mean latency (each size's median, weighted by the
profile), then served / oracle and stock / served on it. A fresh process's prepare varies from run
to run: with `--prepare-repeats N` the served plan is prepared in N fresh processes (the first
replays the trace) and its prepare time is the slowest of them, each one listed, doubted where
other processes took more of a process's cores while it prepared than a row's timing may share
(`compiler.statistics.other_share_doubt`). `--summary FILE` adds the model's figures to a serving
summary (docs/results/serving-summary.json) under `--budget`.

    python benchmarks/serving_traffic.py MODEL_ID [--name NAME] [--export DIR] [--min 1] [--max 32]
        [--traffic 1:0.4,8:0.6] [--requests 400] [--seed 0] [--dtype fp32] [--mode default]
        [--stock-mode default[,reduce-overhead]] [--stock-dtype fp32] [--oracle compile|packages]
        [--oracle-processes 1] [--prepare-repeats 1]
        [--device cpu|cuda] [--input-size N] [--save FILE.json] [--summary FILE --budget NAME]

`--small` is the CPU mode CI's benchmark tier runs: batch 1..4, 40 requests.
Exit 1 where the served plan compiled after preparation.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from serving_oracle import (  # noqa: E402  (beside this file)
    build_oracle_packages,
    compile_config,
    export_precision,
    load_oracle_packages,
    run_oracle,
)
from serving_summary import add_to_summary  # noqa: E402

from compiler.env import cold_caches, project_pythonpath  # noqa: E402
from compiler.host_state import HostShare  # noqa: E402
from compiler.serving.traffic import ServingProfile, weighted_mean  # noqa: E402
from compiler.statistics import other_share_doubt, percentile, summarize  # noqa: E402

SIDES = ("served", "oracle", "stock")


def trace(profile: ServingProfile, requests: int, seed: int) -> list[int]:
    """`requests` batch sizes drawn from the profile's traffic with `seed`."""
    sizes, weights = zip(*profile.traffic, strict=True)
    return random.Random(seed).choices(sizes, weights, k=requests)


def _build(args: argparse.Namespace, dtype: str, stock: bool):
    """The model and one call's (args, kwargs) at batch `--max` in `dtype`, built as a sweep's job
    builds it: under torch's runtime defaults for the stock user, else under the preset's
    (`compile_config`)."""
    from compiler.aoti import split_inputs
    from compiler.config import CompileConfig
    from workers.bench.run import JobRun

    spec = {
        "id": args.model_id,
        "name": args.name,
        **({"input_size": args.input_size} if args.input_size else {}),
    }
    entry = {"model_spec": spec, "batch_size": args.max}
    hardware = "cpu" if args.device == "cpu" else "gpu"
    config = CompileConfig(name=args.mode) if stock else compile_config(args)
    run = JobRun.for_preset("serving-traffic", hardware, entry, config, dtype)
    run.imports()
    model, input_sets, _ = run.build(keep_fp32_copy=False)
    return model, split_inputs(input_sets[0])


def _prepare(side: str, args: argparse.Namespace, profile: ServingProfile, model, example):
    """(the callable that serves a request, preparation seconds, what compile_tuned applied or {})."""
    import torch

    from compiler.serving.applied import Applied
    from compiler.serving.served import serve_range

    t0 = time.perf_counter()
    if side.startswith("stock:"):
        smode = side.split(":", 1)[1]
        return torch.compile(model, mode=None if smode == "default" else smode), 0.0, {}
    if side == "served" and args.export:
        from compiler.serving import compile_tuned

        served, applied = compile_tuned(
            model, example[1] or example[0], args.export, model_name=args.name, serving=profile.to_dict()
        )
        return served, time.perf_counter() - t0, applied.to_dict()
    config = compile_config(args)
    model = config.prepare_model(model)  # channels-last where the config says so, as an export job runs it
    entry = {"precision": args.dtype}
    if (
        side == "oracle" and args.oracle_dir
    ):  # a package per size, built by serving_oracle.build_oracle_packages
        return load_oracle_packages(args, profile, model, example, Path(args.oracle_dir), t0)
    if side == "oracle":  # one specialized graph per size: buckets at every size, nothing padded
        entry["serving"] = {
            "profile": profile.to_dict(),
            "plan": "buckets",
            "buckets": profile.sizes(),
            "padding": {"ok": True},
        }
    applied = Applied(source="", hardware="", stack={})
    config.apply_globals()  # e.g. freezing: the preset's own, as its package was built with
    served = serve_range(
        lambda dynamic: torch.compile(model, **{**config.compile_kwargs(), "dynamic": dynamic}),
        model,
        example,
        profile,
        entry,
        config,
        applied,
    )
    return served, time.perf_counter() - t0, {"serving": applied.serving}


def child(side: str, args: argparse.Namespace) -> dict:
    """One side in this (fresh) process: prepare, then replay the trace; its measurements. An
    oracle process given `--sizes` prepares and replays those sizes only, and with `--wait` says
    `READY` once prepared and replays when a line arrives on its stdin (`serving_oracle.run_oracle`)."""
    import torch

    from compiler.env import process_facts
    from compiler.serving.padding import resize_batch
    from compiler.serving.served import graph_count

    profile = _profile(args)
    sizes = [int(n) for n in args.sizes.split(",")] if args.sizes else None
    if sizes:
        profile = ServingProfile.from_dict({"batch": {"min": min(sizes), "max": max(sizes)}})
    stock = side.startswith("stock:")
    model, example = _build(args, args.stock_dtype if stock else args.dtype, stock)
    host = HostShare(children=True)  # its waited children's work is its own, as in a cold prepare
    serve, prepare_s, applied = _prepare(side, args, profile, model, example)
    other_share = host.since()  # other processes' share of this one's cores while it prepared
    cuda = args.device == "cuda"
    if args.wait:
        print("READY", flush=True)
        sys.stdin.readline()
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    graphs0 = graph_count()
    seen: set[int] = set()
    requests = []
    for size in trace(_profile(args), args.requests, args.seed):
        if sizes and size not in sizes:
            continue
        call_args, call_kwargs = resize_batch(*example, size)
        if cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        with torch.no_grad():
            serve(*call_args, **call_kwargs)
        if cuda:
            torch.cuda.synchronize()
        requests.append({"size": size, "s": time.perf_counter() - t0, "first": size not in seen})
        seen.add(size)
    graphs = graph_count()
    return {
        "side": side,
        "process": process_facts(),
        "prepare_s": prepare_s,
        "prepare_other_share": other_share,
        "compiles_after_prepare": None if graphs is None or graphs0 is None else graphs - graphs0,
        "requests": requests,
        "applied": applied,
        # the process's peak of memory the caching allocator held while serving: the weights and
        # every graph's pool of the plan
        "peak_mem_bytes": torch.cuda.max_memory_reserved() if cuda else None,
    }


def summary(side: dict, profile: ServingProfile) -> dict:
    """A side's figures from its requests: stalls (first calls of a size), p50/p99 and the
    traffic-weighted mean of each size's median (stalls excluded)."""
    steady = [r for r in side["requests"] if not r["first"]]
    firsts = {r["size"]: r["s"] for r in side["requests"] if r["first"]}
    by_size: dict[int, list[float]] = {}
    for r in steady:
        by_size.setdefault(r["size"], []).append(r["s"] * 1e3)
    medians = {s: summarize(v).median_ms for s, v in by_size.items()}
    for s in firsts:  # a size drawn once: its first call is all there is
        medians.setdefault(s, firsts[s] * 1e3)
    drawn = ServingProfile.from_dict(
        {**profile.to_dict(), "traffic": {str(s): w for s, w in profile.traffic if s in medians}}
    )
    latencies = sorted(r["s"] * 1e3 for r in steady) or [0.0]
    return {
        "side": side["side"],
        "prepare_s": side["prepare_s"],
        "compiles_after_prepare": side["compiles_after_prepare"],
        "max_first_call_s": max(firsts.values()),
        "stall_s": sum(firsts.values()),
        "p50_ms": percentile(latencies, 50),
        "p99_ms": percentile(latencies, 99),
        "weighted_ms": weighted_mean(medians, drawn),
        "per_size_ms": {str(s): medians[s] for s in sorted(medians)},
    }


def _profile(args: argparse.Namespace) -> ServingProfile:
    data: dict = {"batch": {"min": args.min, "max": args.max}}
    if args.traffic:
        data["traffic"] = {k: float(v) for k, v in (pair.split(":") for pair in args.traffic.split(","))}
    return ServingProfile.from_dict(data)


def _env(cache: str) -> dict[str, str]:
    """A child's environment: this project importable, and a fresh node's caches, empty, in
    `cache` (`compiler.env.cold_caches`: Inductor's and the CUDA driver's JIT cache)."""
    return {
        **os.environ,
        "PYTHONPATH": project_pythonpath(os.environ.get("PYTHONPATH")),
        **cold_caches(cache),
    }


def _run_child(side: str, argv: list[str], cache: str) -> dict:
    done = subprocess.run(
        [sys.executable, __file__, *argv, "--child", side],
        capture_output=True,
        text=True,
        timeout=3600,
        env=_env(cache),
    )
    if done.returncode != 0:
        raise SystemExit(f"the {side} process failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model_id", nargs="?", default="python:workers.toy:mlp", help="a sweep's model id")
    p.add_argument("--name", default="model", help="the model's name (in the export, with --export)")
    p.add_argument("--export", help="an export directory: the served side uses compile_tuned with it")
    p.add_argument("--min", type=int, default=1, help="the range's smallest batch size (default 1)")
    p.add_argument("--max", type=int, default=32, help="the range's largest batch size (default 32)")
    p.add_argument("--traffic", help="weights per size, e.g. 1:0.4,8:0.6 (default: uniform over the range)")
    p.add_argument("--requests", type=int, default=400, help="requests in the trace (default 400)")
    p.add_argument("--seed", type=int, default=0, help="the trace's seed (default 0)")
    p.add_argument(
        "--dtype",
        help="precision policy the served plan and the oracle run (default: with --export, the "
        "precision its preset of --name runs in, which --dtype must then name; else fp32)",
    )
    p.add_argument(
        "--mode",
        default="default",
        help="torch.compile mode of the served plan and the oracle (with --export, the oracle compiles "
        "with its preset's own config instead)",
    )
    p.add_argument(
        "--stock-mode",
        default="default",
        help="torch.compile mode(s) of the stock user, comma-separated: each runs in its own process, "
        "the faster (traffic-weighted, stalls excluded) is the stock user (default default)",
    )
    p.add_argument(
        "--stock-dtype",
        default="fp32",
        help="the stock user's precision: the model's own dtype (default fp32)",
    )
    p.add_argument(
        "--oracle",
        choices=["compile", "packages"],
        default="compile",
        help="how the oracle serves each size: compile (torch.compile with --mode, dynamic=False: a "
        "graph per size, default) or packages (an AOTInductor package per size, built before it "
        "starts, spread over the GPUs: as a served plan of packages serves its buckets)",
    )
    p.add_argument(
        "--oracle-processes",
        type=int,
        default=1,
        help="processes the oracle's sizes are spread over, prepared at once and replayed one after "
        "another (default 1)",
    )
    p.add_argument(
        "--device", default="cpu", choices=["cpu", "cuda"], help="where the model runs (default cpu)"
    )
    p.add_argument(
        "--prepare-repeats",
        type=int,
        default=1,
        help="fresh processes the served plan is prepared in (the first replays the trace, the others "
        "only prepare); its prepare time is the slowest of them, each listed (default 1)",
    )
    p.add_argument("--input-size", type=int, help="the model's input size (a sweep entry's input_size)")
    p.add_argument("--save", type=Path, help="write every request's measurement to this JSON file")
    p.add_argument(
        "--summary",
        type=Path,
        help="add this model's figures to a serving summary (docs/results/serving-summary.json), "
        "under --budget, replacing the model's entry there",
    )
    p.add_argument(
        "--budget", default="bf16", help="the export's accuracy budget, for --summary (default bf16)"
    )
    p.add_argument("--small", action="store_true", help="CI's CPU mode: batch 1..4, 40 requests")
    p.add_argument("--child", help=argparse.SUPPRESS)
    p.add_argument("--sizes", help=argparse.SUPPRESS)
    p.add_argument("--wait", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--oracle-dir", help=argparse.SUPPRESS)
    return p


def _prepared(side: dict) -> dict:
    """What preparing took in one served process: its seconds and, where compile_tuned timed them,
    its steps and each bucket's seconds."""
    serving = (side.get("applied") or {}).get("serving") or {}
    steps, buckets = serving.get("prepare_steps"), serving.get("bucket_prepare_s")
    return {
        "prepare_s": side["prepare_s"],
        "other_share": side.get("prepare_other_share"),
        **({"steps": steps} if steps else {}),
        **({"bucket_prepare_s": buckets} if buckets else {}),
    }


def _summary_entry(args: argparse.Namespace, sides: dict, rows: dict, stock_side: str) -> dict:
    """A model's figures for the serving summary (`--summary`)."""
    serving = sides["served"]["applied"].get("serving") or {}
    served, oracle, stock = (rows[s]["weighted_ms"] for s in ("served", "oracle", stock_side))
    slowest = max(sides["served"]["prepare_runs"], key=lambda r: r["prepare_s"])
    return {
        "model": args.name,
        "precision": args.dtype,
        "plan": serving.get("plan"),
        "buckets": serving.get("buckets") or [],
        "prepare_s": rows["served"]["prepare_s"],
        **({"prepare_s_runs": rows["served"]["prepare_s_runs"]} if args.prepare_repeats > 1 else {}),
        "prepare_other_shares": rows["served"]["prepare_other_shares"],
        "max_first_call_s": rows["served"]["max_first_call_s"],
        "compiles_after_prepare": rows["served"]["compiles_after_prepare"],
        "weighted_ms_served": served,
        "weighted_ms_oracle": oracle,
        "oracle": f"{args.oracle}: {'an AOTInductor package' if args.oracle == 'packages' else 'torch.compile'} "
        f"of {compile_config(args).name} per batch size",
        "weighted_ms_stock": stock,
        "stock_mode": stock_side.split(":", 1)[1],
        "stall_s_stock": rows[stock_side]["stall_s"],
        "p99_ms_served": rows["served"]["p99_ms"],
        "p99_ms_stock": rows[stock_side]["p99_ms"],
        "peak_mem_gib": (sides["served"]["peak_mem_bytes"] or 0) / 2**30,
        "plan_mem_gib": (serving.get("reserved_bytes") or 0) / 2**30,
        "package": (sides["served"]["applied"] or {}).get("package"),
        # the steps and buckets of the slowest fresh process, the one whose seconds prepare_s reports
        **({"prepare_steps": slowest["steps"]} if slowest.get("steps") else {}),
        **({"bucket_prepare_s": slowest["bucket_prepare_s"]} if slowest.get("bucket_prepare_s") else {}),
        "process": sides["served"].get("process") or {},
    }


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = _parser().parse_args(argv)
    if args.small:
        args.min, args.max, args.requests = 1, 4, 40
        argv = [a for a in argv if a != "--small"] + ["--min", "1", "--max", "4", "--requests", "40"]
    if args.child:
        print(json.dumps(child(args.child, args)))
        return 0
    precision = export_precision(args)
    if args.dtype and precision and args.dtype != precision:
        raise SystemExit(
            f"--dtype {args.dtype}: the preset of {args.name} in {args.export} runs in {precision}, "
            f"which the served plan and the oracle must both run: pass --dtype {precision} or leave it out"
        )
    args.dtype = args.dtype or precision or "fp32"
    argv = [*argv, "--dtype", args.dtype]  # each child runs the precision decided here
    profile = _profile(args)
    print(
        f"{args.model_id}: {profile.describe()}, {args.requests} requests (seed {args.seed}), "
        f"{args.dtype} on {args.device} (stock user: {args.stock_dtype})"
    )
    sides: dict[str, dict] = {}
    with tempfile.TemporaryDirectory(prefix="serving-traffic-") as caches:  # each side's caches cold
        sides["served"] = _run_child("served", argv, f"{caches}/served")
        again = [  # the served plan prepared in more fresh processes, each replaying nothing
            _run_child("served", [*argv, "--requests", "0"], f"{caches}/served-{i}")
            for i in range(1, max(1, args.prepare_repeats))
        ]
        sides["served"]["prepare_runs"] = [_prepared(side) for side in (sides["served"], *again)]
        if args.oracle == "packages":
            build = build_oracle_packages(args, profile, Path(caches))
            sides["oracle"] = _run_child("oracle", [*argv, "--oracle-dir", caches], f"{caches}/oracle")
            sides["oracle"]["package_build"] = build
        else:
            sides["oracle"] = run_oracle(
                __file__, _env(f"{caches}/oracle"), argv, profile, max(1, args.oracle_processes)
            )
        for mode in args.stock_mode.split(","):
            sides[f"stock:{mode}"] = _run_child(f"stock:{mode}", argv, f"{caches}/stock-{mode}")
    rows = {side: summary(sides[side], profile) for side in sides}
    runs = [r["prepare_s"] for r in sides["served"]["prepare_runs"]]
    shares = [r["other_share"] for r in sides["served"]["prepare_runs"]]
    # the slowest fresh process's, and what share of each one's cores other processes took
    rows["served"].update(prepare_s=max(runs), prepare_s_runs=runs, prepare_other_shares=shares)
    stock_side = min((s for s in rows if s.startswith("stock:")), key=lambda s: rows[s]["weighted_ms"])
    print(
        "| side | prepare s | compiles after prepare | max first call s | stalls s | p50 ms | p99 ms | weighted ms |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for side, r in rows.items():
        print(
            f"| {side} | {r['prepare_s']:.2f} | {r['compiles_after_prepare']} | {r['max_first_call_s']:.3f} | "
            f"{r['stall_s']:.2f} | {r['p50_ms']:.3f} | {r['p99_ms']:.3f} | {r['weighted_ms']:.3f} |"
        )
    served, oracle, stock = (rows[s]["weighted_ms"] for s in ("served", "oracle", stock_side))
    serving = sides["served"]["applied"].get("serving") or {}
    doubt = other_share_doubt(shares, doing="prepared")
    if len(runs) > 1 or doubt:
        print(
            f"served prepare in {len(runs)} fresh processes: {', '.join(f'{r:.2f}' for r in runs)} s"
            + (f" (doubted: {doubt})" if doubt else "")
        )
    print(
        f"served plan: {serving.get('plan')} {serving.get('buckets') or ''}; served / oracle "
        f"{served / oracle:.3f}x; {stock_side} / served {stock / served:.3f}x (stalls excluded)"
    )
    if args.save:
        args.save.write_text(
            json.dumps({"profile": profile.to_dict(), "sides": sides, "summary": rows}, indent=1)
        )
    if args.summary:
        entry = _summary_entry(args, sides, rows, stock_side)
        add_to_summary(args.summary, args, profile, entry)
    return 1 if rows["served"]["compiles_after_prepare"] else 0


if __name__ == "__main__":
    sys.exit(main())
