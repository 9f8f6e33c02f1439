"""Cold compile against the exported bundle and package, each in a fresh process; and the
package's latency against the preset's.

For every preset of an export directory (`orchestrate export ... --dest DIR`) that has a bundle,
fresh processes with empty Inductor and Triton caches build the model (random weights, as the
sweep did) and time its first call: `cold` compiles the preset's config with `torch.compile`,
`bundle` goes through `compiler.serving.compile_tuned(use_package=False)`, which verifies and loads
the bundle first, and, where the preset has an AOTInductor package, `package` goes through
`compile_tuned` with it (from verifying the package to the end of its first call, CUDA-graph
capture included). Imports (torch, Dynamo, Inductor) and, on CPU, the C++ compiler's ISA probe
happen before the timer in all. The `package` process then also compiles the preset with
`torch.compile` (from the bundle) and times both on the same inputs, interleaved in rounds
(`compiler.measure.interleaved`): preset / package latency with its paired interval over the
`--repeats` processes (`compiler.statistics.paired_speedup`; above 1: the package is faster).

Prints one line per preset: the first-call times, cold / bundle and cold / package (target on
GPUs: at least 5x), both latencies and their ratio; first, on stderr, a note when this Python has
no bytecode cached for torch and writes none (every process would compile torch from source).

    python benchmarks/bundle.py DIR [--repeats 2] [--iterations 200] [--cells vit,bs16] [--save FILE.json]
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
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from compiler.env import project_pythonpath  # noqa: E402
from compiler.serving.files import open_export  # noqa: E402
from compiler.statistics import paired_speedup  # noqa: E402


def child(mode: str, export_dir: str, index: int, iterations: int) -> None:
    import torch
    import torch._dynamo  # noqa: F401
    import torch._inductor.compile_fx  # noqa: F401
    from torch._dynamo.utils import counters

    from compiler.config import CompileConfig
    from workers.bench.run import JobRun, _call

    presets = open_export(export_dir).presets
    entry = [e for e in presets["presets"] if e.get("bundle")][index]
    device = "cpu" if presets["hardware"] == "cpu" else "cuda"
    if device == "cpu":  # the C++ compiler's ISA probe, before the timer; g++ only where none was kept
        from torch._inductor.cpu_vec_isa import pick_vec_isa

        from compiler import isa_probe

        isa_probe.probe()
        pick_vec_isa()
    config = CompileConfig.from_dict({"name": entry["config"], **entry["compile"]})
    run = JobRun.for_preset("bundle-bench", presets["hardware"], entry, config, entry["dtype"])
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
        from compiler.serving import compile_tuned

        t0 = time.perf_counter()
        packaged, applied = compile_tuned(
            model,
            inputs,
            export_dir,
            model_name=entry["model"],
            dtype=entry["dtype"],
            use_package=mode == "package",
        )
        out["first_call_s"] = applied.compile_s
        out["with_load_s"] = time.perf_counter() - t0
        out["match"], out["bundle"], out["package"] = applied.match, applied.bundle, applied.package
        out["warnings"] = applied.warnings
    out["counters"] = {k: v for k, v in counters["inductor"].items() if "cache" in k}
    if mode == "package" and applied.package == "loaded":
        out.update(latencies(run, model, packaged, input_sets, export_dir, entry, iterations))
    try:  # where the first call's compile went, per Dynamo/Inductor function
        out["compile_times"] = str(torch._dynamo.utils.compile_times(repr="str", aggregate=True))[:3000]
    except Exception as exc:
        out["compile_times"] = f"unavailable: {exc}"
    print("RESULT " + json.dumps(out))


def latencies(run, model, packaged, input_sets, export_dir, entry, iterations) -> dict:
    """The preset through torch.compile (from the bundle) and the package, timed on the same inputs
    (rotated as a job rotates them) in interleaved rounds in this process."""
    import torch

    from compiler import measure
    from compiler.serving import compile_tuned
    from workers import zoo
    from workers.bench.run import _call

    preset, _ = compile_tuned(
        model, input_sets[0], export_dir, model_name=entry["model"], dtype=entry["dtype"], use_package=False
    )
    device = run.job.device
    preset_call = run._rotating(preset, input_sets, mark_step=True)  # CUDA-graph steps, as a job's
    package_call = run._rotating(packaged, input_sets)
    other = 1 % len(input_sets)
    with torch.no_grad():
        for call in (preset_call, package_call):
            measure.warmup_until_stable(call, device, min_calls=10)
        preset_ms, package_ms = measure.interleaved(
            [preset_call, package_call], device, iterations, rounds=10
        )
        reference = [t.clone() for t in zoo.output_tensors(_call(model, input_sets[other]))]
        got = [t.clone() for t in zoo.output_tensors(package_call(other))]
    cmp = measure.compare_outputs(reference, got, entry["dtype"])
    return {
        "preset_ms": preset_ms,
        "package_ms": package_ms,
        "package_matches_eager_other_inputs": cmp.ok,
        "package_max_rel_err": cmp.max_rel_err,
    }


def bytecode_note() -> str:
    """A warning when this Python neither has nor writes bytecode for torch's modules: every
    fresh process then compiles them from source, seconds inside each first call (2.3 s of a
    6.6 s start on the H200 device image, which sets PYTHONDONTWRITEBYTECODE and ships none)."""
    import importlib.util

    torch = importlib.util.find_spec("torch")  # found, not imported
    probe = Path(torch.origin).parent / "_inductor" / "compile_fx.py"
    cached = Path(importlib.util.cache_from_source(str(probe))).exists()
    if cached or not sys.dont_write_bytecode:
        return ""
    return (
        "note: no bytecode cache for torch here and PYTHONDONTWRITEBYTECODE is set: every fresh process "
        "compiles torch's modules from source inside its timed first call; for figures a node with an "
        "ordinary install would see, run with PYTHONDONTWRITEBYTECODE unset (PYTHONPYCACHEPREFIX=DIR "
        "where site-packages is read-only)"
    )


def parse_args() -> argparse.Namespace:
    """The command line: the export directory and the table's flags (a child's --child MODE INDEX)."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("export_dir")
    p.add_argument("--repeats", type=int, default=1, help="fresh-process pairs per preset (default 1)")
    p.add_argument("--save", type=Path, help="write every measurement to this JSON file")
    p.add_argument(
        "--iterations",
        type=int,
        default=200,
        help="timed calls of each side in a package process (default 200)",
    )
    p.add_argument(
        "--cells",
        help="only presets whose cell (model/bsN/dtype/config) contains one of these comma-separated words",
    )
    p.add_argument("--child", nargs=2, metavar=("MODE", "INDEX"), help=argparse.SUPPRESS)
    return p.parse_args()


def main() -> int:
    """A child process's one measurement (--child), or the table: per preset with a bundle (those
    --cells names), its fresh processes, then its line; the JSON saved after every preset."""
    args = parse_args()
    if args.child:
        child(args.child[0], args.export_dir, int(args.child[1]), args.iterations)
        return 0
    presets = open_export(args.export_dir).presets
    entries = [e for e in presets["presets"] if e.get("bundle")]
    rows: list[dict] = []
    note = bytecode_note()
    if note:
        print(note, file=sys.stderr, flush=True)
    print(f"{len(entries)} presets with bundles in {args.export_dir} ({presets['hardware']})", flush=True)
    print(
        "| cell | cold first call s | with bundle s | with package s | cold / bundle | cold / package "
        "| preset ms | package ms | preset / package [95% CI] |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for i, entry in enumerate(entries):
        cell = f"{entry['model']}/bs{entry['batch_size']}/{entry['dtype']}/{entry['config']}"
        if args.cells and not any(word in cell for word in args.cells.split(",")):
            continue
        found = measure_preset(args, i, entry)
        rows += found.rows
        print(found.line(cell, entry), flush=True)
        if args.save:  # after every preset: a run cut short keeps what it measured
            args.save.write_text(json.dumps(rows, indent=1))
    return 0


@dataclass
class PresetTimes:
    """One preset's measurements over its fresh processes: the first-call times per mode, the
    package process's latency samples of both sides, and every process's result."""

    modes: tuple[str, ...]
    got: dict[str, list[float]] = field(init=False)
    """Per mode (cold, bundle, package), each process's first-call seconds."""
    info: dict[str, dict] = field(default_factory=dict)
    """Per mode, its last process's result."""
    preset_ms: list[float] = field(default_factory=list)
    package_ms: list[float] = field(default_factory=list)
    sizes: list[int] = field(default_factory=list)
    """Latency samples per package process (the groups of the paired interval)."""
    rows: list[dict] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.got = {m: [] for m in self.modes}

    def add(self, mode: str, result: dict) -> None:
        """One process's result, by its mode."""
        if result.get("first_call_s") is not None:
            self.got[mode].append(result["first_call_s"])
        if result.get("package_ms"):
            self.preset_ms += result["preset_ms"]
            self.package_ms += result["package_ms"]
            self.sizes.append(len(result["package_ms"]))
        self.info[mode] = result
        self.rows.append(result)

    def line(self, cell: str, entry: dict) -> str:
        """The preset's row of the table: median first-call times and their ratios, then both
        latencies and their paired ratio (or why there is no package to time)."""
        med = {m: statistics.median(v) if v else float("nan") for m, v in self.got.items()}
        cold = med["cold"]
        if self.preset_ms:
            iv = paired_speedup(self.preset_ms, self.package_ms, self.sizes)
            latency = (
                f"{statistics.median(self.preset_ms):.3f} | {statistics.median(self.package_ms):.3f} | "
                f"{iv.estimate:.3f} [{iv.low:.3f}, {iv.high:.3f}]"
            )
        else:
            why = (
                (self.info.get("package") or {}).get("package") or entry.get("package_error") or "no package"
            )
            latency = f"- | - | {why}"
        pkg = med.get("package", float("nan"))
        return (
            f"| {cell} | {cold:.2f} | {med['bundle']:.2f} | {pkg:.2f} | {cold / med['bundle']:.1f}x | "
            f"{cold / pkg:.1f}x | {latency} |"
        )


def measure_preset(args: argparse.Namespace, index: int, entry: dict) -> PresetTimes:
    """Preset `index`'s fresh processes: per repeat, cold, bundle and (where it has one) package,
    each with empty caches; a process that fails is named on stderr and left out."""
    modes = ("cold", "bundle", "package") if entry.get("package") else ("cold", "bundle")
    found = PresetTimes(modes)
    for _ in range(args.repeats):
        for mode in modes:
            proc = run_child(args, mode, index)
            line = next((x for x in proc.stdout.splitlines() if x.startswith("RESULT ")), None)
            if line is None:
                said = "\n".join(
                    x for x in proc.stderr.splitlines() if "Warning" not in x and "return cls" not in x
                )
                print(
                    f"{mode} process for preset {index} failed (exit {proc.returncode}):\n{said[-3000:]}",
                    file=sys.stderr,
                )
                continue
            found.add(mode, json.loads(line[len("RESULT ") :]))
    return found


def run_child(args: argparse.Namespace, mode: str, index: int) -> subprocess.CompletedProcess:
    """One fresh process (this script with --child) timing `mode` for preset `index`, with empty
    Inductor and Triton caches of its own."""
    with tempfile.TemporaryDirectory() as cache:
        env = {
            **os.environ,
            "TORCHINDUCTOR_CACHE_DIR": f"{cache}/inductor",
            "TRITON_CACHE_DIR": f"{cache}/triton",
            "PYTHONPATH": project_pythonpath(os.environ.get("PYTHONPATH")),  # as the export job's
        }
        cmd = [
            sys.executable,
            "-X",
            "faulthandler",
            __file__,
            args.export_dir,
            "--child",
            mode,
            str(index),
        ]
        cmd += ["--iterations", str(args.iterations)]
        return subprocess.run(cmd, capture_output=True, text=True, env=env)


if __name__ == "__main__":
    raise SystemExit(main())
