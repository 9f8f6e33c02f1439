"""A job: one (hardware, model, batch size, precision, compile config) cell, and its stable id.

Jobs travel driver -> Ray task -> job subprocess as JSON, so everything here is plain data.
"""

from __future__ import annotations

import hashlib
import json
import platform
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from functools import cached_property, lru_cache
from importlib import metadata
from typing import Any, Literal

from compiler.config import CompileConfig
from compiler.precision import identity as precision_identity

PHASES = (
    "start",
    "imports",
    "build",
    "eager",
    "compile",
    "compiled_warmup",
    "timing",
    "flops",
    "accuracy",
    "exit",
)
"""Phases of a job process, in order; each has a `phase_<name>_s` column (summed over processes)."""
MEASURING = ("compile", "timing", "accuracy")
"""The phases whose time is the work a sweep is run for: a job's efficiency is their share of its
wall time (the row's `job_efficiency`, `analysis.efficiency`)."""


def job_efficiency(row: Mapping[str, Any]) -> float | None:
    """A results row's share of its `wall_s` spent in the `MEASURING` phases (`phase_<name>_s`);
    None where it has no wall time or never compiled or timed (an accuracy phase it lacks is 0)."""
    wall = row.get("wall_s")
    if not wall or row.get("phase_compile_s") is None or row.get("phase_timing_s") is None:
        return None
    return sum(row.get(f"phase_{p}_s") or 0.0 for p in MEASURING) / wall


Task = Literal[
    "image-classification",
    "image-segmentation",
    "object-detection",
    "zero-shot-object-detection",
    "other",
]
"""What a model does (the zoo's entries and a sweep's `task:` override)."""

Precision = Literal["fp32", "fp32-strict", "tf32", "bf16", "fp16"]
"""Precision policies (`compiler.precision`: what each does to the weights and to torch's float32
switches; `fp32` is the stock policy, torch's defaults as they are)."""

DeviceKind = Literal["cpu", "cuda"]


@dataclass(frozen=True)
class ModelSpec:
    """A model entry of a sweep file."""

    id: str
    """`hf:<org>/<name>` from the model zoo, `timm:<name>` / `torchvision:<name>`, or
    `python:<package.module>:<factory>` for user code."""
    name: str
    """Short name used in job names and tables; defaults to the last part of the id."""
    task: str | None = None
    """Task override; defaults to the zoo entry's task."""
    input_size: int | None = None
    """Input image size (H = W) override; defaults to the zoo entry's processor size."""
    overrides: dict[str, Any] = field(default_factory=dict)
    """Architecture overrides applied to the model config (e.g. `num_hidden_layers: 2`)."""
    timeout_s: float | None = None
    """Per-job time limit for this model; wins over the config's and the sweep's."""
    weights: str = "random"
    """`random` (the architecture with seeded random weights, nothing downloaded), `pretrained`
    (the checkpoint of the model's id from the local Hugging Face cache, offline), or a local
    directory holding a checkpoint (`save_pretrained`'s files). Accuracy against fp64 judges
    precision only on real weights; with random ones some outputs cannot judge it
    (`compiler.accuracy`)."""


@dataclass(frozen=True)
class MeasureSpec:
    """How latency is measured."""

    warmup: int = 5
    """Least untimed calls before timing, for eager and compiled (after the compiling call);
    warm-up goes on until the latency is stable (two windows of 5 calls within 2%)."""
    iterations: int = 20
    """Timed calls of each side; median, p10, p90 and every sample are reported."""
    rounds: int = 10
    """Eager and compiled calls alternate in this many blocks (interleaving)."""
    flops: bool = True
    """Count the FLOPs of one call (torch.utils.flop_counter) and report achieved TFLOP/s."""
    warm_compile: bool = False
    """Also time a second compile in a fresh process against the cache the first filled
    (implied by `repeats` > 1, whose later processes compile warm)."""
    repeats: int = 1
    """Processes that time the cell, one after another: the first compiles cold, the later ones
    against its cache. Every process's samples are kept, and the intervals cover the spread
    between processes (one process: they cover the noise within it only)."""


@dataclass(frozen=True)
class Baseline:
    """A second compiled side timed in the same processes as a job's config (`orchestrate tune`
    confirms a candidate against the best stock mode this way): one process compiles both, and
    eager, the baseline and the candidate calls are interleaved, so their ratio is paired."""

    config: CompileConfig
    dtype: str
    """Its precision policy (the cell's; the candidate's own may differ where the user allows)."""

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Baseline:
        return cls(config=CompileConfig.from_dict(data["config"]), dtype=data["dtype"])


@dataclass(frozen=True)
class Job:
    """One cell of the sweep matrix. `job_id` is derived, never set by hand."""

    sweep: str
    hardware: str
    device: DeviceKind
    model: ModelSpec
    batch_size: int
    dtype: str
    config: CompileConfig
    measure: MeasureSpec
    timeout_s: float
    stack: dict[str, str] = field(default_factory=dict)
    baseline: Baseline | None = None
    """Time this config against another compiled config in the same processes (see Baseline)."""
    serving: dict[str, Any] | None = None
    """The traffic the model's presets are to serve (`compiler.serving.traffic.ServingProfile` as a
    dict, from the sweep file's `serving:`): a label the row records, not part of the job's
    identity (the job measures its one batch size either way)."""

    @property
    def name(self) -> str:
        name = f"{self.hardware}/{self.model.name}/bs{self.batch_size}/{self.dtype}/{self.config.name}"
        return f"{name}/vs/{self.baseline.config.name}" if self.baseline else name

    @cached_property
    def job_id(self) -> str:
        """Computed once per instance (the driver asks for it several times per job)."""
        return job_id(self)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Job:
        data = dict(data)
        data["model"] = ModelSpec(**data["model"])
        data["config"] = CompileConfig.from_dict(data["config"])
        data["measure"] = MeasureSpec(**data["measure"])
        if data.get("baseline") is not None:
            data["baseline"] = Baseline.from_dict(data["baseline"])
        return cls(**data)


def _config_identity(cfg: CompileConfig) -> dict[str, Any]:
    config = asdict(cfg)
    config.pop("timeout_s")
    for knob in ("freezing", "channels_last", "runtime"):  # as before the fields existed: old outputs resume
        if not config[knob]:
            del config[knob]
    return config


def _identity(job: Job) -> dict[str, Any]:
    """What a job's result depends on. Names and timeouts are labels and policy, not identity,
    except the config name, which keeps two configs with equal settings apart."""
    model = asdict(job.model)
    model.pop("name")
    model.pop("timeout_s")
    if model["weights"] == "random":  # as before the field existed: old outputs resume
        del model["weights"]
    config = _config_identity(job.config)
    measure = asdict(job.measure)
    if measure["repeats"] == 1:  # as before repeats existed: outputs written then still resume
        del measure["repeats"]
    identity = {
        "hardware": job.hardware,
        "device": job.device,
        "model": model,
        "batch_size": job.batch_size,
        "dtype": precision_identity(job.dtype),
        "config": config,
        "measure": measure,
        "stack": job.stack,
    }
    if job.baseline is not None:
        identity["baseline"] = {
            "config": _config_identity(job.baseline.config),
            "dtype": precision_identity(job.baseline.dtype),
        }
    return identity


def job_id(job: Job) -> str:
    canonical = json.dumps(_identity(job), sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()[:20]


def _version(dist: str) -> str:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "absent"


@lru_cache(maxsize=1)
def software_stack() -> dict[str, str]:
    """Versions that change what a job measures; part of every job id."""
    return {
        "python": ".".join(platform.python_version_tuple()[:2]),
        "torch": _version("torch"),
        "triton": _version("triton"),
        "transformers": _version("transformers"),
    }
