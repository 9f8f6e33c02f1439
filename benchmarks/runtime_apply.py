"""Does an exported preset's runtime setting reach the serving process? Latency through
`compiler.serving.compile_tuned` against the same compiled config under torch's default runtime
settings, each in fresh processes.

For every preset of an export directory (`orchestrate export ... --dest DIR`) whose config sets
runtime settings (`compiler.runtime`, e.g. `cudnn_benchmark`), `--repeats` pairs of fresh
processes build the model (random weights, as the sweep did) with torch's defaults in force:

- `tuned`: `compile_tuned(model, inputs, DIR, use_package=False)`, which sets the preset's
  runtime settings before the first call, then times the compiled model;
- `stock`: the same config through `torch.compile` with the runtime settings left at torch's
  defaults (what a user who copied only the compile options would run), then times it.

The two never share a process: a process keeps its first cuDNN plan per convolution. Prints one
line per preset: each side's median latency and stock / tuned with its unpaired interval over the
processes (`compiler.statistics.ratio_interval`; above 1: the applied preset is faster), and what
each side's processes held at their peak (the CUDA allocator's peak since the process started,
the first call's cuDNN search included; on CPU the peak RSS) and took from compiling to their
first output (`compile_tuned` included, which runs the example once itself; on CPU after the C++
compiler's ISA probe, as in `benchmarks/bundle.py`), beside
the `peak_mem_bytes` the sweep's row recorded for the preset (its compiled phase only, after the
eager phase had run the same convolutions).

    python benchmarks/runtime_apply.py DIR [--repeats 3] [--iterations 200] [--save FILE.json]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from compiler.config import is_eager_preset  # noqa: E402
from compiler.env import project_pythonpath  # noqa: E402
from compiler.serving.files import open_export  # noqa: E402
from compiler.statistics import ratio_interval, summarize  # noqa: E402


def runtime_presets(presets: dict) -> list[dict]:
    """The compiled presets of an export that set a runtime setting (an eager preset compiles
    nothing to time against the stock config)."""
    return [e for e in presets["presets"] if not is_eager_preset(e) and (e["compile"].get("runtime") or {})]


def child(side: str, export_dir: str, index: int, iterations: int) -> None:
    import torch

    from compiler import measure, runtime
    from compiler.config import CompileConfig
    from compiler.precision import apply_precision
    from compiler.serving import compile_tuned
    from workers.bench.run import JobRun

    presets = open_export(export_dir).presets
    entry = runtime_presets(presets)[index]
    device = "cpu" if presets["hardware"] == "cpu" else "cuda"
    config = CompileConfig.from_dict({"name": entry["config"], **entry["compile"]})
    stock = dataclasses.replace(config, runtime={})  # the model is built under torch's defaults
    dtype = entry.get("precision") or entry["dtype"]
    run = JobRun.for_preset("runtime-apply", presets["hardware"], entry, stock, dtype)
    model, input_sets, _ = run.build(keep_fp32_copy=False)
    if device == "cpu":  # the C++ compiler's ISA probe: the machine's, not the preset's; before the clock
        from compiler import isa_probe

        isa_probe.probe()
    start = time.perf_counter()  # to the first call's end: compile_tuned runs the example itself
    if side == "tuned":
        compiled, applied = compile_tuned(
            model,
            input_sets[0],
            export_dir,
            model_name=entry["model"],
            dtype=entry["dtype"],
            use_package=False,
        )
        assert applied.match == "exact", applied.summary()
    else:
        apply_precision(dtype)
        stock.apply_globals()
        compiled = torch.compile(model, **stock.compile_kwargs())
    call = run._rotating(compiled, input_sets, mark_step=True)
    with torch.no_grad():
        call(0)  # the first call: compile (or the bundle's load) and, where set, cuDNN's search
        measure.synchronize(device)
        first_call_s = time.perf_counter() - start
        measure.warmup_until_stable(call, device, min_calls=10)
        (samples,) = measure.interleaved([call], device, iterations, rounds=10)
    print(
        "RESULT "
        + json.dumps(
            {
                "side": side,
                "cell": f"{entry['model']}/bs{entry['batch_size']}/{entry['dtype']}/{entry['config']}",
                "runtime": runtime.current(),
                "samples_ms": samples,
                "first_call_s": first_call_s,
                # never reset in this process: everything it did, the first call's search included
                "peak_bytes": measure.peak_memory_bytes(device),
                "peak_reserved_bytes": int(torch.cuda.max_memory_reserved()) if device == "cuda" else None,
            }
        )
    )


def _gib(value: int | None) -> str:
    return "-" if value is None else f"{value / 2**30:.2f}"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("export_dir")
    p.add_argument("--repeats", type=int, default=3, help="fresh-process pairs per preset (default 3)")
    p.add_argument("--iterations", type=int, default=200, help="timed calls per process (default 200)")
    p.add_argument("--save", type=Path, help="write every measurement to this JSON file")
    p.add_argument("--child", nargs=3, metavar=("SIDE", "INDEX", "ITERATIONS"), help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        child(args.child[0], args.export_dir, int(args.child[1]), int(args.child[2]))
        return 0
    presets = open_export(args.export_dir).presets
    entries = runtime_presets(presets)
    if not entries:
        print(f"error: no preset in {args.export_dir} sets a runtime setting", file=sys.stderr)
        return 2
    env = {**os.environ, "PYTHONPATH": project_pythonpath(os.environ.get("PYTHONPATH"))}
    saved = []
    print(
        "| preset | runtime | tuned ms (compile_tuned) | stock ms (torch defaults) | stock / tuned [95% CI] "
        "| peak GiB tuned / stock (row: compiled phase) | to the first output, s, tuned / stock |"
    )
    print("|---|---|---|---|---|---|---|")
    for index, entry in enumerate(entries):
        groups: dict[str, list[list[float]]] = {"tuned": [], "stock": []}
        peaks: dict[str, list[int]] = {"tuned": [], "stock": []}
        first: dict[str, list[float]] = {"tuned": [], "stock": []}
        for _ in range(args.repeats):
            for side in ("stock", "tuned"):  # alternated, so drift hits both sides alike
                with tempfile.TemporaryDirectory() as cache:
                    child_env = {
                        **env,
                        "TORCHINDUCTOR_CACHE_DIR": cache,
                        "TRITON_CACHE_DIR": cache + "/triton",
                    }
                    proc = subprocess.run(
                        [
                            sys.executable,
                            __file__,
                            args.export_dir,
                            "--child",
                            side,
                            str(index),
                            str(args.iterations),
                        ],
                        capture_output=True,
                        text=True,
                        env=child_env,
                        cwd=ROOT,
                    )
                line = next((x for x in proc.stdout.splitlines() if x.startswith("RESULT ")), None)
                if proc.returncode != 0 or line is None:
                    print(f"error: {side} process failed:\n{proc.stderr[-3000:]}", file=sys.stderr)
                    return 1
                result = json.loads(line[len("RESULT ") :])
                saved.append(result)
                groups[side].append(result["samples_ms"])
                peaks[side].append(result["peak_bytes"])
                first[side].append(result["first_call_s"])
        iv = ratio_interval(groups["stock"], groups["tuned"], paired=False)
        med = {s: summarize([x for g in groups[s] for x in g]).median_ms for s in groups}
        cell = f"{entry['model']}/bs{entry['batch_size']}/{entry['dtype']}/{entry['config']}"
        print(
            f"| {cell} | {json.dumps(entry['compile']['runtime'])} | {med['tuned']:.3f} | {med['stock']:.3f} | "
            f"{iv.estimate:.3f} [{iv.low:.3f}, {iv.high:.3f}] over {iv.processes} processes each "
            f"| {_gib(max(peaks['tuned']))} / {_gib(max(peaks['stock']))} ({_gib(entry.get('peak_mem_bytes'))}) "
            f"| {max(first['tuned']):.1f} / {max(first['stock']):.1f} |",
            flush=True,
        )
    if args.save:
        args.save.write_text(json.dumps(saved))
    return 0


if __name__ == "__main__":
    sys.exit(main())
