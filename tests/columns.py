"""Columns that tests of a real ok job (with `warm_compile: true`) require to be non-null."""

from compiler.job import PHASES

# Every measurement field a job reports that its results row must carry.
MEASUREMENT_COLUMNS = (
    "eager_ms",
    "eager_p10_ms",
    "eager_p90_ms",
    "compiled_ms",
    "compiled_p10_ms",
    "compiled_p90_ms",
    "speedup",
    "speedup_ci_low",
    "speedup_ci_high",
    "ci_scope",
    "speedup_ci_between_share",
    "eager_ci_low",
    "eager_ci_high",
    "compiled_ci_low",
    "compiled_ci_high",
    "repeats",
    "samples_per_repeat",
    "eager_repeat_ms",
    "compiled_repeat_ms",
    "repeat_compile_s",
    "eager_samples_ms",
    "compiled_samples_ms",
    "eager_b2b_ms",
    "compiled_b2b_ms",
    "eager_warmup_calls",
    "compiled_warmup_calls",
    "compile_s",
    "warm_compile_s",
    "warm_cache_hits",
    "warm_cache_misses",
    "dynamo_s",
    "inductor_s",
    "eager_peak_mem_bytes",
    "peak_mem_bytes",
    "memory_compression",
    "graph_count",
    "graph_breaks",
    "break_reasons",
    "recompiles",
    "recompile_reasons",
    "guard_count",
    "kernel_count",
    "flops",
    "eager_tflops",
    "compiled_tflops",
    "max_abs_err",
    "max_rel_err",
    "rmse_eager",
    "rmse_compiled",
    "device_name",
    "torch_version",
    "python_version",
    "started_at",
    "subprocess_s",
    "host_probe_us",
    "host_steal_share",
    "job_processes",
    "cpu_affinity",
    "cpu_pinned",
    *(f"phase_{p}_s" for p in PHASES),
    "started_ahead",
    "gate_wait_s",
    "ahead_hidden_s",
)


def assert_pinned_or_says_why(row: dict, cores: int | None = None) -> None:
    """A job is pinned to `cores` cores (any number when None) it reserved, or, when another
    program (another sweep on this machine) holds them, runs unpinned and its row says so: a
    test must not depend on the machine being otherwise idle."""
    import os

    from compiler.env import parse_cpus

    if row["cpu_pinned"]:
        pinned = parse_cpus(row["cpu_affinity"])
        assert pinned and pinned <= os.sched_getaffinity(0), row["cpu_affinity"]
        assert cores is None or len(pinned) == cores, row["cpu_affinity"]
    else:
        assert "not pinned to cores: only" in (row.get("notes") or ""), row.get("notes")
        assert "held by other jobs" in row["notes"], row["notes"]
