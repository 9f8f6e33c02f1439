"""`orchestrate export OUT --hardware CLASS --dest DIR`: one hardware class's presets with a
compile-cache bundle per preset, for `compiler.serving.compile_tuned` on a production node.

DEST/
  manifest.json    format, hardware class, software stack, sha256 of every other file
  serving.json     per (model, batch size, dtype): the config that won, its figures, its bundle;
                   `defaults`: per dtype, the config with the best geometric-mean speedup over
                   the class's cells (for models never swept)
  bundles/*.bin    `torch.compiler.save_cache_artifacts()` of a cold compile of the preset, made
                   here, in a fresh process with empty caches
  packages/*.pt2   with `packages=True` (the default): the preset compiled ahead of time for its
                   batch size (`compiler.aoti`: AOTInductor, no weights inside), built in the same
                   process after the bundle; `compile_tuned` serves an exact cell from it without
                   tracing or compiling
  manifest.sig     with `sign_key`: the manifest's HMAC-SHA256 with that key
                   (`compiler.serving.signature`), which a serving process that names the key
                   requires; written just before the manifest, which it signs

An eager preset (`compile: null`, `orchestrator.tune.eager`) has nothing to compile: it gets no
bundle and no package, and stays in serving.json and the manifest with its runtime settings.

A bundle is only valid on the class and stack it was built on, so the export runs on a node of
that class with the stack the presets were measured on, and refuses anything else before it
compiles. The manifest is written last: a directory without one is an interrupted export, and
`.progress.json` there (every preset finished so far, rewritten after each) lets `resume=True`
carry on where it stopped instead of compiling those presets again.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from compiler import durable
from compiler.aoti import LOADER_CRASHED
from compiler.config import CompileConfig, is_eager_preset, preset_runtime
from compiler.hardware import STACK_KEYS, hardware_class, software_stack, stack_mismatch
from compiler.job import Job, MeasureSpec, ModelSpec
from compiler.serving import EXPORT_FORMAT, MANIFEST, SERVING_FILE, ExportError, sha256_file
from compiler.serving.signature import SIGNATURE, write_signature
from compiler.serving.traffic import ServingProfile
from orchestrator.tune.export_lines import bundle_caveat, no_preset_lines, package_line
from orchestrator.tune.presets import PRESETS_FILE, derive_presets, row_stack, sweep_accuracy
from orchestrator.tune.sweep_models import (
    config_miss,
    model_specs,
    packaged_plan,
    serving_line,
    serving_profiles,
    serving_stock,
)
from store.layout import LOCK_FILE, TUNE_FILE
from store.lock import holding
from store.runlog import read_runs
from store.schema import read_results
from store.storage import Location, Target, resolve

BUNDLES = "bundles"
PACKAGES = "packages"
PROGRESS = ".progress.json"


def _bundle_name(entry: dict[str, Any], folder: str = BUNDLES, suffix: str = ".bin") -> str:
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in entry["model"])
    return f"{folder}/{safe}-bs{entry['batch_size']}-{entry['dtype']}{suffix}"


def _bundle_outcome(result: dict[str, Any], bundle: Path) -> dict[str, Any]:
    """The bundle job's result, with a job that timed out or crashed while building the package
    (after its bundle was written) counted as a made bundle and a package error."""
    made = result.get("phase") == "package" and result.get("bundle_bytes")
    if result.get("status") != "ok" and made and bundle.exists() and bundle.stat().st_size == made:
        first = (result.get("error") or "").splitlines()[0][:300] if result.get("error") else ""
        return {**result, "status": "ok", "package_error": f"{result['status']}: {first}"}
    return result


def _cell(entry: dict[str, Any]) -> str:
    return f"{entry['model']}/bs{entry['batch_size']}/{entry['dtype']}/{entry['config']}"


def plan_export(
    out: Target, hardware: str, budget: str | None = None, left_out: list[str] | None = None
) -> tuple[list[dict[str, Any]], dict[str, Any], dict[str, Any]]:
    """(preset entries, class defaults, stack) of `hardware` under `out`: the presets a tune wrote
    there, else those derived from a sweep's results (under the sweep's accuracy budgets, where it
    declared any), of accuracy budget `budget` (needed where they were decided under several);
    raises ExportError when there is nothing to export (saying why each cell has no preset) or the
    figures mix stacks. `left_out`, where given, gets a line
    per cell of `hardware` without a preset, saying why (its `no_preset` entry)."""
    location = resolve(out)
    if location.join(TUNE_FILE).exists():
        return _tuned_plan(location, hardware, budget)
    rows = [r for r in read_results(out).to_pylist() if r["hardware"] == hardware]
    if not rows:
        classes = sorted({r for r in read_results(out, columns=["hardware"]).column("hardware").to_pylist()})
        raise ExportError(
            f"no result rows of hardware class {hardware!r} under {out}; classes there: {', '.join(classes) or 'none'}"
        )
    ok = [r for r in rows if r["status"] == "ok"]
    _one_stack(ok, f"the {hardware} rows under {out}", "rerun the sweep on one stack into a fresh --out")
    if not ok:
        raise ExportError(f"no {hardware} row under {out} is ok: nothing to export")
    import pyarrow as pa

    accuracy = sweep_accuracy(location)
    chosen = _one_budget([b.name for b in accuracy], budget, f"the sweep under {out}")
    derived = derive_presets(pa.Table.from_pylist(rows), accuracy=accuracy)
    derived["presets"] = [e for e in derived["presets"] if e.get("budget") == chosen]
    missing = no_preset_lines([m for m in derived["no_preset"] if m.get("budget") == chosen])
    if not derived["presets"]:
        raise ExportError(f"no {hardware} preset under {out}: nothing to export. {'; '.join(missing)}")
    if left_out is not None:
        left_out.extend(missing)
    return derived["presets"], derived["defaults"][hardware], row_stack(ok[0])


def _one_budget(budgets: list[str], budget: str | None, where: str) -> str | None:
    """The accuracy budget whose presets an export serves, of the `budgets` they were decided
    under (a sweep's declared ones, or those a tune's presets name): `budget`, which must be one of
    them, else their only one (None where there are none); several without `budget` raise
    ExportError."""
    budgets = list(dict.fromkeys(budgets))
    if budget is None and len(budgets) > 1:
        raise ExportError(
            f"{where} decided presets under {len(budgets)} accuracy budgets ({', '.join(budgets)}): "
            "an export serves one, pass --budget NAME"
        )
    if budget is not None and budget not in budgets:
        raise ExportError(
            f"--budget {budget}: {where} decided under {', '.join(budgets) or 'no accuracy budget'}"
        )
    return budget or (budgets[0] if budgets else None)


def _one_stack(items: list[dict[str, Any]], what: str, fix: str) -> None:
    """Refuse rows or preset entries measured on more than one software stack."""
    stacks = {json.dumps({k: row_stack(i)[k] for k in STACK_KEYS}, sort_keys=True) for i in items}
    if len(stacks) > 1:
        raise ExportError(
            f"{what} come from {len(stacks)} software stacks ({'; '.join(sorted(stacks))}); "
            f"a bundle is valid on one: {fix}"
        )


def _tuned_plan(
    out: Location, hardware: str, budget: str | None
) -> tuple[list[dict[str, Any]], dict[str, Any], dict[str, Any]]:
    path = out.join(PRESETS_FILE)
    if not path.exists():
        raise ExportError(
            f"{out} holds an unfinished tune (no {PRESETS_FILE}): finish it with `orchestrate tune --resume`"
        )
    data = json.loads(path.read_text())
    chosen = _one_budget(
        [e["budget"] for e in data["presets"] if e.get("budget")], budget, f"the tune under {out}"
    )
    entries = [e for e in data["presets"] if e["hardware"] == hardware and e.get("budget") == chosen]
    if not entries:
        classes = sorted({e["hardware"] for e in data["presets"]})
        raise ExportError(
            f"the tune under {out} has no preset for hardware class {hardware!r}; classes there: "
            f"{', '.join(classes) or 'none'}"
        )
    _one_stack(entries, f"the {hardware} presets under {out}", "tune on one stack into a fresh --out")
    return entries, data["defaults"].get(hardware, {}), row_stack(entries[0])


def check_supported(
    entries: list[dict[str, Any]], defaults: dict[str, Any], hardware: str, caps: Any = None
) -> None:
    """Refuse, before any compile, presets whose models need an extra this environment lacks
    (`orchestrator.extras.models_need`), or that this machine's device (`caps`, by default
    `compiler.capabilities.from_device()`) cannot run: a class name that covers a smaller board
    than the one the tune ran on, or presets from before the planner knew the class's limits."""
    from compiler.capabilities import check_preset_supported, from_device
    from orchestrator.extras import models_need

    ids = [
        e.get("model_id") or (e.get("model_spec") or {}).get("id") for e in entries if not is_eager_preset(e)
    ]
    if need := models_need(i for i in ids if i):
        raise ExportError(f"{need}; nothing was compiled")

    caps = caps or from_device()
    cannot = [
        f"{_cell(e) if 'model' in e else 'class default'}: {reason}"
        for e in [*entries, *([defaults] if defaults.get("compile") is not None else [])]
        if (reason := check_preset_supported(caps, e))
    ]
    if cannot:
        raise ExportError(
            f"{len(cannot)} {hardware} preset(s) cannot run on this {caps.name} ({caps.sm}): "
            + "; ".join(cannot[:5])
            + ("; ..." if len(cannot) > 5 else "")
            + ". Tune again on this class (the tuner leaves such candidates out) and export that"
        )


def export(
    out: Target,
    hardware: str,
    dest: Path,
    *,
    threads: int | None = None,
    scratch_root: str | None = None,
    packages: bool = True,
    resume: bool = False,
    log: Callable[[str], None] = print,
    budget: str | None = None,
    sign_key: bytes | None = None,
) -> dict[str, Any]:
    """Write `dest` (see the module docstring); return the manifest. `budget`: which accuracy
    budget's presets, of a tune that decided under several. `sign_key`: sign the manifest with it
    (`manifest.sig`; the key itself is written nowhere). With `resume`, an interrupted
    export into `dest` (of the same source, class and package choice) goes on from its last
    finished preset. DEST's lock is held throughout (`lock.OutputLocked`, before anything is read,
    while another live driver holds it); a DEST that taking it created is removed again if the
    export is refused before it wrote anything there."""
    existed = Path(dest).exists()
    try:
        with holding(dest, again="Wait for it to finish, or pass another --dest."):
            return _export(
                out, hardware, Path(dest), threads, scratch_root, packages, resume, log, budget, sign_key
            )
    except BaseException:
        if not existed:
            with contextlib.suppress(OSError):
                Path(dest).rmdir()  # only if empty: an interrupted export's bundles stay, for --resume
        raise


def _export(
    out: Target,
    hardware: str,
    dest: Path,
    threads: int | None,
    scratch_root: str | None,
    packages: bool,
    resume: bool,
    log: Callable[[str], None],
    budget: str | None = None,
    sign_key: bytes | None = None,
) -> dict[str, Any]:
    """The export's steps: plan it and refuse what this node cannot build; pick up an interrupted
    export's progress; a bundle (and package) per preset; serving.json; the manifest, last."""
    left_out: list[str] = []
    entries, defaults, stack = plan_export(out, hardware, budget, left_out)
    for line in left_out:
        log(f"warning: no preset for {line}")
    device = "cpu" if hardware == "cpu" else "cuda"
    _check_this_node(hardware, device, stack)
    check_supported(entries, defaults, hardware)
    runs = read_runs(out)
    specs, profiles = model_specs(runs), serving_profiles(runs)
    dest = Path(dest)
    key = {
        "source": str(out),
        "hardware": hardware,
        "packages": packages,
        **({"budget": budget} if budget else {}),
    }
    done = _resumed(dest, key, resume, len(entries), log)
    (dest / BUNDLES).mkdir(parents=True, exist_ok=True)
    if packages:
        (dest / PACKAGES).mkdir(parents=True, exist_ok=True)
    run = _Run(
        hardware=hardware,
        device=device,
        dest=dest,
        key=key,
        specs=specs,
        profiles=profiles,
        rows=[r for r in read_results(out).to_pylist() if r["hardware"] == hardware] if profiles else [],
        threads=threads or max(1, os.cpu_count() or 1),
        scratch_root=scratch_root,
        packages=packages,
        log=log,
        total=len(entries),
    )
    for i, entry in enumerate(entries, 1):
        entries[i - 1] = _export_preset(run, i, entry, done)
    _write_presets(dest, hardware, stack, entries, defaults)
    return _write_manifest(dest, out, hardware, stack, entries, sign_key)


def _check_this_node(hardware: str, device: str, stack: dict[str, Any]) -> None:
    """Refuse an export on a node of another class than `hardware`, or on another stack than the
    presets were measured on: a bundle only loads where it was built."""
    here = hardware_class(device if device == "cpu" else None)
    if here != hardware:
        raise ExportError(
            f"bundles for {hardware!r} must be compiled on a {hardware} node; this machine is {here!r}. Run "
            f"`orchestrate export` there (e.g. through `ray job submit` with a {hardware} resource)"
        )
    differs = stack_mismatch(stack, software_stack())
    if differs:
        raise ExportError(
            f"the {hardware} presets were measured on another stack than this one: {', '.join(differs)}; export "
            "on the stack that ran the sweep (a bundle only loads on the stack that built it)"
        )


def _resumed(
    dest: Path, key: dict[str, Any], resume: bool, total: int, log: Callable[[str], None]
) -> dict[str, dict[str, Any]]:
    """The presets an interrupted export into `dest` finished (`PROGRESS`), by cell; {} for an empty
    `dest`. Refuses a `dest` with anything else in it, or one of another export (`key`)."""
    if not dest.exists() or not any(p.name != LOCK_FILE for p in dest.iterdir()):  # the lock is ours
        return {}
    progress = dest / PROGRESS
    if not resume or not progress.exists() or (dest / MANIFEST).exists():
        what = "a finished export" if (dest / MANIFEST).exists() else "not an interrupted export"
        hint = "" if resume else ", or add --resume if an export into it was interrupted"
        raise ExportError(
            f"{dest} is not empty ({what}); export into a new directory{hint} (nothing there was changed)"
        )
    saved = json.loads(progress.read_text())
    if saved.get("key") != key:
        raise ExportError(
            f"{progress}: that export was of {saved.get('key')}, this one is of {key}; resume it with the "
            "same arguments, or export into a new directory"
        )
    done = {_cell(e): e for e in saved.get("entries", [])}
    log(f"resuming the export into {dest}: {len(done)} of {total} presets already done")
    return done


@dataclass
class _Run:
    """What each preset's step of one export needs, and what it has finished so far."""

    hardware: str
    device: str
    dest: Path
    key: dict[str, Any]
    """What the export is of (source, class, packages, budget): `--resume` must match it."""
    specs: dict[str, ModelSpec]
    profiles: dict[str, ServingProfile]
    """Each model's serving profile (`orchestrator.tune.sweep_models`): its preset gets a plan."""
    rows: list[dict[str, Any]]  # the class's result rows where a model has a profile (`config_miss`)
    threads: int
    scratch_root: str | None
    packages: bool
    log: Callable[[str], None]
    total: int
    started: float = field(default_factory=time.monotonic)
    finished: list[dict[str, Any]] = field(default_factory=list)
    crashed: str = ""
    """A package load that killed its process: this stack cannot serve packages."""

    def save_progress(self) -> None:
        durable.write_text(
            self.dest / PROGRESS, json.dumps({"key": self.key, "entries": self.finished}, default=str)
        )


def _export_preset(
    run: _Run, i: int, entry: dict[str, Any], done: dict[str, dict[str, Any]]
) -> dict[str, Any]:
    """The `i`th preset's step: taken as an earlier try finished it, recorded as eager (nothing to
    compile), or its bundle (and package) built; returns its entry, saved in the progress."""
    if _cell(entry) in done:
        entry = done[_cell(entry)]
        run.finished.append(entry)
        return entry
    if is_eager_preset(entry):
        entry["bundle"] = entry["package"] = None
        run.log(
            f"[{i}/{run.total}] {_cell(entry)}: eager (do not compile: compiled "
            f"{entry.get('eager_over_config')} was slower), no bundle or package; runtime "
            f"{preset_runtime(entry) or 'torch defaults'}"
        )
    else:
        _bundle_preset(run, i, entry)
    run.finished.append(entry)
    run.save_progress()
    return entry


def _bundle_preset(run: _Run, i: int, entry: dict[str, Any]) -> None:
    """Build the preset's bundle (and package) in a fresh process; record the outcome in `entry`."""
    from workers.runner import build_bundle

    if entry.get("model_spec"):
        spec = ModelSpec(**entry["model_spec"])
    else:
        spec = run.specs.get(entry["model"]) or ModelSpec(id=entry["model_id"], name=entry["model"])
    config = CompileConfig.from_dict({"name": entry["config"], **entry["compile"]})
    job = Job(
        sweep="export",
        hardware=run.hardware,
        device=run.device,
        model=spec,
        batch_size=entry["batch_size"],
        dtype=entry.get("precision") or entry["dtype"],
        config=config,
        measure=MeasureSpec(),
        timeout_s=config.effective_timeout(None),
    )
    dest = run.dest
    rel = _bundle_name(entry)
    package = _bundle_name(entry, PACKAGES, ".pt2") if run.packages and not run.crashed else None
    profile = run.profiles.get(entry["model"])
    serving, stock = (profile.to_dict(), serving_stock(entry)) if profile else (None, None)
    built = build_bundle(
        job, dest / rel, run.threads, run.scratch_root, dest / package if package else None, serving, stock
    )
    result = _bundle_outcome(built, dest / rel)
    if LOADER_CRASHED in (result.get("package_error") or ""):
        run.crashed = result["package_error"]
    cell = _cell(entry)
    entry["model_spec"] = dataclasses.asdict(spec)
    if result.get("status") == "ok":
        entry["bundle"] = rel
        entry["bundle_compile_s"] = result.get("compile_s")
        entry["bundle_artifacts"] = result.get("bundle_artifacts")
        if result.get("serving"):
            entry["serving"] = {
                **packaged_plan(result["serving"], PACKAGES),
                "config_miss": config_miss(run.rows, entry),
            }
        run.log(
            f"[{i}/{run.total}] {cell}: bundle {result.get('bundle_bytes', 0) / 1e6:.1f} MB, cold compile "
            f"{result.get('compile_s', 0):.1f} s"
            + package_line(entry, package, result, run.crashed if package is None else "")
            + serving_line(entry.get("serving"))
            + f" (elapsed {time.monotonic() - run.started:.0f} s)"
            + bundle_caveat(config, result.get("bundle_artifacts") or {})
        )
    else:
        entry["bundle"] = None
        entry["bundle_error"] = f"{result.get('status')}: {(result.get('error') or '').splitlines()[0][:300]}"
        run.log(f"[{i}/{run.total}] {cell}: no bundle ({entry['bundle_error']})")


def _write_presets(
    dest: Path, hardware: str, stack: dict[str, Any], entries: list[dict[str, Any]], defaults: dict[str, Any]
) -> None:
    """DEST/serving.json: every preset, as exported, and the class defaults."""
    presets = {
        "format": EXPORT_FORMAT,
        "hardware": hardware,
        "budget": next((e.get("budget") for e in entries if e.get("budget")), None),
        "stack": stack,
        "presets": entries,
        "defaults": defaults,
    }
    durable.write_text(dest / SERVING_FILE, json.dumps(presets, indent=1, sort_keys=True, default=str) + "\n")


def _write_manifest(
    dest: Path,
    out: Target,
    hardware: str,
    stack: dict[str, Any],
    entries: list[dict[str, Any]],
    sign_key: bytes | None = None,
) -> dict[str, Any]:
    """DEST/manifest.json, written last (the export is finished), with the sha256 of every other
    file, and just before it its signature with `sign_key` (or no signature); an earlier try's stray
    temporary files and the progress file go. Returns the manifest."""
    for stray in [p for p in dest.rglob(".*") if p.is_file() and p.name not in (PROGRESS, LOCK_FILE)]:
        stray.unlink()  # the temporary file of a job killed mid-write, on an earlier try
    files = {
        str(p.relative_to(dest)): sha256_file(p)
        for p in sorted(dest.rglob("*"))
        if p.is_file() and p.name not in (MANIFEST, SIGNATURE, PROGRESS, LOCK_FILE)
    }
    manifest = {
        "format": EXPORT_FORMAT,
        "hardware": hardware,
        "stack": {**stack, "driver": software_stack().get("driver") or stack.get("driver")},
        "created_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "source": str(out),
        # the process-wide settings each preset runs under (also in serving.json), so an operator
        # sees what compile_tuned will set in the serving process without reading every preset
        "runtime": {_cell(e): preset_runtime(e) for e in entries},
        "files": files,
    }
    text = (json.dumps(manifest, indent=1, sort_keys=True) + "\n").encode()
    write_signature(dest, text, sign_key)  # before the manifest: a finished export is a signed one
    durable.write_bytes(dest / MANIFEST, text)
    (dest / PROGRESS).unlink(missing_ok=True)
    return manifest
