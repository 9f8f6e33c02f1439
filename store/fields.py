"""The data dictionary of a sweep output: every column of every table, with its Arrow type and
its description (`store.schema` builds the tables' schemas from these lists; a column
added here is a new `SCHEMA_VERSION` there)."""

from __future__ import annotations

from typing import Literal, get_args

import pyarrow as pa

Status = Literal[
    "ok",
    "compile_error",
    "runtime_error",
    "accuracy_fail",
    "oom",
    "timeout",
    "crash",
    "hardware_lost",
    "unsupported",
    "harness_error",
]
STATUSES: tuple[str, ...] = get_args(Status)
HARNESS_ERROR = "harness_error"
"""A failure of the orchestrator's own environment, not of the model: the job's scratch directory
could not be made, its Ray task raised, its worker or node was lost on every attempt. Not a
result: `--resume` runs the job again."""

# (name, type, description). Descriptions are the data dictionary shown by the docs and tests.
RESULT_FIELDS: list[tuple[str, pa.DataType, str]] = [
    ("job_id", pa.string(), "stable content hash of the job and the software stack"),
    ("run_id", pa.string(), "the `orchestrate sweep` invocation that produced the row"),
    ("hardware", pa.string(), "hardware class the job was pinned to (e.g. A100, H100, cpu)"),
    ("device_name", pa.string(), "device the job ran on as the framework names it"),
    ("node_id", pa.string(), "Ray node id that ran the job"),
    ("hostname", pa.string(), "host that ran the job"),
    ("host_cpus", pa.int32(), "cores of the host that ran the job (os.cpu_count)"),
    ("host_mem_bytes", pa.int64(), "memory of the host that ran the job, bytes"),
    ("host_gpus", pa.int32(), "GPUs the job's node offers Ray"),
    ("sweep", pa.string(), "sweep name"),
    ("job_name", pa.string(), "human-readable job name hardware/model/bs/dtype/config"),
    ("model", pa.string(), "model name in the sweep"),
    ("model_id", pa.string(), "model id (hf:..., python:...)"),
    ("task", pa.string(), "model task"),
    ("batch_size", pa.int32(), "batch size"),
    (
        "dtype",
        pa.string(),
        "precision policy (compiler.precision): fp32 (torch's float32 defaults), fp32-strict, tf32, bf16, fp16",
    ),
    ("config", pa.string(), "compile config name from the sweep"),
    ("mode", pa.string(), "torch.compile mode, null for none"),
    ("backend", pa.string(), "torch.compile backend"),
    ("fullgraph", pa.bool_(), "torch.compile fullgraph"),
    ("dynamic", pa.bool_(), "torch.compile dynamic (null: automatic)"),
    ("options", pa.string(), "Inductor options as JSON text"),
    ("freezing", pa.bool_(), "torch._inductor.config.freezing (weights folded as constants)"),
    ("channels_last", pa.bool_(), "the model's weights converted to channels-last layout before compiling"),
    (
        "runtime",
        pa.string(),
        "process-wide runtime settings eager and compiled ran under, as JSON: every setting of "
        "compiler.runtime, torch's default where the config names none",
    ),
    ("cudnn_benchmark", pa.bool_(), "torch.backends.cudnn.benchmark during the job (a runtime setting)"),
    (
        "cudnn_allow_tf32",
        pa.bool_(),
        "torch.backends.cudnn.allow_tf32 during the job: float32 convolutions may use TF32 (the policy's)",
    ),
    (
        "matmul_precision",
        pa.string(),
        "torch.get_float32_matmul_precision() during the job: highest (float32) or high (TF32)",
    ),
    (
        "weights",
        pa.string(),
        "the model's weights: random (seeded, the architecture only), pretrained (the local Hugging Face "
        "cache) or the checkpoint directory they came from",
    ),
    (
        "serving_profile",
        pa.string(),
        "the traffic the model's presets are to serve, from the sweep file's serving: (JSON: batch min and "
        "max, a weight per size); null where the sweep gives none",
    ),
    (
        "baseline_config",
        pa.string(),
        "a config compiled and timed in the same processes as this one (orchestrate tune's confirmation); "
        "null for an ordinary job",
    ),
    ("baseline_dtype", pa.string(), "the baseline's precision policy"),
    ("status", pa.string(), "one of " + ", ".join(STATUSES)),
    ("error", pa.string(), "what went wrong (null when status is ok)"),
    ("eager_ms", pa.float64(), "eager median latency per call, ms"),
    ("eager_p10_ms", pa.float64(), "eager 10th percentile, ms"),
    ("eager_p90_ms", pa.float64(), "eager 90th percentile, ms"),
    ("compiled_ms", pa.float64(), "compiled median latency per call, ms"),
    ("compiled_p10_ms", pa.float64(), "compiled 10th percentile, ms"),
    ("compiled_p90_ms", pa.float64(), "compiled 90th percentile, ms"),
    ("speedup", pa.float64(), "eager_ms / compiled_ms"),
    ("speedup_ci_low", pa.float64(), "95% CI of the speedup, low end (hierarchical bootstrap, see ci_scope)"),
    ("speedup_ci_high", pa.float64(), "95% CI of the speedup, high end"),
    (
        "ci_scope",
        pa.string(),
        "what the intervals cover: 'processes' (repeats > 1, the spread between processes is in them) "
        "or 'one process' (the calls of a single process only: tighter than a rerun would agree with)",
    ),
    (
        "speedup_ci_between_share",
        pa.float64(),
        "share of the speedup interval's variance that comes from differences between processes",
    ),
    ("eager_ci_low", pa.float64(), "95% CI of eager_ms, low end"),
    ("eager_ci_high", pa.float64(), "95% CI of eager_ms, high end"),
    ("compiled_ci_low", pa.float64(), "95% CI of compiled_ms, low end"),
    ("compiled_ci_high", pa.float64(), "95% CI of compiled_ms, high end"),
    ("repeats", pa.int32(), "processes whose timed samples are in the row (measure.repeats)"),
    (
        "samples_per_repeat",
        pa.list_(pa.int32()),
        "how many samples each process contributed to the sample columns, in process order",
    ),
    ("eager_repeat_ms", pa.list_(pa.float64()), "eager median of each process, ms"),
    ("compiled_repeat_ms", pa.list_(pa.float64()), "compiled median of each process, ms"),
    ("eager_b2b_ms", pa.float64(), "eager ms per call over a back-to-back block with one sync (throughput)"),
    ("compiled_b2b_ms", pa.float64(), "compiled ms per call over a back-to-back block with one sync"),
    (
        "eager_device_ms",
        pa.float64(),
        "GPU rows: median time the device spent in an eager call's kernels, copies and sets, ms (from the "
        "profiler's kernel records of 20 calls per process after the timed rounds; the idle gaps between "
        "launches are not in it)",
    ),
    ("compiled_device_ms", pa.float64(), "GPU rows: the same for a compiled call, ms"),
    (
        "eager_device_ci_low",
        pa.float64(),
        "95% CI of eager_device_ms, low end (over processes, as eager_ci_*)",
    ),
    ("eager_device_ci_high", pa.float64(), "95% CI of eager_device_ms, high end"),
    ("compiled_device_ci_low", pa.float64(), "95% CI of compiled_device_ms, low end"),
    ("compiled_device_ci_high", pa.float64(), "95% CI of compiled_device_ms, high end"),
    (
        "eager_host_bound_share",
        pa.float64(),
        "GPU rows: share of the eager wall latency the device sat idle, 1 - eager_device_ms / eager_ms "
        "(high: launch-bound, the wall time moves with the host's speed)",
    ),
    (
        "compiled_host_bound_share",
        pa.float64(),
        "GPU rows: the same for compiled, 1 - compiled_device_ms / compiled_ms",
    ),
    (
        "eager_device_samples_ms",
        pa.list_(pa.float64()),
        "every profiled eager call's device time, ms, process after process (see device_samples_per_repeat)",
    ),
    ("compiled_device_samples_ms", pa.list_(pa.float64()), "every profiled compiled call's device time, ms"),
    (
        "device_samples_per_repeat",
        pa.list_(pa.int32()),
        "how many device-time samples each process contributed, in process order",
    ),
    (
        "eager_samples_ms",
        pa.list_(pa.float64()),
        "every timed eager call, ms, in order, process after process (see samples_per_repeat)",
    ),
    ("compiled_samples_ms", pa.list_(pa.float64()), "every timed compiled call, ms, as eager_samples_ms"),
    (
        "baseline_ms",
        pa.float64(),
        "the baseline config's median latency, ms (interleaved with this config's)",
    ),
    ("baseline_samples_ms", pa.list_(pa.float64()), "every timed baseline call, ms, as eager_samples_ms"),
    ("baseline_repeat_ms", pa.list_(pa.float64()), "baseline median of each process, ms"),
    (
        "baseline_compile_s",
        pa.float64(),
        "wall time of the baseline's first compiled call in the first process, s",
    ),
    ("speedup_vs_baseline", pa.float64(), "baseline_ms / compiled_ms"),
    (
        "speedup_vs_baseline_ci_low",
        pa.float64(),
        "95% CI of speedup_vs_baseline, low end (paired by process, hierarchical bootstrap)",
    ),
    ("speedup_vs_baseline_ci_high", pa.float64(), "95% CI of speedup_vs_baseline, high end"),
    ("eager_warmup_calls", pa.int32(), "eager warm-up calls until latency was stable"),
    ("compiled_warmup_calls", pa.int32(), "compiled warm-up calls until latency was stable"),
    (
        "compile_s",
        pa.float64(),
        "wall time of the first compiled call (compile + one run), s: a cold compile unless compile_from_cache",
    ),
    (
        "warm_compile_s",
        pa.float64(),
        "same, in a fresh process against the cache the cold compile filled (median over repeats), s",
    ),
    (
        "repeat_compile_s",
        pa.list_(pa.float64()),
        "compile_s of each process: the first cold, the others warm",
    ),
    ("warm_cache_hits", pa.int32(), "Inductor FX-graph cache hits in the warm compile"),
    (
        "warm_cache_misses",
        pa.int32(),
        "FX-graph cache misses and bypasses in the warm compile (compiled again)",
    ),
    (
        "compile_cache",
        pa.string(),
        "the shared compile cache (Redis) in the first process: off (not read: a cold compile, a sweep's "
        "default), shared (read and written, in the namespace of the job's hardware class and software "
        "stack), unavailable (asked for but not usable, see notes; compiled without it)",
    ),
    (
        "compile_from_cache",
        pa.bool_(),
        "the first compile got FX graphs or autotune results from the shared cache, so compile_s is not a "
        "cold compile",
    ),
    ("cache_namespace", pa.string(), "prefix of the shared cache's keys: co:<class>:<stack hash>:"),
    (
        "cache_rejected",
        pa.int32(),
        "shared-cache entries the job did not use (notes say why): without the fleet's seal or with one that "
        "does not verify (each compiled as a miss), or served to a process that failed and then succeeded "
        "without the cache (its row is that run's: compile_cache off); null where the job had no shared cache",
    ),
    (
        "fx_cache_hits",
        pa.int32(),
        "Inductor FX-graph cache hits in the first compile (its process starts with an empty local cache: "
        "with compile_cache=shared each hit came from the shared cache)",
    ),
    ("fx_cache_misses", pa.int32(), "FX-graph cache misses and bypasses in the first compile (compiled)"),
    (
        "autotune_cache_hits",
        pa.int32(),
        "Triton kernel autotune results the first compile found in the shared cache (RemoteAutotuneCache; "
        "GPU only); null when compile_cache is not shared",
    ),
    ("autotune_cache_misses", pa.int32(), "Triton autotune lookups the shared cache could not answer"),
    (
        "gemm_cache_hits",
        pa.int32(),
        "GEMM/conv autotune lookups (max-autotune's select_algorithm) the shared cache answered, so those "
        "candidates were not benchmarked; null where the bridge did not run",
    ),
    ("gemm_cache_misses", pa.int32(), "GEMM/conv autotune lookups that benchmarked the candidates"),
    (
        "gemm_cache_shared",
        pa.int32(),
        "GEMM/conv autotune timings the first process pushed to the shared cache (each as soon as measured)",
    ),
    (
        "dynamo_s",
        pa.float64(),
        "Dynamo's cumulative compile time, s (as torch records it: usually with the backend's, not always)",
    ),
    ("inductor_s", pa.float64(), "Inductor's cumulative compile time, s"),
    ("autotune_s", pa.float64(), "autotuning time (compile-time choices + first-run Triton configs), s"),
    (
        "autotuned_ops",
        pa.int32(),
        "ops (GEMMs, convolutions) the cold compile autotuned, their candidates in kernel_choices; for a "
        "compile that did not finish (timeout, crash, error), the ops it had finished timing, whose rows are "
        "kept marked `partial`; null where nothing was autotuned",
    ),
    ("triton_compile_s", pa.float64(), "Triton kernel compile time, s"),
    (
        "eager_peak_mem_bytes",
        pa.int64(),
        "peak memory of the eager phase (CUDA allocator, or process RSS on CPU)",
    ),
    (
        "peak_mem_bytes",
        pa.int64(),
        "peak memory of the compiled phase (CUDA allocator, or process RSS on CPU)",
    ),
    ("graph_count", pa.int32(), "FX graphs Dynamo captured"),
    ("memory_compression", pa.float64(), "eager_peak_mem_bytes / peak_mem_bytes (the PyTorch dashboard's)"),
    ("graph_breaks", pa.int32(), "graph breaks Dynamo recorded"),
    ("break_reasons", pa.list_(pa.string()), "distinct graph-break reasons (first line of each)"),
    ("recompiles", pa.int32(), "recompilations during the compiling call"),
    ("recompile_reasons", pa.list_(pa.string()), "why each recompile happened"),
    ("guard_count", pa.int32(), "guards over all compiled frames"),
    ("kernel_count", pa.int32(), "kernels Inductor generated"),
    (
        "cudagraph_skip_reasons",
        pa.list_(pa.string()),
        "why CUDA graphs were not used, if they were asked for",
    ),
    ("flops", pa.int64(), "FLOPs of one call (torch.utils.flop_counter)"),
    ("eager_tflops", pa.float64(), "flops / eager_ms, TFLOP/s"),
    ("compiled_tflops", pa.float64(), "flops / compiled_ms, TFLOP/s"),
    ("max_abs_err", pa.float64(), "max |compiled - eager| over all output tensors"),
    ("max_rel_err", pa.float64(), "max_abs_err / max |eager|"),
    ("rmse_eager", pa.float64(), "RMSE of eager against the fp64 reference (worst output)"),
    ("rmse_compiled", pa.float64(), "RMSE of compiled against the fp64 reference (worst output)"),
    (
        "fp64_max_rel_err",
        pa.float64(),
        "max |compiled - fp64| / max |fp64| over the output tensors (worst process): the error a preset's "
        "accuracy budget judges (compiler.accuracy)",
    ),
    ("eager_fp64_max_rel_err", pa.float64(), "the same for eager in the job's precision (worst process)"),
    (
        "output_spread",
        pa.float64(),
        "how much the fp64 outputs vary: the smallest over float outputs of (max - min) / max |x|; near 0, "
        "an output too constant to show a precision's error",
    ),
    (
        "output_sensitivity",
        pa.list_(pa.float64()),
        "how much a relative change of the float inputs grows in the outputs, in fp64: relative output "
        "change / relative input change, for input changes of 1e-6, 2^-11 (TF32, fp16 rounding) and 2^-8 "
        "(bf16 rounding) (null: no float input). Near 0: the outputs barely depend on the inputs; large at "
        "a precision's step: an ill-conditioned output whose error with random weights says little about a "
        "real model's",
    ),
    ("notes", pa.string(), "non-fatal remarks (a figure that could not be taken, and why)"),
    ("torch_version", pa.string(), "torch version in the job process"),
    ("triton_version", pa.string(), "Triton version in the job process"),
    ("cuda_version", pa.string(), "CUDA version torch was built with"),
    ("driver_version", pa.string(), "NVIDIA driver version"),
    ("gpu_index", pa.int32(), "which GPU of its host the job ran on, as NVML numbers them"),
    ("gpu_uuid", pa.string(), "the UUID of the GPU the job ran on (NVML)"),
    ("gpu_pci_bus_id", pa.string(), "the PCI bus id of the GPU the job ran on (NVML), e.g. 00000000:1B:00.0"),
    ("gpu_numa_node", pa.int32(), "the host NUMA node of that GPU (sysfs; null where the host shows none)"),
    ("sm_clock_mhz", pa.int32(), "SM clock at the start of the job, before any work (an idle clock), MHz"),
    ("clock_samples", pa.int32(), "NVML samples taken during the timed rounds (every 20 ms)"),
    ("sm_clock_mean_mhz", pa.float64(), "mean SM clock during the timed rounds, MHz"),
    ("sm_clock_min_mhz", pa.int32(), "lowest SM clock during the timed rounds, MHz"),
    ("sm_clock_max_mhz", pa.int32(), "highest SM clock during the timed rounds, MHz"),
    ("mem_clock_mean_mhz", pa.float64(), "mean memory clock during the timed rounds, MHz"),
    ("power_mean_w", pa.float64(), "mean board power during the timed rounds, W"),
    ("power_max_w", pa.float64(), "highest board power during the timed rounds, W"),
    ("gpu_temp_max_c", pa.int32(), "highest GPU temperature during the timed rounds, C"),
    (
        "throttle_reasons",
        pa.list_(pa.string()),
        "NVML clock-event reasons seen during the timed rounds (gpu_idle, sw_power_cap, hw_slowdown, ...)",
    ),
    (
        "timing_cpus",
        pa.string(),
        "cores the timing thread ran on during the timed rounds (sampled with the clocks), e.g. 3 or 3,9",
    ),
    ("timing_numa_nodes", pa.string(), "the host NUMA nodes of timing_cpus (sysfs), e.g. 0 or 0-1"),
    (
        "host_probe_us",
        pa.list_(pa.float64()),
        "host dispatch speed after each timed round (one tiny CPU tensor op, us), process after process",
    ),
    (
        "host_steal_share",
        pa.float64(),
        "share of the host's CPU time a hypervisor gave to other tenants during the timed rounds",
    ),
    (
        "host_cpu_mhz",
        pa.list_(pa.float64()),
        "per process: mean current frequency of the job's cores during the timed rounds, MHz (cpufreq or "
        "/proc/cpuinfo; null where the host does not say)",
    ),
    (
        "host_load_1m",
        pa.list_(pa.float64()),
        "per process: the host's 1-minute load average when its timing began",
    ),
    (
        "host_other_share",
        pa.list_(pa.float64()),
        "per process: share of the job's cores' time that other processes took during its timed rounds "
        "(their busy time less the job process's own CPU time; about 0.5 where a busy loop shares each core)",
    ),
    (
        "timing_gc_collections",
        pa.list_(pa.int32()),
        "per process: Python garbage collections (all generations) during the timed rounds",
    ),
    ("clocks_locked", pa.bool_(), "SM clock locked for the job (--lock-clocks); null when not asked"),
    ("cpu_affinity", pa.string(), "cores the job's processes ran on, e.g. 0-7"),
    ("cpu_pinned", pa.bool_(), "the processes were pinned to cores reserved for the job"),
    ("python_version", pa.string(), "Python version in the job process"),
    ("started_at", pa.timestamp("us", tz="UTC"), "when the job's subprocess started"),
    (
        "wall_s",
        pa.float64(),
        "driver-side time from dispatch to result, less lane_wait_s (the wait for a GPU behind another job), s",
    ),
    ("subprocess_s", pa.float64(), "lifetime of the job's subprocesses, summed, s"),
    ("job_processes", pa.int32(), "fresh processes the job ran (repeats, plus a separate warm compile)"),
    ("phase_start_s", pa.float64(), "phase times, s, summed over the job's processes: interpreter start"),
    ("phase_imports_s", pa.float64(), "importing torch, transformers and the model sources"),
    ("phase_build_s", pa.float64(), "building the model and inputs (and the host fp32 copy for fp64)"),
    ("phase_eager_s", pa.float64(), "eager reference output and eager warm-up"),
    ("phase_compile_s", pa.float64(), "compiling calls (cold, then warm in later processes)"),
    ("phase_compiled_warmup_s", pa.float64(), "compiled warm-up"),
    ("phase_timing_s", pa.float64(), "timed rounds and back-to-back blocks"),
    ("phase_flops_s", pa.float64(), "counting FLOPs"),
    ("phase_accuracy_s", pa.float64(), "fp64 reference run and output comparisons"),
    (
        "phase_exit_s",
        pa.float64(),
        "from a process's last result write to its end: the kernel and GPU driver tearing it down",
    ),
    (
        "started_ahead",
        pa.list_(pa.bool_()),
        "per process: it was started while the process before it still ran, and waited at a gate before it "
        "touched the device (workers.ahead); the first process never is",
    ),
    (
        "gate_wait_s",
        pa.list_(pa.float64()),
        "per process: seconds it waited at its gate, built and ready, for the process before it to end "
        "(0 where it was not started ahead, or the gate opened before it was ready)",
    ),
    (
        "ahead_hidden_s",
        pa.float64(),
        "seconds of the job's processes' start-up (interpreter start, imports, build on the host) that ran "
        "while the process before each still ran, summed: counted in the phase columns, hidden from the wall",
    ),
    (
        "ahead_cpus",
        pa.string(),
        "cores the processes started ahead ran on until their gate opened (never the job's own: cpu_affinity)",
    ),
    (
        "ahead_off",
        pa.string(),
        "why a later process of the job was not started ahead (no spare core on the node, the job not "
        "pinned, ...); null where each was, or the job ran one process",
    ),
    (
        "lane_wait_s",
        pa.float64(),
        "seconds the job waited for a GPU of its node behind the job on it, its first process started ahead "
        "meanwhile (workers.lanes); null where GPU jobs did not go through lanes",
    ),
    (
        "job_efficiency",
        pa.float64(),
        "(phase_compile_s + phase_timing_s + phase_accuracy_s) / wall_s (compiler.job.MEASURING; before schema 13 "
        "without accuracy, recomputed on read): the share of the job's wall time spent on its work",
    ),
    ("attempt", pa.int32(), "1 for the first try of the job"),
]
