"""What a hardware class can run: compute capability, SMs, memory, precisions, and whether Inductor's
max-autotune GEMM templates apply there; and the rules that say which (precision, compile config)
cells a class cannot run, with the reason.

Two sources, one shape (`Capabilities`):

- `known(name)`: the versioned table of known classes (`compiler.known_gpus`), for planning
  without the device;
- `from_device()`: the CUDA device this process sees (`torch.cuda.get_device_properties`), which
  a job checks before it compiles, so a class the table lacks is judged too.

`cell_support` returns a hard reason (the cell is `unsupported`: it would fail, or measure
nothing) or notes (it runs, with less than it asks for):

- bf16 below sm80: unsupported. Eager emulates it, but Inductor skips any graph with bf16 inputs
  or outputs on such a GPU (`torch._inductor.compile_fx._check_triton_bf16_support` raises
  SkipFrame: "does not support bfloat16 compilation natively"), so "compiled" would be eager.
- fp8 below sm89: unsupported (no fp8 tensor cores; Triton refuses the fp8e4nv type).
- Inductor on a GPU below sm70: unsupported (Triton's minimum, `torch._inductor.exc`).
- max-autotune on a GPU with fewer SMs than `torch._inductor.utils.is_big_gpu` wants: a note
  (Inductor leaves out its Triton GEMM and conv templates and autotunes ATen's kernels only), and
  unsupported where the config's GEMM or conv backends leave ATen out (`max_autotune_gemm_backends:
  TRITON`): no kernel is left to choose and Inductor raises NoValidChoicesError.
- TF32 below sm80: a note (no TF32 tensor cores: it runs as fp32).
- CUDA graphs on CPU: a note (reduce-overhead runs without them).

This module imports neither Ray nor `orchestrator` (a serving process imports `compiler/`), and
torch only inside `from_device`.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from compiler.hardware import CPU_CLASS
from compiler.known_gpus import GPUS, TABLE_VERSION

MIN_SMS_GEMM_TEMPLATES = 68
"""`torch._inductor.utils.is_big_gpu` (torch 2.13): a CUDA GPU with fewer SMs ("3080") gets no
Triton GEMM or conv templates under max-autotune."""
MIN_TRITON_CC = (7, 0)
"""Triton's minimum compute capability (`torch._inductor.exc.GPUTooOldForTriton`)."""
MIN_BF16_CC = (8, 0)
MIN_TF32_CC = (8, 0)
MIN_FP8_CC = (8, 9)

DEFAULT_GEMM_BACKENDS = "ATEN,TRITON,CPP"
DEFAULT_CONV_BACKENDS = "ATEN,TRITON"
AUTOTUNE_MODES = ("max-autotune", "max-autotune-no-cudagraphs")
CUDAGRAPH_MODES = ("reduce-overhead", "max-autotune")


@dataclass(frozen=True)
class Capabilities:
    name: str
    """The hardware class (A100, T4, cpu, ...)."""
    device: str
    """cuda or cpu."""
    compute_capability: tuple[int, int] | None = None
    sm_count: int | None = None
    memory_gb: float | None = None
    bf16: bool = True
    """Native bf16 (tensor cores and Triton codegen), not emulation."""
    fp16: bool = True
    fp8: bool = False
    tf32: bool = False
    cuda_graphs: bool = False
    gemm_templates: bool | None = None
    """Inductor's Triton GEMM/conv templates apply under max-autotune (`is_big_gpu`); None on CPU."""
    arch_in_build: bool | None = None
    """This torch build has kernels for the device's architecture (from the device only)."""
    source: str = ""
    """`table v<N>` or `device`."""

    @property
    def sm(self) -> str:
        """`sm80`, or the device kind where there is no compute capability."""
        cc = self.compute_capability
        return f"sm{cc[0]}{cc[1]}" if cc else self.device

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _gpu(
    name: str, cc: tuple[int, int], sms: int, memory_gb: float, source: str, **extra: Any
) -> Capabilities:
    return Capabilities(
        name=name,
        device="cuda",
        compute_capability=cc,
        sm_count=sms,
        memory_gb=memory_gb,
        bf16=cc >= MIN_BF16_CC,
        fp16=True,
        fp8=cc >= MIN_FP8_CC,
        tf32=cc >= MIN_TF32_CC,
        cuda_graphs=True,
        gemm_templates=sms >= MIN_SMS_GEMM_TEMPLATES,
        source=source,
        **extra,
    )


CPU = Capabilities(name=CPU_CLASS, device="cpu", source=f"table v{TABLE_VERSION}")


def known(name: str) -> Capabilities | None:
    """The table's capabilities of class `name`, or None for a class it does not know."""
    if name == CPU_CLASS:
        return CPU
    row = GPUS.get(name)
    return _gpu(name, *row, source=f"table v{TABLE_VERSION}") if row else None


def _arch_in_build(cc: tuple[int, int], arch_list: list[str]) -> bool | None:
    """Whether a build compiled for `arch_list` (torch.cuda.get_arch_list()) runs on `cc`: a cubin
    for the same major and a lower or equal minor, or PTX for a lower or equal capability."""
    if not arch_list:
        return None
    have = cc[0] * 10 + cc[1]
    for arch in arch_list:
        kind, _, num = arch.partition("_")
        digits = "".join(ch for ch in num if ch.isdigit())
        if not digits:
            continue
        value = int(digits)
        if kind == "sm" and value // 10 == cc[0] and value <= have:
            return True
        if kind == "compute" and value <= have:
            return True
    return False


def from_device(index: int = 0) -> Capabilities:
    """The capabilities of CUDA device `index` as this process sees it, or the CPU's without one."""
    import torch

    from compiler.hardware import accelerator_type

    if not torch.cuda.is_available():
        return Capabilities(name=CPU_CLASS, device="cpu", source="device")
    props = torch.cuda.get_device_properties(index)
    cc = (props.major, props.minor)
    return _gpu(
        accelerator_type(props.name) or "GPU",
        cc,
        props.multi_processor_count,
        round(props.total_memory / 1e9, 1),
        "device",
        arch_in_build=_arch_in_build(cc, torch.cuda.get_arch_list()),
    )


def _backends(options: dict[str, Any], key: str, default: str) -> set[str]:
    return {b.strip().upper() for b in str(options.get(key, default)).split(",") if b.strip()}


def cell_support(caps: Capabilities, dtype: str, config: Any) -> tuple[str | None, list[str]]:
    """(reason the class cannot run this cell, or None; notes on what it runs without).

    `config` is a `CompileConfig` (or anything with `mode`, `options` and `backend`); `dtype` a
    precision policy (fp32, tf32, bf16, fp16, or an fp8 one)."""
    mode = getattr(config, "mode", None)
    options = dict(getattr(config, "options", None) or {})
    inductor = getattr(config, "backend", "inductor") == "inductor"
    cudagraphs = mode in CUDAGRAPH_MODES or bool(options.get("triton.cudagraphs"))
    notes: list[str] = []
    if caps.device != "cuda":
        if cudagraphs:
            notes.append(f"{caps.name} has no CUDA graphs: {config_name(config)} runs without them")
        return None, notes
    who = f"{caps.name} ({caps.sm})"
    cc = caps.compute_capability or (0, 0)
    if caps.arch_in_build is False:
        return f"{who}: this torch build has no kernels for {caps.sm} (torch.cuda.get_arch_list())", notes
    if inductor and cc < MIN_TRITON_CC:
        return f"{who}: Inductor's Triton needs compute capability 7.0+", notes
    if dtype == "bf16" and not caps.bf16:
        why = (
            "Inductor skips bf16 graphs there, so compiled would run eager bf16, which is emulated"
            if inductor
            else "bf16 is emulated there"
        )
        return f"{who} has no native bf16 (needs sm80+): {why}", notes
    if dtype == "fp16" and not caps.fp16:
        return f"{who} has no fp16", notes
    if dtype.startswith("fp8") and not caps.fp8:
        return f"{who}: fp8 needs sm89+", notes
    if dtype == "tf32" and not caps.tf32:
        notes.append(f"{who} has no TF32 tensor cores (sm80+): tf32 runs as fp32")
    autotune = inductor and (
        mode in AUTOTUNE_MODES or bool(options.get("max_autotune")) or bool(options.get("max_autotune_gemm"))
    )
    if autotune and caps.gemm_templates is False:
        small = (
            f"{caps.name} has {caps.sm_count} SMs: Inductor skips max-autotune GEMM templates "
            f"(is_big_gpu needs >= {MIN_SMS_GEMM_TEMPLATES})"
        )
        for key, default in (
            ("max_autotune_gemm_backends", DEFAULT_GEMM_BACKENDS),
            ("max_autotune_conv_backends", DEFAULT_CONV_BACKENDS),
        ):
            if "ATEN" not in _backends(options, key, default):
                return f"{small}, and {key}={options[key]} leaves no kernel to choose", notes
        notes.append(f"{small}: max-autotune chooses among ATen kernels (cuBLAS, cuDNN) only")
    if cudagraphs and not caps.cuda_graphs:
        notes.append(f"{who} has no CUDA graphs: {config_name(config)} runs without them")
    return None, notes


def config_name(config: Any) -> str:
    return getattr(config, "name", None) or getattr(config, "mode", None) or "the config"


def check_preset_supported(capabilities: Capabilities, preset: dict[str, Any]) -> str | None:
    """Why a preset (an entry of `presets.json`: `precision` or `dtype`, and `compile`, a
    `CompileConfig` as a dict without its name) cannot run on a device with `capabilities`, or
    None if it can. For `compile_tuned` and export to refuse a preset with the reason. An eager
    preset (`compile` null) compiles nothing: only its precision is judged (bf16 where it is
    emulated, fp8 without fp8 cores, a torch build without kernels for the device)."""
    from types import SimpleNamespace

    from compiler.config import is_eager_preset

    compile_ = dict(preset.get("compile") or {})
    config = SimpleNamespace(
        name=preset.get("config"),
        mode=compile_.get("mode"),
        options=compile_.get("options") or {},
        backend=None if is_eager_preset(preset) else compile_.get("backend") or "inductor",
    )
    reason, _ = cell_support(capabilities, preset.get("precision") or preset.get("dtype") or "fp32", config)
    return reason
