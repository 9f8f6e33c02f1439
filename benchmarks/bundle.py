"""Cold compile against compile with the exported bundle, each in a fresh process.

For every preset of an export directory (`orchestrate export ... --dest DIR`) that has a bundle,
two fresh processes with empty Inductor and Triton caches build the model (random weights, as the
sweep did) and time its first call: `cold` compiles the preset's config with `torch.compile`,
`bundle` goes through `compiler.apply.compile_tuned`, which verifies and loads the bundle first.
Imports (torch, Dynamo, Inductor) and, on CPU, the C++ compiler's ISA probe happen before the
timer in both. Prints one line per preset: both first-call times, their ratio (target on GPUs:
at least 5x) and the cache hits and misses of the bundled process.

    python benchmarks/bundle.py DIR [--repeats 2] [--save FILE.json]
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


def child(mode: str, export_dir: str, index: int) -> None:
    import torch
    import torch._dynamo  # noqa: F401
    import torch._inductor.compile_fx  # noqa: F401
    from torch._dynamo.utils import counters

    from compiler.config import CompileConfig
    from workers.bench import JobRun, _call
    from workers.job import Job, MeasureSpec, ModelSpec

    presets = json.loads((Path(export_dir) / "presets.json").read_text())
    entry = [e for e in presets["presets"] if e.get("bundle")][index]
    device = "cpu" if presets["hardware"] == "cpu" else "cuda"
    if device == "cpu":
        from torch._inductor.cpu_vec_isa import pick_vec_isa

        pick_vec_isa()
    config = CompileConfig.from_dict({"name": entry["config"], **entry["compile"]})
    job = Job(
        sweep="bundle-bench",
        hardware=presets["hardware"],
        device=device,
        model=ModelSpec(**entry["model_spec"]),
        batch_size=entry["batch_size"],
        dtype=entry["dtype"],
        config=config,
        measure=MeasureSpec(),
        timeout_s=3600,
    )
    scratch = Path(tempfile.mkdtemp())
    (scratch / "job.json").write_text(json.dumps(job.to_dict()))
    run = JobRun(scratch / "job.json", scratch / "result.json")
    model, input_sets, _ = run.build(keep_fp32_copy=False)
    inputs = input_sets[0]
    with torch.no_grad():  # eager first, as the job that made the bundle did: some models (SegFormer)
        _call(model, inputs)  # trace other graphs before it
    if device == "cuda":
        torch.cuda.synchronize()
    out: dict = {
        "mode": mode,
        "cell": f"{entry['model']}/bs{entry['batch_size']}/{entry['dtype']}/{entry['config']}",
    }
    if mode == "cold":
        from compiler.precision import apply_precision

        apply_precision(entry["dtype"])
        config.apply_globals()
        compiled = torch.compile(model, **config.compile_kwargs())
        t0 = time.perf_counter()
        with torch.no_grad():
            _call(compiled, inputs)
        if device == "cuda":
            torch.cuda.synchronize()
        out["first_call_s"] = time.perf_counter() - t0
    else:
        from compiler.apply import compile_tuned

        t0 = time.perf_counter()
        _, applied = compile_tuned(model, inputs, export_dir, model_name=entry["model"], dtype=entry["dtype"])
        out["first_call_s"] = applied.compile_s
        out["with_load_s"] = time.perf_counter() - t0
        out["match"], out["bundle"] = applied.match, applied.bundle
    out["counters"] = {k: v for k, v in counters["inductor"].items() if "cache" in k}
    try:  # where the first call's compile went, per Dynamo/Inductor function
        out["compile_times"] = str(torch._dynamo.utils.compile_times(repr="str", aggregate=True))[:3000]
    except Exception as exc:
        out["compile_times"] = f"unavailable: {exc}"
    print("RESULT " + json.dumps(out))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("export_dir")
    p.add_argument("--repeats", type=int, default=1, help="fresh-process pairs per preset (default 1)")
    p.add_argument("--save", type=Path, help="write every measurement to this JSON file")
    p.add_argument("--child", nargs=2, metavar=("MODE", "INDEX"), help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        child(args.child[0], args.export_dir, int(args.child[1]))
        return 0
    presets = json.loads((Path(args.export_dir) / "presets.json").read_text())
    entries = [e for e in presets["presets"] if e.get("bundle")]
    rows = []
    print(f"{len(entries)} presets with bundles in {args.export_dir} ({presets['hardware']})", flush=True)
    print("| cell | cold first call s | with bundle s | cold / bundle | bundled process's cache counters |")
    print("|---|---|---|---|---|")
    for i, _ in enumerate(entries):
        got = {"cold": [], "bundle": []}
        info = {}
        for _ in range(args.repeats):
            for mode in ("cold", "bundle"):
                with tempfile.TemporaryDirectory() as cache:
                    env = {
                        **os.environ,
                        "TORCHINDUCTOR_CACHE_DIR": f"{cache}/inductor",
                        "TRITON_CACHE_DIR": f"{cache}/triton",
                        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
                    }
                    proc = subprocess.run(
                        [sys.executable, __file__, args.export_dir, "--child", mode, str(i)],
                        capture_output=True,
                        text=True,
                        env=env,
                    )
                line = next((x for x in proc.stdout.splitlines() if x.startswith("RESULT ")), None)
                if line is None:
                    print(f"{mode} process for preset {i} failed:\n{proc.stderr[-2000:]}", file=sys.stderr)
                    continue
                result = json.loads(line[len("RESULT ") :])
                got[mode].append(result["first_call_s"])
                info[mode] = result
                rows.append(result)
        cold = statistics.median(got["cold"]) if got["cold"] else float("nan")
        warm = statistics.median(got["bundle"]) if got["bundle"] else float("nan")
        cell = (info.get("cold") or info.get("bundle") or {}).get("cell", str(i))
        counters = (info.get("bundle") or {}).get("counters")
        print(f"| {cell} | {cold:.2f} | {warm:.2f} | {cold / warm:.1f}x | {counters} |", flush=True)
        if args.save:  # after every preset: a run cut short keeps what it measured
            args.save.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
