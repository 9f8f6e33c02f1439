"""Failures of the harness are not results: a job whose scratch directory could not be made is a
`harness_error` row, which `--resume` runs again, while a model's own failure stays a result."""

from __future__ import annotations

import io

import pyarrow.dataset as ds
import pytest

from orchestrator.fleet.driver import SweepOptions, run_sweep
from orchestrator.fleet.preflight import preflight
from orchestrator.spec.sweep import parse_spec
from store.schema import read_results

pytestmark = pytest.mark.integration

SWEEP = """\
name: harness
models:
  - {id: python:workers.toy:mlp, name: mlp}
  - {id: python:tests.faulty:raising, name: raising}
batch_sizes: [2]
configs:
  default: {}
measure: {warmup: 1, iterations: 3}
timeout_s: 240
"""


def resume(spec, out, scratch) -> str:
    """`--resume` of the sweep into `out` with a usable scratch; what the driver printed."""
    log = io.StringIO()
    run_sweep(
        spec, SweepOptions(out_dir=out, cpus_per_job=1, resume=True, scratch_root=str(scratch)), stream=log
    )
    return log.getvalue()


def test_a_harness_failure_is_run_again_by_resume_and_a_models_failure_is_not(tmp_path):
    spec = parse_spec(SWEEP, "harness.yaml")
    out = tmp_path / "out"
    not_a_dir = tmp_path / "scratch-is-a-file"
    not_a_dir.write_text("a file where the jobs' scratch directories should go")
    # The CLI refuses such a --scratch before Ray starts (tests/test_cli_refusals.py), and so does
    # run_sweep called alone (tests/test_python_api.py); a node whose scratch cannot be made meets
    # the same failure inside the job's task, as here, where `ready` (what the CLI hands over once
    # its checks ran) skips the check on this machine.
    opts = SweepOptions(out_dir=out, cpus_per_job=1, scratch_root=str(not_a_dir))
    run_sweep(spec, opts, stream=io.StringIO(), ready=preflight(opts))
    first = read_results(out).to_pylist()
    assert {r["model"]: r["status"] for r in first} == {"mlp": "harness_error", "raising": "harness_error"}
    for r in first:
        assert "scratch directory could not be made under" in r["error"], r["error"]
        assert "--scratch must name a writable directory" in r["error"]

    log = resume(spec, out, tmp_path / "s")
    assert "0 already done, 2 to run" in log, log
    # nothing written is lost: the harness rows stay in the files beside the new ones, and the
    # reader returns a job's harness row only while it has no other
    raw = ds.dataset(out / "results", partitioning="hive").to_table().to_pylist()
    assert sorted(r["status"] for r in raw) == ["harness_error", "harness_error", "ok", "runtime_error"]
    rows = {r["model"]: r for r in read_results(out).to_pylist()}
    assert {m: r["status"] for m, r in rows.items()} == {"mlp": "ok", "raising": "runtime_error"}
