"""The per-size oracle of `benchmarks/serving_traffic.py`: one graph specialized for every batch
size of the range, compiled with `torch.compile` over several processes at once (`run_oracle`),
or an AOTInductor package per size (`build_oracle_packages`, `load_oracle_packages`)."""

from __future__ import annotations

import argparse
import functools
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from compiler.env import project_pythonpath
from compiler.serving.traffic import ServingProfile


def compile_config(args: argparse.Namespace):
    """The config the oracle (and a served plan without `--export`) compiles with: the export's
    preset of `--name` where `--export` has a compiled one, its mode, freezing, options and runtime
    settings all (`compiler.serving.files.preset_config`), so an exact preset per batch size runs
    as the served one does; else the config `--mode` names, under the runtime settings of the
    export's preset where it has an eager one (`export_runtime`)."""
    from compiler.config import CompileConfig, is_eager_preset
    from compiler.serving.files import preset_config

    entry = _preset(args)
    if entry is not None and not is_eager_preset(entry):
        return preset_config(entry, str(args.export))
    mode = None if args.mode == "default" else args.mode
    return CompileConfig(name=args.mode, mode=mode, runtime=export_runtime(args))


def _preset(args: argparse.Namespace) -> dict | None:
    """The export's preset of `--name` (from its verified serving.json), or None without
    `--export` or such a preset."""
    if not getattr(args, "export", None):
        return None
    return next((p for p in _export(args).presets["presets"] if p["model"] == args.name), None)


def export_runtime(args: argparse.Namespace) -> dict:
    """The runtime settings (`compiler.runtime`, e.g. `cudnn_enabled`) of the export's preset of
    `--name`, read from its verified serving.json; {} without `--export` or such a preset."""
    from compiler.config import preset_runtime

    entry = _preset(args)
    return preset_runtime(entry) if entry else {}


def export_precision(args: argparse.Namespace) -> str | None:
    """The precision policy the export's preset of `--name` runs in (its `precision`: under an
    accuracy budget it may differ from the cell's dtype, e.g. tf32 for an fp32 model under the
    stock budget), which the served plan and the oracle must both run; None without `--export` or
    such a preset."""
    entry = _preset(args)
    return (entry.get("precision") or entry["dtype"]) if entry else None


def _export(args: argparse.Namespace):
    """`--export` opened and its serving.json verified, once per process (its config, precision,
    runtime and packages are all read from it)."""
    return _opened(str(args.export))


@functools.cache
def _opened(source: str):
    from compiler.serving.files import open_export

    return open_export(source)


def build_oracle_packages(args: argparse.Namespace, profile: ServingProfile, dest: Path) -> dict:
    """`--oracle packages`: an AOTInductor package of `compile_config`'s config for every size of
    the range, in `dest` (`workers.bench.serving.package_buckets`: processes of their own, side by
    side, spread over the GPUs), as an export builds a bucket's: what an exact preset per size serves
    from; with `--export`, its buckets' packages serve their own sizes (`_export_packages`). The
    build's wall time, processes and GPUs, and the sizes taken from the export."""
    from workers.bench.run import JobRun
    from workers.bench.serving import package_buckets

    spec = {
        "id": args.model_id,
        "name": args.name,
        **({"input_size": args.input_size} if args.input_size else {}),
    }
    hardware = "cpu" if args.device == "cpu" else "gpu"
    run = JobRun.for_preset(
        "serving-traffic",
        hardware,
        {"model_spec": spec, "batch_size": args.max},
        compile_config(args),
        args.dtype,
    )
    os.environ["PYTHONPATH"] = project_pythonpath(os.environ.get("PYTHONPATH"))
    reused = _export_packages(args, dest) if args.export else {}
    built, build, why = package_buckets(
        run, [s for s in profile.sizes() if s not in reused], dest / "oracle.pt2"
    )
    if why:
        raise SystemExit(f"the oracle's packages failed: {why}")
    (dest / "oracle.json").write_text(json.dumps({str(b): info for b, info in {**built, **reused}.items()}))
    return {**build, "reused_from_export": sorted(reused)}


def _export_packages(args: argparse.Namespace, dest: Path) -> dict[int, dict]:
    """The export's bucket packages of `--name` (each one size's exact package, as the oracle
    needs), copied to `dest` once their bytes match the export's manifest
    (`compiler.serving.files.open_export`, `verified`), by size: the oracle builds only the sizes
    they miss. A file that does not match is not used."""
    from compiler.serving.files import ExportError

    export = _export(args)
    entry = next(
        (
            p
            for p in export.presets["presets"]
            if p["model"] == args.name and (p.get("serving") or {}).get("packages")
        ),
        None,
    )
    reused = {}
    for size, info in ((entry or {}).get("serving") or {}).get("packages", {}).items():
        if not size.isdigit():  # the dynamic plan's package: not one size's
            continue
        try:
            data = export.verified(info["file"])
        except ExportError:
            continue
        name = Path(info["file"]).name
        (dest / name).write_bytes(data)
        reused[int(size)] = {**info, "file": name}
    return reused


def load_oracle_packages(args, profile: ServingProfile, model, example, dest: Path, t0: float):
    """The oracle served from its packages (`build_oracle_packages`), each loaded with the model's
    weights, captured into one CUDA-graph pool and checked against eager at its own size now, by
    the code `compile_tuned` prepares a buckets plan of packages with (`load_buckets`)."""
    from compiler.serving.plan_packages import load_buckets
    from compiler.serving.served import ServedModel
    from workers.bench.serving_prepare import bucket_loader

    built = {int(b): info for b, info in json.loads((dest / "oracle.json").read_text()).items()}
    sizes = profile.sizes()
    # every size its own bucket: nothing padded, so each is checked against eager at its size
    loaded = load_buckets(sizes, bucket_loader(dest, built, model), model, example, args.dtype, False)
    served = ServedModel(lambda dynamic: loaded.serve(), profile, "buckets", sizes, example)
    served.prepare()
    return served, time.perf_counter() - t0, {"serving": served.describe()}


def run_oracle(
    script: str, env: dict[str, str], argv: list[str], profile: ServingProfile, processes: int
) -> dict:
    """The oracle over `processes` fresh processes, each preparing every `processes`-th size of the
    range at once (a graph per size costs a compile: the range's 32 sizes took 9-14 s each on an
    H200), then replaying the trace's requests of its sizes one process after another, the others
    idle. Their requests and compile counts summed, the longest preparation its `prepare_s`."""
    sizes = profile.sizes()
    groups = [sizes[i::processes] for i in range(min(processes, len(sizes)))]
    procs = []
    with tempfile.TemporaryDirectory(prefix="oracle-") as logs:
        for i, group in enumerate(groups):
            cmd = [sys.executable, script, *argv, "--child", "oracle", "--wait"]
            cmd += ["--sizes", ",".join(map(str, group))]
            err = open(Path(logs) / f"{i}.err", "w")  # noqa: SIM115 (closed below)
            procs.append(
                (
                    subprocess.Popen(
                        cmd,
                        stdin=subprocess.PIPE,
                        stdout=subprocess.PIPE,
                        stderr=err,
                        text=True,
                        env=env,
                    ),
                    err,
                )
            )
        results = []
        for i, (proc, err) in enumerate(procs):
            assert proc.stdout is not None and proc.stdin is not None
            while (line := proc.stdout.readline()) and line.strip() != "READY":
                pass
            if not line:
                proc.wait()
                err.close()
                raise SystemExit(
                    f"oracle process {i} failed:\n{(Path(logs) / f'{i}.err').read_text()[-3000:]}"
                )
        for i, (proc, err) in enumerate(procs):  # replayed one after another
            assert proc.stdout is not None and proc.stdin is not None
            proc.stdin.write("go\n")
            proc.stdin.flush()
            out = proc.stdout.read()
            proc.wait()
            err.close()
            if proc.returncode != 0:
                raise SystemExit(
                    f"oracle process {i} failed:\n{(Path(logs) / f'{i}.err').read_text()[-3000:]}"
                )
            results.append(json.loads(out.strip().splitlines()[-1]))
    counts = [r["compiles_after_prepare"] for r in results]
    peaks = [r["peak_mem_bytes"] for r in results if r["peak_mem_bytes"] is not None]
    return {
        "side": "oracle",
        "prepare_s": max(r["prepare_s"] for r in results),
        "processes": len(groups),
        "compiles_after_prepare": None if None in counts else sum(counts),
        "requests": [q for r in results for q in r["requests"]],
        "applied": {},
        "peak_mem_bytes": sum(peaks) if peaks else None,
    }
