"""One run's results as PyTorch's benchmark records (`orchestrate report OUT --json FILE
--json-format pytorch`), the format of the PyTorch OSS benchmark database (ClickHouse table
`benchmark.oss_ci_benchmark_v3`; its schema: pytorch/test-infra
`clickhouse_db_schema/oss_ci_benchmark_v3/schema.sql`), so the numbers drop into the dashboards
that read it.

A JSON list with one record per cell and metric (or, to a `.jsonl` file, JSON Lines: a record a
line, as PyTorch's own writer emits them):

    {"benchmark": {"name", "mode", "dtype", "extra_info": {str: str}},
     "model": {"name", "type", "backend", "origins": [str], "extra_info": {str: str}},
     "metric": {"name", "benchmark_values": [float], "target_value": float, "extra_info": {str: str}},
     "runners": [{"name", "type", "gpu_info", "gpu_count", "cpu_info", "extra_info": {str: str}}],
     "dependencies": {name: {"repo", "version"}}}

The metric names and units are those of PyTorch's own TorchInductor records
(`benchmarks/dynamo/common.py`: `output_json`): `speedup` (eager / compiled, its 95% interval
in `extra_info`), `abs_latency` (compiled, ms), `compilation_latency` (the cold compile, s),
`eager_peak_mem` and `dynamo_peak_mem` (GB, 1e9 bytes) and `compression_ratio` (eager peak memory
/ compiled); and `eager_latency` (eager, ms). Each record carries one value, as PyTorch's do: a
latency's is its median, with every timed call (`samples`, a JSON list) and the median's 95%
interval (`ci_low`, `ci_high`) in `extra_info`, so a consumer that averages the values reads the
median, not the mean of the calls. Every
`extra_info` value is a string (the schema's `Map(String, String)`); `target_value` is 0, the
schema's value for none. The records of a CI job's metadata (repo, commit, workflow, job) are
added by the uploader (test-infra's `upload_benchmark_results.py`), not here. Only ok cells
have records: a failed cell has no figure to record.
"""

from __future__ import annotations

import json
from typing import Any

from compiler import statistics as cstats
from compiler.hardware import CPU_CLASS
from reports.run_cells import RunCell

BENCHMARK_NAME = "compile-orchestrator"
"""`benchmark.name` of every record."""
RECORDS_START = (
    '[{"benchmark": {"name": "' + BENCHMARK_NAME + '"',
    "[]",
    '{"benchmark": {"name": "' + BENCHMARK_NAME + '"',
)
"""How a records file this tool wrote begins (`to_records_text`: records, none, or JSON Lines)."""

ORIGINS = {"hf": "huggingface", "python": "python", "timm": "timm", "torchvision": "torchvision"}


def _strings(values: dict[str, Any]) -> dict[str, str]:
    """`extra_info` as the schema stores it: every value a string, the unset ones left out."""
    return {k: v if isinstance(v, str) else json.dumps(v) for k, v in values.items() if v is not None}


def _common(row: dict[str, Any]) -> dict[str, Any]:
    """The parts every record of one cell shares: the benchmark, the model, the runner and the
    software stack."""
    device = "cpu" if row["hardware"] == CPU_CLASS else "cuda"
    scheme = str(row.get("model_id") or "").split(":", 1)[0]
    compile_settings = {
        "mode": row.get("mode"),
        "backend": row.get("backend"),
        "fullgraph": row.get("fullgraph"),
        "dynamic": row.get("dynamic"),
        "options": json.loads(row.get("options") or "{}"),
        "freezing": row.get("freezing"),
        "runtime": json.loads(row.get("runtime") or "{}"),
    }
    runner: dict[str, Any] = {"name": device, "type": str(row["hardware"])}
    gpus = row.get("host_gpus")
    runner.update(
        {"gpu_info": row.get("device_name") or "", "gpu_count": gpus or 1} if device == "cuda" else {}
    )
    runner.update({"cpu_info": row.get("device_name") or ""} if device == "cpu" else {})
    if row.get("host_cpus"):
        runner["cpu_count"] = int(row["host_cpus"])
    if row.get("host_mem_bytes"):
        runner["mem_info"] = f"{row['host_mem_bytes'] / 2**30:.1f} GiB"
        runner["avail_mem_in_gb"] = int(row["host_mem_bytes"] // 2**30)
    if device == "cpu" and gpus is not None:
        runner["gpu_count"] = int(gpus)
    runner["extra_info"] = _strings({"hostname": row.get("hostname"), "driver": row.get("driver_version")})
    dependencies = {
        name: {"repo": repo, "version": row.get(key)} if repo else {"version": row.get(key)}
        for name, repo, key in (
            ("torch", "pytorch/pytorch", "torch_version"),
            ("triton", "triton-lang/triton", "triton_version"),
            ("cuda", "", "cuda_version"),
            ("python", "", "python_version"),
        )
        if row.get(key) and row.get(key) != "absent"  # a package the job process did not have
    }
    return {
        "benchmark": {
            "name": BENCHMARK_NAME,
            "mode": "inference",
            "dtype": str(row["dtype"]),
            "extra_info": _strings(
                {
                    "device": device,
                    "hardware": row["hardware"],
                    "batch_size": str(row["batch_size"]),
                    "config": row["config"],
                    "compile": compile_settings,
                    "sweep": row.get("sweep"),
                    "run_id": row.get("run_id"),
                    "job_id": row.get("job_id"),
                }
            ),
        },
        "model": {
            "name": str(row["model"]),
            "type": str(row.get("task") or "model"),
            "backend": str(row.get("backend") or ""),
            "origins": [ORIGINS.get(scheme, scheme)] if scheme else [],
            "extra_info": _strings({"model_id": row.get("model_id")}),
        },
        "runners": [runner],
        "dependencies": dependencies,
    }


def _metric(name: str, values: list[float], **extra: Any) -> dict[str, Any]:
    return {
        "name": name,
        "benchmark_values": [float(v) for v in values],
        "target_value": 0.0,
        "extra_info": _strings(extra),
    }


def _metrics(cell: RunCell) -> list[dict[str, Any]]:
    """The metrics of an ok cell, each with the values it has."""
    r, s = cell.row, cell.speedup
    found = []
    if s is not None:
        found.append(
            _metric(
                "speedup",
                [s.estimate],
                unit="x",
                ci_low=s.low,
                ci_high=s.high,
                ci_level="0.95",
                processes=str(s.processes),
                ci_scope=s.scope,
                reference="the cell's eager, pooled over its jobs",
                reference_ms=cell.reference_ms,
            )
        )
    sizes = r.get("samples_per_repeat")
    for name, side in (("abs_latency", "compiled"), ("eager_latency", "eager")):
        if r.get(f"{side}_ms") is not None:
            found.append(
                _metric(
                    name,
                    [r[f"{side}_ms"]],
                    unit="ms",
                    statistic="median",
                    ci_low=r.get(f"{side}_ci_low"),
                    ci_high=r.get(f"{side}_ci_high"),
                    samples=r.get(f"{side}_samples_ms"),
                    samples_per_repeat=sizes,
                )
            )
    if r.get("compile_s") is not None:
        found.append(
            _metric("compilation_latency", [r["compile_s"]], unit="s", warm_compile_s=r.get("warm_compile_s"))
        )
    eager_peak, peak = r.get("eager_peak_mem_bytes"), r.get("peak_mem_bytes")
    for name, value in (("eager_peak_mem", eager_peak), ("dynamo_peak_mem", peak)):
        if value is not None:
            found.append(_metric(name, [value / 1e9], unit="GB"))
    if eager_peak and peak:
        found.append(_metric("compression_ratio", [eager_peak / peak], unit="x"))
    return found


def benchmark_records(cells: list[RunCell]) -> list[dict[str, Any]]:
    """The records of a run's cells (`reports.run_cells.run_cells`): one per ok cell and metric."""
    records = []
    for cell in cells:
        if cell.row.get("status") != "ok":
            continue
        common = _common(cell.row)
        for metric in _metrics(cell):
            if cell.doubted:  # every metric of a doubted row says so, and why
                metric["extra_info"].update(
                    _strings({"timing_doubted": cstats.doubt_text(list(cell.doubts))})
                )
            records.append(
                {
                    "benchmark": common["benchmark"],
                    "model": common["model"],
                    "metric": metric,
                    "runners": common["runners"],
                    "dependencies": common["dependencies"],
                }
            )
    return records


def to_records_text(records: list[dict[str, Any]], lines: bool = False) -> str:
    """The records as one JSON list, or with `lines` as JSON Lines (a record a line); compact: a
    cell's latency samples are hundreds of numbers."""
    if lines:
        return "".join(json.dumps(r, default=str) + "\n" for r in records)
    return json.dumps(records, default=str)
