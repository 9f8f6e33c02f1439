"""The columns of the `presets` table (`store.schema.PRESETS_SCHEMA`): one row per
hardware class, model, batch size, precision and accuracy budget, with its type and description."""

from __future__ import annotations

import pyarrow as pa

PRESET_FIELDS: list[tuple[str, pa.DataType, str]] = [
    ("hardware", pa.string(), "hardware class the preset is for"),
    ("model", pa.string(), "model name in the sweep"),
    ("model_id", pa.string(), "model id (hf:..., python:...)"),
    ("model_spec", pa.string(), "the sweep's model entry as JSON (overrides, input size), for export"),
    ("batch_size", pa.int32(), "batch size"),
    ("dtype", pa.string(), "the cell's precision policy: the model's own, what a caller asks for"),
    (
        "precision",
        pa.string(),
        "the precision policy the preset applies (differs from dtype only where tune was allowed it)",
    ),
    ("config", pa.string(), "name of the chosen config; `eager` for an eager preset (do not compile)"),
    (
        "compile",
        pa.string(),
        "its torch.compile settings as JSON (backend, mode, options, freezing, ...); null for an eager preset",
    ),
    (
        "runtime",
        pa.string(),
        "an eager preset's runtime settings as JSON (those eager was timed under); null otherwise (a "
        "compiled preset's are in `compile`)",
    ),
    (
        "source",
        pa.string(),
        "swept (fastest config of a sweep), tuned (a tuner candidate that beat the best stock mode), "
        "stock (the tuner kept the best stock mode) or eager (eager beat the compiled config chosen)",
    ),
    ("decision", pa.string(), "why this config, in words (with the interval a tuned one won by)"),
    ("compiled_ms", pa.float64(), "its median latency, ms (null for an eager preset: see eager_ms)"),
    ("eager_ms", pa.float64(), "eager median latency in the same processes, ms (an eager preset's latency)"),
    ("speedup_vs_eager", pa.float64(), "eager_ms / compiled_ms"),
    ("default_config", pa.string(), "the plain torch.compile config of the sweep, if it was swept"),
    (
        "speedup_vs_default",
        pa.float64(),
        "the default config's ms / compiled_ms (an eager preset: / eager_ms, medians of two rows)",
    ),
    ("stock_config", pa.string(), "tune: the best stock mode of the cell"),
    ("stock_ms", pa.float64(), "tune: its median latency, ms (in the confirmation's processes if one ran)"),
    ("speedup_vs_stock", pa.float64(), "stock_ms / compiled_ms (an eager preset: stock_ms / eager_ms)"),
    (
        "speedup_vs_stock_ci_low",
        pa.float64(),
        "95% CI of speedup_vs_stock, low end (paired in the same processes; a tuned preset has it above 1)",
    ),
    ("speedup_vs_stock_ci_high", pa.float64(), "95% CI of speedup_vs_stock, high end"),
    (
        "speedup_vs_stock_from",
        pa.string(),
        "tune: which rows and processes speedup_vs_stock comes from, and whether it is paired",
    ),
    ("eager_over_config", pa.string(), "an eager preset: the compiled config it replaced"),
    ("eager_over_compile", pa.string(), "an eager preset: that config's torch.compile settings as JSON"),
    (
        "eager_over_ms",
        pa.float64(),
        "an eager preset: that config's median latency in the same processes, ms",
    ),
    (
        "eager_gain",
        pa.float64(),
        "an eager preset: eager_over_ms / eager_ms, paired in the same processes (above 1: eager faster)",
    ),
    ("eager_gain_ci_low", pa.float64(), "95% CI of eager_gain, low end (above 1 for an eager preset)"),
    ("eager_gain_ci_high", pa.float64(), "95% CI of eager_gain, high end"),
    ("eager_gain_processes", pa.int32(), "processes the eager_gain interval is over"),
    ("compile_s", pa.float64(), "its cold compile time, s (null for an eager preset)"),
    ("peak_mem_bytes", pa.int64(), "peak memory of its compiled phase (an eager preset: of the eager phase)"),
    (
        "serving_peak_mem_bytes",
        pa.int64(),
        "peak memory of its job's process: the larger of its eager phase's (where a runtime setting's first-call "
        "search runs, cuDNN's taking the memory that is free) and its compiled phase's; what compile_tuned's "
        "process, which runs the example once against eager, holds at its peak",
    ),
    (
        "budget",
        pa.string(),
        "the accuracy budget the preset was chosen under (compiler.accuracy): stock, a level (tf32, fp16, "
        "bf16) or a number (max relative error against fp64); null for a sweep's presets without one",
    ),
    ("accuracy_rule", pa.string(), "the rule that judged the candidates' precision, in words"),
    (
        "accuracy_decision",
        pa.string(),
        "determined (precision chosen within the budget) or undetermined (the cell's outputs cannot judge "
        "precision: it keeps its own)",
    ),
    ("accuracy_why", pa.string(), "why the precision decision is what it is"),
    ("weights", pa.string(), "the weights that judged it: random, pretrained or a checkpoint directory"),
    (
        "serving_profile",
        pa.string(),
        "the traffic the preset is to serve, from its row (the sweep file's serving:, JSON); the export gives "
        "such a preset a serving plan for it",
    ),
    ("max_rel_err", pa.float64(), "the preset's max relative error against fp64 (its row's)"),
    ("stock_max_rel_err", pa.float64(), "the stock policy's eager error against fp64 on the cell"),
    (
        "stock_eager_ms",
        pa.float64(),
        "a stock PyTorch user's eager latency: the model's dtype, torch's defaults, ms",
    ),
    (
        "stock_compile_config",
        pa.string(),
        "a stock user's torch.compile: the faster stock mode (default or reduce-overhead) under torch's defaults",
    ),
    ("stock_compile_ms", pa.float64(), "its latency, ms (in processes of its own)"),
    ("vs_stock_eager", pa.float64(), "stock_eager_ms / the preset's latency: the gain a stock user sees"),
    ("vs_stock_eager_ci_low", pa.float64(), "95% CI of vs_stock_eager, low end"),
    ("vs_stock_eager_ci_high", pa.float64(), "95% CI of vs_stock_eager, high end"),
    ("vs_stock_compile", pa.float64(), "stock_compile_ms / the preset's latency: the deployed gain"),
    ("vs_stock_compile_ci_low", pa.float64(), "95% CI of vs_stock_compile, low end"),
    ("vs_stock_compile_ci_high", pa.float64(), "95% CI of vs_stock_compile, high end"),
    ("vs_stock_from", pa.string(), "which jobs and processes the vs_stock_* figures come from"),
    ("candidates", pa.int32(), "configs that were eligible on the cell"),
    ("over_budget", pa.int32(), "configs that were ok but over a budget, and excluded"),
    ("job_id", pa.string(), "the job whose row the figures come from"),
    ("device_name", pa.string(), "device the preset was measured on"),
    ("torch_version", pa.string(), "torch version of the measurement"),
    ("triton_version", pa.string(), "Triton version"),
    ("cuda_version", pa.string(), "CUDA version torch was built with"),
    ("driver_version", pa.string(), "NVIDIA driver version"),
    ("python_version", pa.string(), "Python version"),
]
