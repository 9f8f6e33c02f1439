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
picks the preset (the exact cell, else the class default), returns the model uncompiled where the
preset is eager (`compile: null`: every compiled config was slower there; its runtime settings
and precision are still applied), serves an exact cell from its package
when the example inputs have the package's signature (verified, loaded with the model's own
weights, checked against eager; see `compile_tuned`), and otherwise verifies the bundle's sha256 against
the manifest before loading it (bundles are unpickled on load: a file that does not match is
refused, never loaded), loads it, applies the config (its global Inductor knobs and precision
policy included), compiles, and runs the example inputs once so the compile happens now. On
another class or stack, or with a damaged export, it warns once (`PresetFallbackWarning`) and
falls back to plain `torch.compile(model)`; it never raises for those unless `strict=True`.
The export's files are read through `compiler.export_files`: the manifest and presets checked
for shape, every path confined to the export, an export at a URI fetched once into a
content-addressed cache in the user's cache directory.

This module imports neither Ray nor the orchestrator package.
"""

from __future__ import annotations

import contextlib
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from compiler.aoti import split_inputs
from compiler.config import CompileConfig, is_eager_preset
from compiler.export_files import (
    CACHE_ENV,
    EXPORT_FORMAT,
    MANIFEST,
    PRESETS,
    ExportCacheWarning,
    ExportError,
    ExportFiles,
    cache_root,
    open_export,
    preset_config,
    sha256_file,
    warn_caller,
)
from compiler.hardware import hardware_class, software_stack, stack_mismatch
from compiler.process_settings import ProcessSettings, RuntimeSettingWarning, SettingMismatchWarning

__all__ = [
    "CACHE_ENV",
    "EXPORT_FORMAT",
    "MANIFEST",
    "PRESETS",
    "Applied",
    "CastInputs",
    "ExportCacheWarning",
    "ExportError",
    "PresetFallbackWarning",
    "RuntimeSettingWarning",
    "SettingMismatchWarning",
    "cache_root",
    "compile_tuned",
    "find_preset",
    "sha256_file",
]

DTYPE_POLICIES = {"float32": ("fp32", "tf32", "fp32-strict"), "bfloat16": ("bf16",), "float16": ("fp16",)}
"""The cell precisions a model's parameter dtype looks for, in order (`compiler.precision`)."""


class PresetFallbackWarning(UserWarning):
    """The export does not apply here (another class or stack, a damaged file): plain
    `torch.compile` instead."""


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
    """The CompileConfig applied (`torch.compile` arguments and `freezing`); None for an eager preset."""
    eager: str | None = None
    """An eager preset (`compiler.config.is_eager_preset`): the model was returned uncompiled, under
    the preset's runtime settings and precision; why, from the preset's figures."""
    runtime: dict[str, Any] = field(default_factory=dict)
    """The process-wide runtime settings this process now runs under (`compiler.runtime`), after
    the preset set its own before the first call."""
    changed: dict[str, list[Any]] = field(default_factory=dict)
    """Every process-wide setting `compile_tuned` changed, as name -> [old, new]: the preset's
    runtime settings, its precision policy's float32 switches (`cudnn_allow_tf32`,
    `matmul_precision`), Inductor's `freezing`. A setting the preset leaves at torch's default is
    never changed, only checked (`SettingMismatchWarning`)."""
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
        if self.eager is not None:
            return f"{self.hardware}: {self.match} eager preset, not compiled: {self.eager}"
        what = self.config.get("name") if self.config else "torch.compile defaults"
        compile_s = f", first call {self.compile_s:.2f} s" if self.compile_s is not None else ""
        return (
            f"{self.hardware}: {self.match} preset {what!r} (package {self.package}, bundle {self.bundle})"
            f"{compile_s}"
        )


def _policies(model: Any, dtype: str | None) -> tuple[str, ...]:
    if dtype:
        return (dtype,)
    try:
        param = next(model.parameters())
    except (AttributeError, StopIteration):
        return DTYPE_POLICIES["float32"]
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
    filesystem: Any = None,
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
    With `strict`, what would be a fallback raises `ExportError` instead.
    An eager preset (`compiler.config.is_eager_preset`: the tuner measured eager faster than the
    compiled config it had chosen) sets its precision policy and runtime settings and returns
    `model` itself, uncompiled (cast where its precision is not the model's, as for any preset);
    `applied.eager` and `applied.summary()` say why, and `run_example` runs nothing.

    `source` is read through `compiler.export_files`: a directory in place; a URI (or, with
    `filesystem`, a `pyarrow.fs.FileSystem`, a path in it) through the content-addressed cache in
    `cache_root()` (`$COMPILE_ORCHESTRATOR_CACHE` moves it): the manifest and presets.json first,
    then only the bundle and package of the preset it serves, each fetched once per cache."""
    tuning = _Tuning(model, example_inputs, source, strict=strict, run_example=run_example)
    return tuning.run(filesystem, model_name, batch_size, dtype, use_package)


def _unsupported(entry: dict[str, Any], device: Any) -> str | None:
    """Why this process's device cannot run the preset `entry` (`compiler.capabilities`), or None."""
    from compiler.capabilities import CPU, check_preset_supported, from_device

    on_gpu = device is not None and device.type == "cuda"
    return check_preset_supported(from_device(device.index or 0) if on_gpu else CPU, entry)


class _Tuning:
    """One `compile_tuned` call: what it was given, the export and preset it found, and what it
    did (`applied`)."""

    def __init__(
        self, model: Any, example_inputs: Any, source: str | Path, *, strict: bool, run_example: bool
    ):
        self.model = model
        self.inputs = example_inputs
        self.source = source
        self.strict = strict
        self.run_example = run_example
        self.device = None
        with contextlib.suppress(AttributeError, StopIteration):
            self.device = next(model.parameters()).device
        self.applied = Applied(
            source=str(source), hardware=hardware_class(self.device), stack=software_stack()
        )
        self.export: ExportFiles | None = None
        self.entry: dict[str, Any] = {}
        self.config = CompileConfig(name="none")
        self.cast: Any = None
        """The dtype the preset runs in where it is not the model's: inputs are cast to it."""
        self.settings = ProcessSettings(self.applied, strict)

    def warn(self, message: str) -> None:
        self.applied.warnings.append(message)
        warn_caller(message, PresetFallbackWarning)

    def refused(self, exc: ExportError, instead: str) -> None:
        """A file of the preset that cannot be used: raise under `strict`, else warn."""
        if self.strict:
            raise exc
        self.warn(f"compile_tuned: {exc}; {instead}")

    def fall_back(self, reason: str) -> tuple[Any, Applied]:
        import torch

        if self.strict:
            raise ExportError(reason)
        self.warn(f"compile_tuned: {reason}; using plain torch.compile instead")
        compiled = torch.compile(self.model)
        self.first_call(self.model, compiled)
        return compiled, self.applied

    def first_call(self, eager: Any, compiled: Any) -> None:
        import torch

        if not self.run_example:
            return
        with torch.no_grad():  # eagerly first, as the export job did before compiling: some
            _call(eager, self.inputs)  # models (SegFormer) trace other graphs before it
        t0 = time.perf_counter()
        with torch.no_grad():
            _call(compiled, self.inputs)
        if self.device is not None and self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        self.applied.compile_s = time.perf_counter() - t0

    def choose(
        self, filesystem: Any, model_name: str | None, batch_size: int | None, dtype: str | None
    ) -> str | None:
        """Open the export and pick the preset (`entry`, `config`); the reason to fall back, or None."""
        source, applied = self.source, self.applied
        try:
            self.export = export = open_export(source, filesystem)
        except ExportError as exc:
            return f"cannot use the export at {source}: {exc}"
        manifest = export.manifest
        if manifest["hardware"] != applied.hardware:
            return (
                f"the presets in {source} are for hardware class {manifest['hardware']!r}; this process "
                f"runs on {applied.hardware!r}"
            )
        differs = stack_mismatch(manifest["stack"], applied.stack)
        if differs:
            return f"the presets in {source} were built on another stack: {', '.join(differs)}"
        batch_size = batch_size or _batch_size(self.inputs)
        match, entry = find_preset(export.presets, model_name, batch_size, _policies(self.model, dtype))
        if entry is None:
            return f"no preset for model {model_name!r} at batch size {batch_size} and no class default in {source}"
        try:
            self.config = preset_config(entry, export.where(PRESETS))
        except ExportError as exc:
            return str(exc)
        unsupported = _unsupported(entry, self.device)
        if unsupported:
            return f"the preset {entry.get('config')!r} cannot run on this device: {unsupported}"
        self.entry, applied.match = entry, match
        applied.preset = {k: v for k, v in entry.items() if k != "compile"}
        if is_eager_preset(entry):
            applied.eager = _eager_why(entry)
        else:
            applied.config = self.config.to_dict()
        return None

    def run(
        self,
        filesystem: Any,
        model_name: str | None,
        batch_size: int | None,
        dtype: str | None,
        use_package: bool,
    ) -> tuple[Any, Applied]:
        reason = self.choose(filesystem, model_name, batch_size, dtype)
        if reason is not None:
            return self.fall_back(reason)
        self.set_precision()
        self.settings.runtime(self.config)
        if self.applied.eager is not None:  # nothing to compile: the model as eager was timed
            return self.casting(self.model), self.applied
        self.model = self.config.prepare_model(self.model)
        self.settings.inductor(self.config)
        if self.entry.get("package"):
            if use_package and self.applied.match == "exact":
                packaged = self.packaged()
                if packaged is not None:
                    return self.casting(packaged), self.applied
            else:
                self.applied.package = "skipped"
        compiled = self.casting(self.compile_preset())
        self.first_call(self.casting(self.model, note=False), compiled)
        return compiled, self.applied

    def set_precision(self) -> None:
        """The preset's precision policy in this process (`ProcessSettings.precision`); where its
        dtype is not the model's, cast the weights as the measured job cast them (`cast`: the inputs
        are cast too, outside the compiled region, so the graph is the one the bundle holds)."""
        from compiler import precision

        name = self.entry.get("precision") or self.entry.get("dtype")
        self.settings.preflight(name, self.config)
        self.settings.precision(name)
        target = precision.weights_dtype(name)
        current = _param_dtype(self.model)
        if current is not None and current.is_floating_point and current != target:
            self.model = self.model.to(target)
            self.cast = target

    def casting(self, fn: Any, note: bool = True) -> Any:
        """`fn`, casting its floating-point inputs to the preset's dtype where that is not the model's."""
        if self.cast is None:
            return fn
        if note:
            self.warn(
                f"compile_tuned: the preset runs in {self.applied.precision}: the model's weights were cast to "
                f"{self.cast} and the returned model casts floating-point inputs to it"
            )
        return CastInputs(fn, self.cast)

    def file(self, rel: str, instead: str) -> bytes | None:
        """The verified bytes of the preset's file `rel`, or None (refused, with a warning)."""
        assert self.export is not None
        try:
            return self.export.verified(rel)
        except ExportError as exc:
            self.refused(exc, instead)
            return None

    def load_bundle(self) -> None:
        import torch

        bundle = self.entry.get("bundle")
        if not bundle or self.applied.bundle != "none":
            return
        assert self.export is not None
        self.applied.bundle_file = self.export.where(bundle)
        data = self.file(bundle, "compiling without the bundle")
        if data is None:
            self.applied.bundle = "refused"
            return
        info = torch.compiler.load_cache_artifacts(data)
        if info is None:  # torch could not read the bytes (it logged why: "checksum does not match")
            self.applied.bundle = "refused"
            self.refused(
                ExportError(f"{bundle}: torch refused the compile-cache bundle (its warning above says why)"),
                "compiling without the bundle",
            )
            return
        self.applied.bundle = "loaded"
        self.applied.cache_artifacts = {k: len(v) for k, v in info.artifacts.items()}

    def compile_preset(self) -> Any:
        import torch

        self.load_bundle()
        return torch.compile(self.model, **self.config.compile_kwargs())

    def packaged(self) -> Any:
        """The preset's package loaded with the model's weights and checked against eager on the
        example inputs, or None (with `applied.package` and a warning saying why) to compile
        instead."""
        import torch

        from compiler import aoti
        from compiler.measure import compare_outputs

        applied, entry = self.applied, self.entry
        assert self.export is not None
        args, kwargs = split_inputs(self.inputs)
        if self.cast is not None:
            caster = CastInputs(None, self.cast)
            args, kwargs = tuple(map(caster._cast, args)), {k: caster._cast(v) for k, v in kwargs.items()}
        if aoti.signature(args, kwargs) != entry.get("package_inputs"):
            applied.package = "skipped"
            return None
        applied.package_file = self.export.where(entry["package"])
        with torch.no_grad():  # the reference the package must reproduce
            reference = self.model(*args, **kwargs)
        device = next((t.device for t in aoti.tensors(reference)), None)
        t0 = time.perf_counter()
        data = self.file(entry["package"], "compiling the preset instead")
        if data is None:
            applied.package = "refused"
            return None
        try:
            with tempfile.TemporaryDirectory(prefix="compile-package-") as scratch:
                path = Path(scratch) / "package.pt2"  # exactly the bytes that were hashed
                path.write_bytes(data)
                packaged = aoti.PackagedModel.load(
                    path,
                    self.model,
                    entry["package_inputs"],
                    # CUDA graphs only where the model runs on CUDA: an export written before
                    # build_package knew this marked CPU reduce-overhead packages for them too
                    bool(entry.get("package_cudagraphs")) and device is not None and device.type == "cuda",
                    self.compile_preset,
                )
            packaged.capture(args, kwargs)
            with torch.no_grad():
                out = packaged(*args, **kwargs)
            if device is not None and device.type == "cuda":
                torch.cuda.synchronize(device)
            elapsed = time.perf_counter() - t0
        except Exception as exc:  # a package that will not load here: the preset compiles instead
            applied.package = "failed"
            self.warn(
                f"compile_tuned: {applied.package_file}: {type(exc).__name__}: {exc}; compiling the preset instead"
            )
            return None
        cmp = compare_outputs(aoti.tensors(reference), aoti.tensors(out), applied.precision or "fp32")
        if not cmp.ok:
            applied.package = "failed"
            self.warn(
                f"compile_tuned: {applied.package_file}: its outputs differ from eager ({cmp.detail}); compiling "
                "the preset instead"
            )
            return None
        applied.package = "loaded"
        applied.compile_s = elapsed
        return packaged


def _eager_why(entry: dict[str, Any]) -> str:
    """Why a preset says eager, in the words of `Applied.summary`, from its figures (those of the
    compiled config it beat); a figure missing or of the wrong type is left out, never a TypeError."""

    def number(key: str) -> float | None:
        value = entry.get(key)
        return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None

    over, gain = entry.get("eager_over_config"), number("eager_gain")
    if not isinstance(over, str) or gain is None:
        return "the preset says not to compile"
    low, high, processes = (
        number("eager_gain_ci_low"),
        number("eager_gain_ci_high"),
        number("eager_gain_processes"),
    )
    interval = f" [{low:.2f}, {high:.2f}]" if low is not None and high is not None else ""
    over_n = f" over {processes:.0f} processes" if processes is not None else ""
    return f"compiled {over} was {gain:.2f}x slower{interval}{over_n} on {entry.get('hardware')}"


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
