"""A real sweep writing to S3 over HTTP (a moto server): `--out s3://...`, `--resume`, `report`."""

from __future__ import annotations

import json

import pytest

from store.schema import read_results
from store.storage import resolve
from tests.integration.conftest import orchestrate

pytestmark = pytest.mark.integration

SWEEP = """\
name: it-s3
models:
  - {id: python:workers.toy:mlp, name: mlp}
batch_sizes: [1, 2]
configs:
  dynamo: {backend: eager}
measure: {warmup: 1, iterations: 3}
"""


def test_sweep_resume_and_report_on_an_s3_uri(sweep_file, s3_bucket, tmp_path):
    sweep = sweep_file(SWEEP)
    out = s3_bucket.uri("runs/it-s3")
    scratch = tmp_path / "scratch"
    scratch.mkdir()

    proc = orchestrate("sweep", str(sweep), "--out", out, "--cpus-per-job", "1", "--scratch", str(scratch))
    assert f"output {out}" in proc.stderr
    assert f"results: {s3_bucket.uri('runs/it-s3/results')}" in proc.stdout
    table = read_results(out)
    assert table.num_rows == 2 and set(table.column("status").to_pylist()) == {"ok"}, table.column("error")
    runs = json.loads(resolve(out).join("run.json").read_text())["runs"]
    assert len(runs) == 1 and runs[0]["counts"] == {"ok": 2} and runs[0]["argv"][-5] == out
    assert not list(tmp_path.glob("**/results"))  # nothing landed on the local disk instead

    resumed = orchestrate("sweep", str(sweep), "--out", out, "--resume", "--scratch", str(scratch))
    assert "2 already done, 0 to run" in resumed.stderr
    assert read_results(out).num_rows == 2
    assert len(json.loads(resolve(out).join("run.json").read_text())["runs"]) == 2

    report = orchestrate("report", out)
    assert "[cpu]" in report.stdout and "mlp" in report.stdout
    assert resolve(out).join("report.md").read_text().startswith("# Speedup")
