"""Apply an exported preset in a production process: `compile_tuned`.

    from compiler.serving import compile_tuned

    compiled, applied = compile_tuned(model, {"pixel_values": x}, "/opt/presets/H100", model_name="vit")
    print(applied.summary())

An export directory (`orchestrate export OUT --hardware CLASS --dest DIR`) holds `manifest.json`
(the hardware class, the software stack it was built on and the sha256 of every file),
`serving.json` (per model, batch size and precision: the compile config that won; and a
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
The export's files are read through `compiler.serving.files`: the manifest and presets checked
for shape, every path confined to the export, an export at a URI fetched once into a
content-addressed cache in the user's cache directory.

This module is the call itself (`compile_tuned`, one call's steps in order); its parts are
modules of their own: which preset serves the model (`compiler.serving.choice`), the process-wide
settings a preset sets and checks (`compiler.serving.settings`), its compile-cache bundle and
AOTInductor package (`compiler.serving.artifacts`), and what the call hands back
(`compiler.serving.applied`). Every name a caller needs is importable from the package,
`compiler.serving`.

This module imports neither Ray nor the orchestrator package, nor do its parts.
"""

from __future__ import annotations

import contextlib
import time
from pathlib import Path
from typing import Any

from compiler.aoti import split_inputs
from compiler.config import CompileConfig, is_eager_preset
from compiler.hardware import hardware_class, software_stack, stack_mismatch
from compiler.serving.applied import Applied, CastInputs, PresetFallbackWarning
from compiler.serving.artifacts import PresetArtifacts
from compiler.serving.choice import (
    eager_reason,
    find_preset,
    inputs_batch_size,
    model_policies,
    unsupported_here,
)
from compiler.serving.files import ExportError, ExportFiles, open_export, preset_config, warn_caller
from compiler.serving.served import DeviceClock, exported_plan_applies, serve_range
from compiler.serving.settings import ProcessSettings
from compiler.serving.signature import SignatureError, named_key, verify
from compiler.serving.traffic import ServingProfile, as_profile

__all__ = ["compile_tuned"]


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
    trusted_key: bytes | None = None,
    trusted_key_file: str | Path | None = None,
    serving: Any = None,
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
    used) and returned as a `compiler.serving.packaged.PackagedModel`, which compiles the preset with
    `torch.compile` for any other input signature. Otherwise the bundle and `torch.compile`.
    With `strict`, what would be a fallback raises `ExportError` instead.
    `trusted_key` (the key's bytes) or `trusted_key_file` (a file holding it; by default the file
    `$ORCHESTRATE_EXPORT_KEY_FILE` names, if set) makes the export usable only if its manifest is
    signed with that key (`compiler.serving.signature`): an unsigned export, or one whose signature
    does not verify, raises `SignatureError` (an `ExportError`) whatever `strict` says, since
    nothing in it can be trusted; `applied.signed_by` is the id of the key that verified. Without
    a key, the manifest's sha256 list is all that is checked (docs/production.md, "Trust model").
    An eager preset (`compiler.config.is_eager_preset`: the tuner measured eager faster than the
    compiled config it had chosen) sets its precision policy and runtime settings and returns
    `model` itself, uncompiled (cast where its precision is not the model's, as for any preset);
    `applied.eager` and `applied.summary()` say why, and `run_example` runs nothing.

    `serving` (a `ServingProfile`, or its dict `{"batch": {"min": 1, "max": 32}, "traffic": {...}}`)
    asks for every batch size of a range: the model is served by a `compiler.serving.served`
    plan, prepared for the whole range before this returns, so no size of it compiles later. The
    preset's own plan is taken where its export has one for that range (`serving` in serving.json,
    decided by the tuner); otherwise it is decided here: buckets (1, 2, 3, 4, 6, 8, 12, ... up to
    max) where the padding check on the example inputs passes, else one dynamic-batch graph. A
    preset exported with a plan is served by it without `serving`. `applied.serving` says what was
    prepared, how long it took and the memory it holds; a batch above max is served in chunks of
    max (`compiler.serving.served`). With `use_package`, a buckets plan whose export holds a
    package for each bucket is prepared from those packages (no Dynamo graph at all); otherwise,
    and for a dynamic plan, the bundle and `torch.compile` prepare it.

    `source` is read through `compiler.serving.files`: a directory in place; a URI (or, with
    `filesystem`, a `pyarrow.fs.FileSystem`, a path in it) through the content-addressed cache in
    `cache_root()` (`$COMPILE_ORCHESTRATOR_CACHE` moves it): the manifest and serving.json first,
    then only the bundle and package of the preset it serves, each fetched once per cache."""
    key = named_key(trusted_key, trusted_key_file)  # a key named but unreadable raises: never unchecked
    tuning = _Tuning(
        model,
        example_inputs,
        source,
        strict=strict,
        run_example=run_example,
        key=key,
        profile=as_profile(serving),
    )
    return tuning.run(filesystem, model_name, batch_size, dtype, use_package)


class _Tuning:
    """One `compile_tuned` call: what it was given, the export and preset it found, and what it
    did (`applied`)."""

    def __init__(
        self,
        model: Any,
        example_inputs: Any,
        source: str | Path,
        *,
        strict: bool,
        run_example: bool,
        key: bytes | None = None,
        profile: ServingProfile | None = None,
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
        self.artifacts: PresetArtifacts | None = None
        """The preset's bundle and package, once `choose` found the preset."""
        self._key = key
        """The key the export's manifest must be signed with, or None (never into `applied`)."""
        self.profile = profile
        """The batch-size range the caller asked for (`serving=`), or None."""

    def check_signature(self, export: ExportFiles, manifest: bytes) -> None:
        """`ExportFiles.before_use`: with a key named, the manifest's signature (SignatureError)."""
        if self._key is not None:
            self.applied.signed_by = verify(export, manifest, self._key)

    def warn(self, message: str) -> None:
        self.applied.warnings.append(message)
        warn_caller(message, PresetFallbackWarning)

    def fall_back(self, reason: str) -> tuple[Any, Applied]:
        import torch

        if self.strict:
            raise ExportError(reason)
        self.warn(f"compile_tuned: {reason}; using plain torch.compile instead")
        if self.profile is not None:  # the range still prepared, with torch.compile's defaults
            served = serve_range(
                lambda dynamic: torch.compile(self.model, dynamic=dynamic),
                self.model,
                split_inputs(self.inputs),
                self.profile,
                {},
                CompileConfig(name="none"),
                self.applied,
            )
            return served, self.applied
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
            self.export = export = open_export(source, filesystem, self.check_signature)
        except SignatureError:
            raise  # with a key named, an export not signed with it is refused, never a fallback
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
        batch_size = batch_size or inputs_batch_size(self.inputs)
        match, entry = find_preset(export.presets, model_name, batch_size, model_policies(self.model, dtype))
        if entry is None:
            return f"no preset for model {model_name!r} at batch size {batch_size} and no class default in {source}"
        try:
            self.config = preset_config(entry, export.where(export.serving_file))
        except ExportError as exc:
            return str(exc)
        unsupported = unsupported_here(entry, self.device)
        if unsupported:
            return f"the preset {entry.get('config')!r} cannot run on this device: {unsupported}"
        self.entry, applied.match = entry, match
        self.artifacts = PresetArtifacts(export, entry, applied, strict=self.strict, warn=self.warn)
        applied.preset = {k: v for k, v in entry.items() if k != "compile"}
        if is_eager_preset(entry):
            applied.eager = eager_reason(entry)
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
        if self.profile is not None or self.entry.get("serving"):
            return self.casting(self.ranged(use_package)), self.applied
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

    def compile_preset(self) -> Any:
        import torch

        assert self.artifacts is not None
        self.artifacts.install_bundle()
        return torch.compile(self.model, **self.config.compile_kwargs())

    def ranged(self, use_package: bool) -> Any:
        """The model served over the batch-size range (`compiler.serving.served.serve_range`),
        every size prepared now: from the plan's packages where the export has them (a package
        per bucket, or the dynamic plan's for its range; and `use_package`), else from the bundle
        through `torch.compile`; `applied.serving` says how."""
        import torch

        assert self.artifacts is not None
        example = self._cast_call()
        kwargs = self.config.compile_kwargs()

        def compile_preset(dynamic: bool | None = False) -> Any:
            return torch.compile(self.model, **{**kwargs, "dynamic": dynamic})

        loaded = None
        loading = DeviceClock.of(example)
        if use_package and exported_plan_applies(self.entry, self.profile):
            loaded = self.artifacts.plan_packages(self.model, *example, compile_preset)
        if loaded is None:
            self.artifacts.install_bundle()
            has_package = self.entry.get("package") or (self.entry.get("serving") or {}).get("packages")
            if has_package and self.applied.package == "none":
                self.applied.package = "skipped"
        compile = compile_preset if loaded is None else (lambda dynamic: loaded.serve())
        served = serve_range(
            compile, self.model, example, self.profile, self.entry, self.config, self.applied
        )
        if loaded is not None:  # loading and capturing the packages is part of preparing the plan
            self.applied.serving.update(loading.since(), prepare_steps=loaded.steps)
            if loaded.bucket_s:  # what each bucket's package took, its first run and capture included
                self.applied.serving["bucket_prepare_s"] = {str(b): s for b, s in loaded.bucket_s.items()}
        return served

    def _cast_call(self) -> tuple[tuple, dict]:
        """The example inputs as (args, kwargs), cast to the preset's dtype where it is not the model's."""
        args, kwargs = split_inputs(self.inputs)
        if self.cast is not None:
            caster = CastInputs(None, self.cast)
            args, kwargs = tuple(map(caster._cast, args)), {k: caster._cast(v) for k, v in kwargs.items()}
        return args, kwargs

    def packaged(self) -> Any:
        """The preset's package, served with the model's weights where it reproduces eager on the
        example inputs (`PresetArtifacts.packaged`), or None to compile instead."""
        assert self.artifacts is not None
        args, kwargs = self._cast_call()
        return self.artifacts.packaged(self.model, args, kwargs, self.compile_preset)


def _param_dtype(model: Any):
    try:
        return next(model.parameters()).dtype
    except (AttributeError, StopIteration):
        return None
