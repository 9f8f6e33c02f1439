"""Apply an exported preset in a production process: `compile_tuned`.

    from compiler.apply import compile_tuned

    compiled, applied = compile_tuned(model, {"pixel_values": x}, "/opt/presets/H100", model_name="vit")
    print(applied.summary())

An export directory (`orchestrate export OUT --hardware CLASS --dest DIR`) holds `manifest.json`
(the hardware class, the software stack it was built on and the sha256 of every file),
`presets.json` (per model, batch size and precision: the compile config that won; and a
per-class default for models never swept), `bundles/*.bin`, compile-cache bundles from
`torch.compiler.save_cache_artifacts()` made on that class by compiling each preset, and
`packages/*.pt2`, each preset compiled ahead of time for its batch size (`compiler.aoti`).

`compile_tuned` checks that this process runs on the class and stack the export was built for,
picks the preset (the exact cell, else the class default), serves an exact cell from its package
when the example inputs have the package's signature (verified, loaded with the model's own
weights, checked against eager; see `compile_tuned`), and otherwise verifies the bundle's sha256 against
the manifest before loading it (bundles are unpickled on load: a file that does not match is
refused, never loaded), loads it, applies the config (its global Inductor knobs and precision
policy included), compiles, and runs the example inputs once so the compile happens now. On
another class or stack, or with a damaged export, it warns once (`PresetFallbackWarning`) and
falls back to plain `torch.compile(model)`; it never raises for those unless `strict=True`.

This module imports neither Ray nor the orchestrator package.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import tempfile
import time
import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from compiler.aoti import split_inputs
from compiler.config import CompileConfig
from compiler.hardware import hardware_class, software_stack, stack_mismatch

MANIFEST = "manifest.json"
PRESETS = "presets.json"
EXPORT_FORMAT = 1
DTYPE_POLICIES = {"float32": ("fp32", "tf32"), "bfloat16": ("bf16",), "float16": ("fp16",)}


class PresetFallbackWarning(UserWarning):
    """The export does not apply here (another class or stack, a damaged file): plain
    `torch.compile` instead."""


class RuntimeSettingWarning(UserWarning):
    """`compile_tuned` changed a process-wide runtime setting (`compiler.runtime`) to the value
    the preset was measured under."""


class ExportError(RuntimeError):
    """An export that cannot be made (`orchestrate export`) or used (`compile_tuned` with
    `strict=True`); the message names the file and what to do."""


@dataclass
class Applied:
    """What `compile_tuned` did."""

    source: str
    hardware: str
    """This process's hardware class."""
    stack: dict[str, Any]
    match: str = "fallback"
    """`exact` (the preset of this model, batch size and precision), `class_default`, or
    `fallback` (plain `torch.compile`)."""
    preset: dict[str, Any] | None = None
    config: dict[str, Any] | None = None
    """The CompileConfig applied (`torch.compile` arguments and `freezing`)."""
    runtime: dict[str, Any] = field(default_factory=dict)
    """The process-wide runtime settings this process now runs under (`compiler.runtime`: the
    preset's, torch's defaults for those it does not name), set before the first call."""
    precision: str | None = None
    bundle: str = "none"
    """`loaded`, `refused` (sha256 mismatch or unreadable), `none` (the preset has no bundle)."""
    bundle_file: str | None = None
    cache_artifacts: dict[str, int] = field(default_factory=dict)
    """Artifacts the bundle put into the local caches, by cache (inductor, aot_autograd, ...)."""
    package: str = "none"
    """The preset's AOTInductor package: `loaded` (the returned model runs it: the config's Inductor
    options without `freezing`, which packages never use, see `compiler.aoti.package_options`), `refused` (sha256
    mismatch), `failed` (it would not load or its outputs differed from eager: see `warnings`),
    `skipped` (another input signature, `use_package=False`, or not the exact cell), `none`."""
    package_file: str | None = None
    compile_s: float | None = None
    """Wall time of the first call (the compile), when example inputs were run; with a package,
    from verifying it to the end of its first call (and CUDA-graph capture)."""
    warnings: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def summary(self) -> str:
        what = self.config.get("name") if self.config else "torch.compile defaults"
        compile_s = f", first call {self.compile_s:.2f} s" if self.compile_s is not None else ""
        return (
            f"{self.hardware}: {self.match} preset {what!r} (package {self.package}, bundle {self.bundle})"
            f"{compile_s}"
        )


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _local_copy(source: str | Path) -> Path:
    """A local directory holding the export: `source` itself, or a download of a URI's files
    (`s3://`, `gs://`, `file://`, ... through pyarrow's filesystems) into a temporary directory."""
    text = str(source)
    if "://" not in text:
        return Path(text)
    import pyarrow.fs as pafs

    fs, root = pafs.FileSystem.from_uri(text)
    local = Path(tempfile.mkdtemp(prefix="compile-preset-"))
    selector = pafs.FileSelector(root, recursive=True)
    for info in fs.get_file_info(selector):
        if info.type != pafs.FileType.File:
            continue
        dest = local / Path(info.path).relative_to(root.rstrip("/"))
        dest.parent.mkdir(parents=True, exist_ok=True)
        with fs.open_input_stream(info.path) as src, open(dest, "wb") as out:
            out.write(src.read())
    return local


def _verified(root: Path, manifest: dict[str, Any], rel: str) -> bytes:
    """The bytes of `root/rel`, read once and checked against the manifest's sha256 (raises
    ExportError), so what is loaded is exactly what was hashed."""
    expected = (manifest.get("files") or {}).get(rel)
    path = root / rel
    if expected is None:
        raise ExportError(f"{path}: not listed in {root / MANIFEST}; refusing to load it")
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ExportError(f"{path}: cannot read it ({exc})") from exc
    actual = hashlib.sha256(data).hexdigest()
    if actual != expected:
        raise ExportError(
            f"{path}: sha256 {actual[:16]}... does not match the manifest's {expected[:16]}...; the file was "
            "changed after export: refusing to load it (re-export, or copy the directory again)"
        )
    return data


def _policies(model: Any, dtype: str | None) -> tuple[str, ...]:
    if dtype:
        return (dtype,)
    try:
        param = next(model.parameters())
    except (AttributeError, StopIteration):
        return ("fp32", "tf32")
    return DTYPE_POLICIES.get(str(param.dtype).removeprefix("torch."), ())


def _batch_size(example_inputs: Any) -> int | None:
    import torch

    values = example_inputs.values() if isinstance(example_inputs, dict) else example_inputs
    if isinstance(values, torch.Tensor):
        values = [values]
    for value in values:
        if isinstance(value, torch.Tensor) and value.dim() > 0:
            return int(value.shape[0])
    return None


def find_preset(
    presets: dict[str, Any], model_name: str | None, batch_size: int | None, policies: tuple[str, ...]
) -> tuple[str, dict[str, Any] | None]:
    """(`exact`, entry) for this model, batch size and one of `policies` (in that order of
    preference); else (`class_default`, the class default); else (`fallback`, None)."""
    for policy in policies:
        for entry in presets.get("presets", []):
            if (
                entry["model"] == model_name
                and entry["batch_size"] == batch_size
                and entry["dtype"] == policy
            ):
                return "exact", entry
    defaults = presets.get("defaults") or {}
    for policy in policies:
        if policy in defaults:
            return "class_default", defaults[policy]
    return "fallback", None


def _call(fn: Any, inputs: Any) -> Any:
    args, kwargs = split_inputs(inputs)
    return fn(*args, **kwargs)


def compile_tuned(
    model: Any,
    example_inputs: Any,
    source: str | Path,
    *,
    model_name: str | None = None,
    batch_size: int | None = None,
    dtype: str | None = None,
    run_example: bool = True,
    use_package: bool = True,
    strict: bool = False,
) -> tuple[Any, Applied]:
    """Compile `model` with the preset exported to `source` (a directory or a URI) for this
    hardware class and software stack; return the compiled model and what was applied.

    `model_name` is the model's name in the sweep the presets came from (without it only the
    class default applies); `batch_size` defaults to the first dimension of the first tensor of
    `example_inputs` (a dict of keyword arguments, a tuple of positional ones, or one tensor);
    `dtype` is the precision policy (fp32, tf32, bf16, fp16), by default read from the model's
    parameters (float32 looks for fp32, then tf32). With `run_example` the example inputs are run
    under `torch.no_grad()` once eagerly (as the export job did before it compiled: a model whose
    first call changes it would otherwise trace other graphs and miss the bundle) and once
    compiled, so the compile (and the bundle's cache hits) happen here; `compile_s` times the
    compiled call.
    With `use_package`, an exact cell whose export holds an AOTInductor package (`compiler.aoti`)
    for these inputs' signature is served from it: verified, loaded with this model's weights, run
    once against eager (always, whatever `run_example` says: a package whose outputs differ is not
    used) and returned as a `compiler.aoti.PackagedModel`, which compiles the preset with
    `torch.compile` for any other input signature. Otherwise the bundle and `torch.compile`.
    With `strict`, what would be a fallback raises `ExportError` instead."""
    import torch

    device = None
    with contextlib.suppress(AttributeError, StopIteration):
        device = next(model.parameters()).device
    applied = Applied(source=str(source), hardware=hardware_class(device), stack=software_stack())

    def warn(message: str, stacklevel: int) -> None:  # stacklevel: the caller of compile_tuned
        applied.warnings.append(message)
        warnings.warn(message, PresetFallbackWarning, stacklevel=stacklevel)

    def fall_back(reason: str) -> tuple[Any, Applied]:
        if strict:
            raise ExportError(reason)
        warn(f"compile_tuned: {reason}; using plain torch.compile instead", stacklevel=4)
        compiled = torch.compile(model)
        _first_call(model, compiled)
        return compiled, applied

    def _first_call(eager: Any, compiled: Any) -> None:
        if run_example:
            with torch.no_grad():  # eagerly first, as the export job did before compiling: some
                _call(eager, example_inputs)  # models (SegFormer) trace other graphs before it
            t0 = time.perf_counter()
            with torch.no_grad():
                _call(compiled, example_inputs)
            if device is not None and device.type == "cuda":
                torch.cuda.synchronize(device)
            applied.compile_s = time.perf_counter() - t0

    try:
        root = _local_copy(source)
        manifest = json.loads((root / MANIFEST).read_text())
        presets = json.loads(_verified(root, manifest, PRESETS))
    except (OSError, ValueError, ExportError) as exc:
        return fall_back(f"cannot use the export at {source}: {exc}")
    if manifest.get("format") != EXPORT_FORMAT:
        return fall_back(
            f"{root / MANIFEST}: format {manifest.get('format')!r}, this code reads {EXPORT_FORMAT}"
        )
    if manifest.get("hardware") != applied.hardware:
        return fall_back(
            f"the presets in {source} are for hardware class {manifest.get('hardware')!r}; this process runs "
            f"on {applied.hardware!r}"
        )
    differs = stack_mismatch(manifest.get("stack") or {}, applied.stack)
    if differs:
        return fall_back(f"the presets in {source} were built on another stack: {', '.join(differs)}")

    batch_size = batch_size or _batch_size(example_inputs)
    applied.match, entry = find_preset(presets, model_name, batch_size, _policies(model, dtype))
    if entry is None:
        return fall_back(
            f"no preset for model {model_name!r} at batch size {batch_size} and no class default in {source}"
        )
    applied.preset = {k: v for k, v in entry.items() if k != "compile"}
    config = CompileConfig.from_dict({"name": entry.get("config", "preset"), **entry["compile"]})
    applied.config = config.to_dict()

    def load_bundle() -> None:
        bundle = entry.get("bundle")
        if not bundle or applied.bundle != "none":
            return
        applied.bundle_file = str(root / bundle)
        try:
            data = _verified(root, manifest, bundle)
        except ExportError as exc:
            if strict:
                raise
            applied.bundle = "refused"
            warn(f"compile_tuned: {exc}; compiling without the bundle", stacklevel=5)
        else:
            info = torch.compiler.load_cache_artifacts(data)
            applied.bundle = "loaded"
            if info is not None:
                applied.cache_artifacts = {k: len(v) for k, v in info.artifacts.items()}

    cast = None
    policy = entry.get("precision") or entry.get("dtype")
    if policy:
        from compiler.precision import apply_precision

        target = apply_precision(policy)
        applied.precision = policy
        current = _param_dtype(model)
        if current is not None and current.is_floating_point and current != target:
            # a preset whose precision differs from the model's (tune with --precisions bf16):
            # the weights are cast as the measured job cast them, and so are the inputs, outside
            # the compiled region, so the graph is the one the bundle holds
            model = model.to(target)
            cast = target
    _apply_runtime(config, applied)
    model = config.prepare_model(model)
    config.apply_globals()

    def compile_preset() -> Any:
        load_bundle()
        return torch.compile(model, **config.compile_kwargs())

    def cast_note() -> None:
        warn(
            f"compile_tuned: the preset runs in {policy}: the model's weights were cast to {cast} and the "
            "returned model casts floating-point inputs to it",
            stacklevel=4,
        )

    if entry.get("package"):
        if use_package and applied.match == "exact":
            packaged = _packaged(
                model, example_inputs, cast, entry, root, manifest, applied, compile_preset, warn, strict
            )
            if packaged is not None:
                if cast is not None:
                    packaged = CastInputs(packaged, cast)
                    cast_note()
                return packaged, applied
        else:
            applied.package = "skipped"

    compiled = compile_preset()
    if cast is not None:
        model, compiled = CastInputs(model, cast), CastInputs(compiled, cast)
        cast_note()
    _first_call(model, compiled)
    return compiled, applied


def _apply_runtime(config: CompileConfig, applied: Applied) -> None:
    """Set the preset's runtime settings (and torch's defaults for the others), as the job that
    measured it did before its first call; say so where that changes what the process had. A
    process keeps its first cuDNN plan per convolution, so this must happen before the model's
    first convolution runs in the process."""
    from compiler import runtime

    before = config.apply_runtime()
    applied.runtime = runtime.current()
    changed = {k: (before[k], v) for k, v in applied.runtime.items() if before.get(k) != v}
    if changed:
        what = ", ".join(f"{k}: {old} -> {new}" for k, (old, new) in changed.items())
        message = (
            f"compile_tuned: set the process-wide runtime settings the preset was measured under ({what}); "
            "they apply to every model in this process"
        )
        applied.warnings.append(message)
        warnings.warn(message, RuntimeSettingWarning, stacklevel=4)


def _packaged(
    model: Any,
    example_inputs: Any,
    cast: Any,
    entry: dict[str, Any],
    root: Path,
    manifest: dict[str, Any],
    applied: Applied,
    compile_preset: Any,
    warn: Any,
    strict: bool,
) -> Any:
    """The preset's package loaded with `model`'s weights and checked against eager on the example
    inputs, or None (with `applied.package` and a warning saying why) to compile instead."""
    import torch

    from compiler import aoti
    from compiler.measure import compare_outputs

    args, kwargs = split_inputs(example_inputs)
    if cast is not None:
        caster = CastInputs(None, cast)
        args, kwargs = tuple(map(caster._cast, args)), {k: caster._cast(v) for k, v in kwargs.items()}
    if aoti.signature(args, kwargs) != entry.get("package_inputs"):
        applied.package = "skipped"
        return None
    applied.package_file = str(root / entry["package"])
    with torch.no_grad():  # the reference the package must reproduce
        reference = model(*args, **kwargs)
    device = next((t.device for t in aoti.tensors(reference)), None)
    t0 = time.perf_counter()
    try:
        data = _verified(root, manifest, entry["package"])
    except ExportError as exc:
        if strict:
            raise
        applied.package = "refused"
        warn(f"compile_tuned: {exc}; compiling the preset instead", stacklevel=4)
        return None
    try:
        with tempfile.TemporaryDirectory(prefix="compile-package-") as scratch:
            path = Path(scratch) / "package.pt2"  # exactly the bytes that were hashed
            path.write_bytes(data)
            packaged = aoti.PackagedModel.load(
                path, model, entry["package_inputs"], bool(entry.get("package_cudagraphs")), compile_preset
            )
        packaged.capture(args, kwargs)
        with torch.no_grad():
            out = packaged(*args, **kwargs)
        if device is not None and device.type == "cuda":
            torch.cuda.synchronize(device)
        elapsed = time.perf_counter() - t0
    except Exception as exc:  # a package that will not load here: the preset compiles instead
        applied.package = "failed"
        warn(
            f"compile_tuned: {applied.package_file}: {type(exc).__name__}: {exc}; compiling the preset instead",
            stacklevel=4,
        )
        return None
    cmp = compare_outputs(aoti.tensors(reference), aoti.tensors(out), applied.precision or "fp32")
    if not cmp.ok:
        applied.package = "failed"
        warn(
            f"compile_tuned: {applied.package_file}: its outputs differ from eager ({cmp.detail}); compiling "
            "the preset instead",
            stacklevel=4,
        )
        return None
    applied.package = "loaded"
    applied.compile_s = elapsed
    return packaged


def _param_dtype(model: Any):
    try:
        return next(model.parameters()).dtype
    except (AttributeError, StopIteration):
        return None


class CastInputs:
    """Calls `inner` with every floating-point tensor argument cast to `dtype` (a preset whose
    precision is not the caller's)."""

    def __init__(self, inner: Any, dtype: Any):
        self.inner = inner
        self.dtype = dtype

    def _cast(self, value: Any) -> Any:
        import torch

        if isinstance(value, torch.Tensor) and value.is_floating_point():
            return value.to(self.dtype)
        return value

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.inner(*map(self._cast, args), **{k: self._cast(v) for k, v in kwargs.items()})
