"""Where a buckets plan's prepare goes, bucket by bucket: the packages of a model at a few batch
sizes, built once (processes of their own, spread over the GPUs, as an export builds them), then
prepared in fresh processes as `compile_tuned` prepares a buckets plan (`load_buckets`: one eager
reference at the largest bucket, then each package loaded, run once, warmed up, captured and
checked, largest first), under each condition of `--conditions`:

- `served`: as `compile_tuned` prepares them on a new node, and as the export's cold prepare and
  the traffic benchmark's processes measure it: each package's first run makes its bucket's cuDNN
  plans, one bucket after another, with a new node's caches, empty, of its own
  (`compiler.env.cold_caches`: Inductor's and the CUDA driver's JIT cache);
- `warm`: the same with this user's caches as they are (a node that has started the model
  before: `~/.nv/ComputeCache` or `CUDA_CACHE_PATH`, and Inductor's cache);
- `cold-jit`: this user's Inductor cache, but the driver's JIT cache empty: against `warm`, what
  the JIT cache saves; against `served`, what the Inductor cache does (on the CPU, a package's
  first load compiles Inductor's vector ISA probes there: 8.5 s on a 2-core machine);
- `no-cudnn`: as `served`, with cuDNN off (`torch.backends.cudnn.enabled = False`): no plan to
  make, at the cost of PyTorch's own convolution kernels in the steady state;
- `cudnn-v7`: as `served`, with PyTorch's legacy cuDNN v7 API (`TORCH_CUDNN_V8_API_DISABLED=1`,
  read once per process): an algorithm per convolution from cuDNN's heuristics instead of the v8
  API's engine configs and execution plans, whether that makes a bucket's first run cheaper.

Each condition runs in `--repeats` fresh processes (a fresh process's first calls vary from one to
the next). The table gives per process the eager reference's seconds,
the sum of the packages' first runs, the whole prepare, each bucket's first run and, once
prepared, each bucket's steady latency in ms: the median of 20 per-call times after one untimed
call (`compiler.measure.time_calls`: CUDA events around each call on a GPU, as the export times
a plan's sizes).

    python benchmarks/bucket_prepare.py MODEL_ID [--sizes 32,16,8,3] [--dtype bf16]
        [--mode reduce-overhead] [--device cuda] [--conditions served,warm,cold-jit,no-cudnn,cudnn-v7]
        [--repeats 1] [--packages DIR]

`--packages DIR` keeps the packages there and reuses them on the next run; the folder and its
files must be this user's and writable by no one else (a package is code the processes run).

`--small` is the CPU mode CI's benchmark tier runs: the toy conv_bn model at sizes 4 and 2, fp32,
mode default, condition `served`.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from compiler.env import cold_caches, project_pythonpath  # noqa: E402

CONDITIONS = ("served", "warm", "cold-jit", "no-cudnn", "cudnn-v7")


def _run(args: argparse.Namespace):
    """The JobRun of the model's cell at the largest size, as a sweep's job builds it."""
    from compiler.config import CompileConfig
    from workers.bench.run import JobRun

    mode = None if args.mode == "default" else args.mode
    config = CompileConfig(name=args.mode, mode=mode)
    spec = {"id": args.model_id, "name": "model"}
    hardware = "cpu" if args.device == "cpu" else "gpu"
    return JobRun.for_preset(
        "bucket-prepare", hardware, {"model_spec": spec, "batch_size": max(args.sizes)}, config, args.dtype
    )


def not_private(folder: Path) -> str:
    """Why the packages in `folder` could be someone else's (a package is a compiled library the
    child processes run): the folder or a file in it not owned by this user, or writable by
    others; "" when neither."""
    for path in (folder, *folder.iterdir()):
        st = path.stat()
        if st.st_uid != os.getuid() or st.st_mode & 0o022:
            return f"{path} is not this user's alone (owner {st.st_uid}, mode {st.st_mode & 0o777:o})"
    return ""


def build(args: argparse.Namespace, folder: Path) -> dict:
    """Each size's package in `folder` (`workers.bench.serving.package_buckets`), unless
    `folder/built.json` already lists them; what was built, by size."""
    from workers.bench.serving import package_buckets

    listed = folder / "built.json"
    if listed.exists():
        return {int(b): info for b, info in json.loads(listed.read_text()).items()}
    os.environ["PYTHONPATH"] = project_pythonpath(os.environ.get("PYTHONPATH"))
    t = time.perf_counter()
    built, info, why = package_buckets(_run(args), sorted(args.sizes), folder / "bucket.pt2")
    if why:
        raise SystemExit(f"the packages failed: {why}")
    print(f"built {len(built)} packages in {time.perf_counter() - t:.0f} s ({info})", flush=True)
    listed.write_text(json.dumps({str(b): v for b, v in built.items()}))
    return built


def child(args: argparse.Namespace, condition: str, folder: Path) -> dict:
    """The plan prepared in this fresh process under `condition`; its figures."""
    import torch

    from compiler.aoti import split_inputs
    from compiler.measure import time_calls
    from compiler.serving.padding import resize_batch
    from compiler.serving.plan_packages import load_buckets
    from workers.bench.serving_prepare import bucket_loader

    built = {int(b): info for b, info in json.loads((folder / "built.json").read_text()).items()}
    run = _run(args)
    run.imports()
    model, input_sets, _ = run.build(keep_fp32_copy=False)
    model = run.job.config.prepare_model(model)
    example = split_inputs(input_sets[0])
    if condition == "no-cudnn":
        torch.backends.cudnn.enabled = False
    t = time.perf_counter()
    loaded = load_buckets(
        args.sizes,
        bucket_loader(folder, built, model),
        model,
        example,
        args.dtype,
        rows_independent=True,
    )
    prepare_s = time.perf_counter() - t
    steady = {}
    for size, packaged in loaded.packages.items():
        call_args, call_kwargs = resize_batch(*example, size)
        packaged(*call_args, **call_kwargs)  # one untimed call: the first replay after another size's
        times = time_calls(lambda p=packaged, a=call_args, k=call_kwargs: p(*a, **k), 20, args.device)
        steady[size] = statistics.median(times)
    return {
        "condition": condition,
        "prepare_s": prepare_s,
        "steps": loaded.steps,
        "first_run_s": loaded.first_run_s,
        "steady_ms": steady,
    }


def _caches(condition: str, folder: str) -> dict[str, str]:
    """The environment of a process of `condition`: a new node's caches, empty, in `folder`; this
    user's as they are (`warm`); or only the CUDA driver's JIT cache empty (`cold-jit`); with
    `cudnn-v7`, a new node's caches and the legacy cuDNN API."""
    cold = cold_caches(folder)
    if condition == "warm":
        return {}
    if condition == "cold-jit":
        return {"CUDA_CACHE_PATH": cold["CUDA_CACHE_PATH"]}
    if condition == "cudnn-v7":
        return {**cold, "TORCH_CUDNN_V8_API_DISABLED": "1"}
    return cold


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model_id", nargs="?", default="python:workers.toy:conv_bn", help="a sweep's model id")
    p.add_argument("--sizes", default="32,16,8,3", help="the buckets, comma-separated (default 32,16,8,3)")
    p.add_argument("--dtype", default="bf16", help="precision policy of the packages (default bf16)")
    p.add_argument("--mode", default="reduce-overhead", help="torch.compile mode of the packages")
    p.add_argument("--device", default="cuda", choices=["cpu", "cuda"], help="where it runs (default cuda)")
    p.add_argument(
        "--conditions",
        default=",".join(CONDITIONS),
        help=f"what each fresh process prepares under, comma-separated: {', '.join(CONDITIONS)} (default all)",
    )
    p.add_argument("--repeats", type=int, default=1, help="fresh processes per condition (default 1)")
    p.add_argument(
        "--packages",
        type=Path,
        help="keep the packages in this folder (reused when it has them; it must be writable by you alone)",
    )
    p.add_argument("--small", action="store_true", help="CI's CPU mode: conv_bn at 4 and 2, fp32")
    p.add_argument("--child", help=argparse.SUPPRESS)
    return p


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = _parser().parse_args(argv)
    if args.small:
        args.sizes, args.dtype, args.mode, args.device, args.conditions = (
            "4,2",
            "fp32",
            "default",
            "cpu",
            "served",
        )
    args.sizes = sorted({int(s) for s in str(args.sizes).split(",")}, reverse=True)
    conditions = args.conditions.split(",")
    unknown = sorted(set(conditions) - set(CONDITIONS))
    if unknown:
        raise SystemExit(f"unknown condition(s) {unknown}; valid: {', '.join(CONDITIONS)}")
    if args.child:
        print(json.dumps(child(args, args.child, args.packages)))
        return 0
    with tempfile.TemporaryDirectory(prefix="bucket-prepare-") as scratch:
        folder = args.packages or Path(scratch)
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        why = not_private(folder)
        if why:  # its packages, built here or kept from before, must be ours when the children load them
            raise SystemExit(f"--packages {folder}: {why}; use a folder only you can write (chmod go-w)")
        build(args, folder)
        env = {**os.environ, "PYTHONPATH": project_pythonpath(os.environ.get("PYTHONPATH"))}
        rows = []
        for condition in conditions:
            for _ in range(args.repeats):
                cmd = [sys.executable, __file__, *argv, "--child", condition, "--packages", str(folder)]
                with tempfile.TemporaryDirectory(prefix="cold-", dir=scratch) as cold:
                    here = {**env, **_caches(condition, cold)}
                    done = subprocess.run(cmd, env=here, capture_output=True, text=True, timeout=1800)
                if done.returncode:
                    raise SystemExit(f"{condition}: the process failed:\n{done.stderr[-3000:]}")
                rows.append(json.loads(done.stdout.strip().splitlines()[-1]))
    sizes = args.sizes
    print(f"{args.model_id}, {args.dtype} {args.mode} on {args.device}, buckets {sizes}")
    print(
        "| condition | reference s | first runs s | prepare s | "
        + " | ".join(f"b{b} first run s" for b in sizes)
        + " | "
        + " | ".join(f"b{b} ms" for b in sizes)
        + " |"
    )
    print("|---" * (4 + 2 * len(sizes)) + "|")
    for r in rows:
        first = r["first_run_s"]
        print(
            f"| {r['condition']} | {r['steps']['reference_s']:.2f} | {r['steps']['first_run_s']:.2f} | "
            f"{r['prepare_s']:.2f} | "
            + " | ".join(f"{first[str(b)]:.3f}" for b in sizes)
            + " | "
            + " | ".join(f"{r['steady_ms'][str(b)]:.2f}" for b in sizes)
            + " |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
