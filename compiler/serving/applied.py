"""What `compiler.serving.compile_tuned` hands back: the record of what it did (`Applied`), the
wrapper around a model whose preset runs in another dtype than the model's (`CastInputs`: it
casts the inputs outside the compiled region), and the warning it gives where the export does not
apply here (`PresetFallbackWarning`).

This module imports neither Ray nor the orchestrator package."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


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
    """`exact` (the preset of this model, batch size and precision), `serving` (the model's preset
    whose serving plan covers a range, where one was asked for), `class_default`, or `fallback`
    (plain `torch.compile`)."""
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
    """`loaded`, `refused` (sha256 mismatch or unreadable, a container `compiler.serving.bundle_check`
    refused, or one torch's loader raised on: see `warnings`), `none` (the preset has no bundle)."""
    bundle_file: str | None = None
    cache_artifacts: dict[str, int] = field(default_factory=dict)
    """Artifacts the bundle put into the local caches, by cache (inductor, aot_autograd, ...)."""
    package: str = "none"
    """The preset's AOTInductor package: `loaded` (the returned model runs it: the config's Inductor
    options without `freezing`, which packages never use, see `compiler.aoti.package_options`), `refused` (sha256
    mismatch), `failed` (it would not load or its outputs differed from eager: see `warnings`),
    `skipped` (another input signature, `use_package=False`, or not the exact cell), `none`."""
    package_file: str | None = None
    signed_by: str | None = None
    """The id of the key whose signature of the manifest verified (`compiler.serving.signature`:
    the first 8 hex digits of its sha256, never the key); None where no key was named."""
    serving: dict[str, Any] | None = None
    """Where a serving profile applied (`compiler.serving.served`): the plan (`buckets` or
    `dynamic`), its buckets, the profile, the sizes prepared at load, `prepare_s`, the Dynamo graphs
    it compiled, the device memory it holds (CUDA), the padding check and where the plan came from
    (`plan_from`: `export`, or `load` where it was decided here). None: one batch size's preset."""
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
        serving = ""
        if self.serving:
            s = self.serving
            prof = s["profile"]["batch"]
            on = f" on buckets {s['buckets']}" if s["plan"] == "buckets" else ""
            serving = (
                f"; serves batch {prof['min']}..{prof['max']} with the {s['plan']} plan{on}, prepared in "
                f"{s['prepare_s']:.2f} s"
            )
        return (
            f"{self.hardware}: {self.match} preset {what!r} (package {self.package}, bundle {self.bundle})"
            f"{compile_s}{serving}"
        )


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
