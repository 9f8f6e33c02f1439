"""Would Dynamo's own cache make the bundled start fast, and is it safe? A canary for torch upgrades.

An exported bundle (`orchestrate export`) holds what `torch.compiler.save_cache_artifacts()` saves
by default: Inductor's FX graphs, AOTAutograd entries, autotuning results. A process applying it
still runs Dynamo: bytecode tracing and guard building, which bound how much the bundle can save.
Dynamo's cache (`torch._dynamo.config.caching_precompile`, experimental) adds the traced bytecode
and guards to the bundle. This script measures, per model, in fresh processes with empty caches:

  cold         torch.compile and the first call, no bundle; saves a bundle as the export does
  bundle       the same after loading that bundle (what compile_tuned does)
  cold-dynamo  as cold, with caching_precompile on: its bundle holds Dynamo's entry too
  dynamo       the same after loading that bundle, caching_precompile on during torch.compile

and for every process whether the first compiled output matches eager (fp32 tolerance,
`compiler.measure.compare_outputs`) and whether a second call at twice the batch size (a recompile) works.
Times run from `torch.compile` to the end of the first call; loading the bundle is not included
(about 0.05 s for 20 MB).

    python benchmarks/dynamo_cache.py [--models mlp,hf:microsoft/resnet-50] [--batch-size 16]
        [--mode reduce-overhead] [--small] [--save FILE.json]

Seen (docs/results/h200-tune.md): on an H200 with torch 2.11 and on CPU with torch 2.13, a model
loaded from Dynamo's entry raises on its first recompile, which is why compile_tuned does not use
it. When this table shows `recompile ok` for the dynamo column on a new torch, the entry is worth
another look.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
MODES = ("cold", "bundle", "cold-dynamo", "dynamo")


def build(model_id: str, batch_size: int, small: bool, device: str):
    import torch

    if model_id == "mlp":
        from workers import toy

        model, inputs = toy.mlp(batch_size)
    else:
        from workers import zoo

        entry = zoo.get_entry(model_id)
        model = entry.build(dict(zoo.SMALL_OVERRIDES.get(model_id, {})) if small else {})  # seeded
        size = zoo.SMALL_IMAGE_SIZE if small else entry.image_size
        inputs = entry.make_inputs(model, batch_size, size, torch.Generator().manual_seed(0))
    model = model.eval().to(device)
    return model, {k: v.to(device) for k, v in inputs.items()}


def child(
    mode: str, model_id: str, batch_size: int, small: bool, compile_mode: str | None, bundle: str
) -> None:
    import torch
    import torch._dynamo
    import torch._inductor.compile_fx  # noqa: F401
    from torch._dynamo.utils import counters

    from compiler.measure import compare_outputs
    from compiler.serving.apply import _call
    from workers.zoo import output_tensors

    device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cpu":
        from torch._inductor.cpu_vec_isa import pick_vec_isa

        from compiler import isa_probe

        isa_probe.probe()  # the ISA probe's g++ builds kept from an earlier process (compiler.isa_probe)
        pick_vec_isa()  # the C++ compiler's ISA probe: once per process, before the timer
    model, inputs = build(model_id, batch_size, small, device)
    with torch.no_grad():
        reference = [t.clone() for t in output_tensors(_call(model, inputs))]
    out: dict = {"model": model_id, "mode": mode, "device": device, "torch": torch.__version__}
    bundle = f"{bundle}.{'dynamo' if 'dynamo' in mode else 'plain'}"
    if not mode.startswith("cold"):
        info = torch.compiler.load_cache_artifacts(Path(bundle).read_bytes())
        out["loaded"] = {k: len(v) for k, v in info.artifacts.items()} if info else {}
    torch._dynamo.config.caching_precompile = "dynamo" in mode
    graphs = counters["stats"]["unique_graphs"]
    t0 = time.perf_counter()
    try:
        try:
            compiled = torch.compile(model, mode=compile_mode)  # Dynamo looks its cache up here
        finally:
            if mode == "dynamo":
                torch._dynamo.config.caching_precompile = False  # on for this torch.compile only
        with torch.no_grad():
            first = output_tensors(_call(compiled, inputs))
        if device == "cuda":
            torch.cuda.synchronize()
        out["first_call_s"] = time.perf_counter() - t0
        out["graphs_traced"] = counters["stats"]["unique_graphs"] - graphs
        cmp = compare_outputs(reference, first, "fp32")
        out["matches_eager"] = cmp.ok if cmp.ok else cmp.detail
    except Exception as exc:
        out["error"] = f"{type(exc).__name__}: {str(exc).strip()[:200]}"
    if mode.startswith("cold"):
        data, info = torch.compiler.save_cache_artifacts()
        Path(bundle).write_bytes(data)
        out["saved"] = {k: len(v) for k, v in info.artifacts.items()}
    if "error" not in out:
        twice = {k: torch.cat([v, v]) for k, v in inputs.items()}
        try:
            with torch.no_grad():
                _call(compiled, twice)
            out["recompile"] = "ok"
        except Exception as exc:
            out["recompile"] = f"{type(exc).__name__}: {str(exc).strip()[:200]}"
    print("RESULT " + json.dumps(out))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default="mlp,hf:microsoft/resnet-50", help="comma-separated: mlp or zoo ids")
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--mode", default=None, help="torch.compile mode (default: Inductor's default)")
    p.add_argument("--small", action="store_true", help="the zoo's reduced configs at 64x64 (CPU)")
    p.add_argument("--save", type=Path, help="write every process's result to this JSON file")
    p.add_argument("--child", nargs=2, metavar=("MODE", "MODEL"), help=argparse.SUPPRESS)
    p.add_argument("--bundle", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        child(args.child[0], args.child[1], args.batch_size, args.small, args.mode, args.bundle)
        return 0
    from workers.runner import job_environment

    rows = []
    print(
        f"torch.compile(mode={args.mode!r}), batch {args.batch_size}; seconds from torch.compile to the first output"
    )
    print(
        "| model | "
        + " | ".join(MODES)
        + " | cold / bundle | cold / dynamo | dynamo: graphs traced, vs eager, recompile |"
    )
    print("|---|" + "---|" * (len(MODES) + 3))
    with tempfile.TemporaryDirectory() as work:
        bundle = f"{work}/bundle.bin"
        for model_id in args.models.split(","):
            got = {}
            for mode in MODES:
                with tempfile.TemporaryDirectory() as cache:  # empty caches, as a sweep's job gets them
                    env = job_environment(Path(cache), os.cpu_count() or 1)
                    cmd = [sys.executable, __file__, "--child", mode, model_id, "--bundle", bundle]
                    cmd += ["--batch-size", str(args.batch_size)] + (["--small"] if args.small else [])
                    cmd += ["--mode", args.mode] if args.mode else []
                    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
                line = next((x for x in proc.stdout.splitlines() if x.startswith("RESULT ")), None)
                if line is None:
                    print(f"{mode} process for {model_id} failed:\n{proc.stderr[-2000:]}", file=sys.stderr)
                    got[mode] = {"error": f"process exited {proc.returncode}"}
                    continue
                got[mode] = json.loads(line[len("RESULT ") :])
                rows.append(got[mode])
            secs = {m: got[m].get("first_call_s") for m in MODES}
            cells = [f"{s:.2f}" if s is not None else got[m].get("error", "?")[:60] for m, s in secs.items()]
            ratios = [
                f"{secs[a] / secs[b]:.1f}x" if secs[a] and secs[b] else "-"
                for a, b in (("cold", "bundle"), ("cold-dynamo", "dynamo"))
            ]
            d = got["dynamo"]
            what = f"{d.get('graphs_traced', '-')}, {d.get('matches_eager', '-')}, {d.get('recompile', '-')}"
            print(f"| {model_id} | " + " | ".join(cells + ratios) + f" | {what} |", flush=True)
            if args.save:
                args.save.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
