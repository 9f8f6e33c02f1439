"""`report OUT --json FILE --json-format pytorch`: a run's results as PyTorch's benchmark records,
checked against the shape of the PyTorch OSS benchmark database's table (pytorch/test-infra,
`clickhouse_db_schema/oss_ci_benchmark_v3/schema.sql`), on a real output."""

from __future__ import annotations

import json
import math

import pytest

from compiler import statistics as cstats
from orchestrator.cli import main
from reports.benchmark_records import BENCHMARK_NAME
from tests.pages import measured_rows, write_output

FAILED = "cpu/mlp/bs4/fp32/tuned"

# The v3 table's columns a record fills, with their ClickHouse types: "str" String, "num" Float32,
# "count" UInt32, "strs" Array(String), "nums" Array(Float32), "map" Map(String, String).
SCHEMA = {
    "benchmark": {"name": "str", "mode": "str", "dtype": "str", "extra_info": "map"},
    "model": {"name": "str", "type": "str", "backend": "str", "origins": "strs", "extra_info": "map"},
    "metric": {"name": "str", "benchmark_values": "nums", "target_value": "num", "extra_info": "map"},
}
RUNNER = {
    "name": "str",
    "type": "str",
    "cpu_info": "str",
    "cpu_count": "count",
    "mem_info": "str",
    "avail_mem_in_gb": "count",
    "gpu_info": "str",
    "gpu_count": "count",
    "gpu_mem_info": "str",
    "avail_gpu_mem_in_gb": "count",
    "extra_info": "map",
}
DEPENDENCY = {"repo": "str", "branch": "str", "sha": "str", "version": "str", "extra_info": "map"}
METRICS = (
    "speedup",
    "abs_latency",
    "eager_latency",
    "compilation_latency",
    "eager_peak_mem",
    "dynamo_peak_mem",
    "compression_ratio",
)


def fits(value, kind: str) -> bool:
    number = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    return {
        "str": isinstance(value, str),
        "num": number,
        "count": number and value == int(value) and value >= 0,
        "strs": isinstance(value, list) and all(isinstance(v, str) for v in value),
        "nums": isinstance(value, list) and bool(value) and all(fits(v, "num") for v in value),
        "map": isinstance(value, dict)
        and all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()),
    }[kind]


def shape_problems(record: dict) -> list[str]:
    """Where a record does not fit the v3 table: a field it does not have, or a value of another type."""
    problems = [f"{key}: missing" for key in ("benchmark", "model", "metric") if key not in record]
    extra = set(record) - {*SCHEMA, "runners", "dependencies"}
    problems += [f"{key}: not a column" for key in extra]
    for part, fields in SCHEMA.items():
        for key, value in record.get(part, {}).items():
            if key not in fields or not fits(value, fields[key]):
                problems.append(f"{part}.{key}: {value!r}")
        if not record.get(part, {}).get("name"):
            problems.append(f"{part}.name: required")
    for runner in record.get("runners", []):
        problems += [
            f"runners.{k}: {v!r}" for k, v in runner.items() if k not in RUNNER or not fits(v, RUNNER[k])
        ]
    for name, dep in record.get("dependencies", {}).items():
        problems += [
            f"dependencies.{name}.{k}"
            for k, v in dep.items()
            if k not in DEPENDENCY or not fits(v, DEPENDENCY[k])
        ]
    return problems


@pytest.fixture(scope="module")
def run(tmp_path_factory, table_jobs, make_result):
    rows = measured_rows(table_jobs, make_result, 3, failed=FAILED)
    return write_output(tmp_path_factory.mktemp("records") / "out", rows), rows


def test_the_shape_check_finds_what_does_not_fit():
    good = {
        "benchmark": {"name": "b", "mode": "inference", "dtype": "fp32", "extra_info": {"device": "cpu"}},
        "model": {"name": "m", "origins": ["hf"]},
        "metric": {"name": "speedup", "benchmark_values": [1.5], "target_value": 0.0},
        "runners": [{"name": "cuda", "gpu_count": 1}],
    }
    assert shape_problems(good) == []
    bad = json.loads(json.dumps(good))
    bad["metric"]["benchmark_values"] = ["1.5"]
    bad["benchmark"]["extra_info"]["batch_size"] = 4
    bad["runners"][0]["gpu_count"] = 0.5
    del bad["model"]["name"]
    assert shape_problems(bad) == [
        "benchmark.extra_info: {'device': 'cpu', 'batch_size': 4}",
        "model.name: required",
        "metric.benchmark_values: ['1.5']",
        "runners.gpu_count: 0.5",
    ]


def test_report_json_pytorch_writes_a_record_per_cell_and_metric_in_the_v3_shape(run, tmp_path, capsys):
    out, rows = run
    target = tmp_path / "records.json"
    assert main(["report", str(out), "--json", str(target), "--json-format", "pytorch"]) == 0
    assert f"wrote {target}" in capsys.readouterr().out
    records = json.loads(target.read_text())
    assert isinstance(records, list)
    assert [p for r in records for p in shape_problems(r)] == []
    ok = [r for r in rows if r["status"] == "ok"]
    assert len(records) == len(ok) * len(METRICS)  # nothing of the failed cell
    by = {
        (
            r["benchmark"]["extra_info"]["hardware"],
            r["model"]["name"],
            r["benchmark"]["extra_info"]["batch_size"],
            r["benchmark"]["dtype"],
            r["benchmark"]["extra_info"]["config"],
            r["metric"]["name"],
        ): r
        for r in records
    }
    assert len(by) == len(records)  # one record per cell and metric
    for row in ok:
        cell = (row["hardware"], row["model"], str(row["batch_size"]), row["dtype"], row["config"])
        assert {m for *c, m in by if tuple(c) == cell} == set(METRICS)
        speedup = by[(*cell, "speedup")]
        # over the cell's one eager reference: every config's eager pooled (compiler.statistics.reference)
        same = [
            r
            for r in ok
            if (r["hardware"], r["model"], r["batch_size"], r["dtype"])
            == (row["hardware"], row["model"], row["batch_size"], row["dtype"])
        ]
        iv = cstats.cell_reference(same).speedup(row)
        assert (
            iv.estimate
            != cstats.paired_speedup(
                row["eager_samples_ms"], row["compiled_samples_ms"], row["samples_per_repeat"]
            ).estimate
            or len(same) == 1
        )  # not the job's own eager
        assert speedup["metric"]["benchmark_values"] == [iv.estimate]
        info = speedup["metric"]["extra_info"]
        assert (float(info["ci_low"]), float(info["ci_high"])) == (iv.low, iv.high) and info[
            "processes"
        ] == "3"
        for metric, side in (("abs_latency", "compiled"), ("eager_latency", "eager")):
            latency = by[(*cell, metric)]["metric"]  # one value, the median, as PyTorch's records carry
            assert latency["benchmark_values"] == [row[f"{side}_ms"]], latency
            info = latency["extra_info"]
            assert json.loads(info["samples"]) == row[f"{side}_samples_ms"] and info["statistic"] == "median"
            assert (float(info["ci_low"]), float(info["ci_high"])) == (
                row[f"{side}_ci_low"],
                row[f"{side}_ci_high"],
            )
        assert by[(*cell, "compilation_latency")]["metric"]["benchmark_values"] == [row["compile_s"]]
        assert by[(*cell, "dynamo_peak_mem")]["metric"]["benchmark_values"] == [row["peak_mem_bytes"] / 1e9]
        ratio = row["eager_peak_mem_bytes"] / row["peak_mem_bytes"]
        assert by[(*cell, "compression_ratio")]["metric"]["benchmark_values"] == [ratio]
    first = records[0]
    assert first["benchmark"]["name"] == BENCHMARK_NAME and first["benchmark"]["mode"] == "inference"
    assert first["model"]["origins"] == ["python"] and first["model"]["backend"] == "inductor"
    assert first["runners"] == [
        {
            "name": "cuda",
            "type": "A100",
            "gpu_info": "NVIDIA A100-SXM4-80GB",
            "gpu_count": 1,
            "extra_info": {"hostname": "worker-1"},
        }
    ]
    assert first["dependencies"]["torch"] == {"repo": "pytorch/pytorch", "version": "2.13.0"}
    cpu = next(r for r in records if r["benchmark"]["extra_info"]["hardware"] == "cpu")
    assert cpu["runners"][0]["name"] == cpu["benchmark"]["extra_info"]["device"] == "cpu"
    # JSON Lines to a .jsonl file: the same records, one a line
    lines = tmp_path / "records.jsonl"
    assert main(["report", str(out), "--json", str(lines), "--json-format", "pytorch"]) == 0
    assert [json.loads(x) for x in lines.read_text().splitlines()] == records
    assert main(["report", str(out), "--json", str(lines), "--json-format", "pytorch"]) == 0  # replaced
    # the next run's records replace these; the default with --baseline is still the comparison
    assert main(["report", str(out), "--json", str(target), "--json-format", "pytorch"]) == 0
    assert main(["report", str(out), "--baseline", str(out), "--json", str(target)]) == 0
    assert json.loads(target.read_text())["format"] == 1
    assert (
        main(["report", str(out), "--baseline", str(out), "--json", str(target), "--json-format", "pytorch"])
        == 0
    )
    assert json.loads(target.read_text()) == records  # OUT's records, beside the comparison
