"""`orchestrate nightly`, three nights on a real local Ray cluster: the first has nothing to
compare with; the second is 20% slower, which one night cannot confirm ("watch"); the third is
as slow, and the two-night rule fires, with the three reports written.

The jobs themselves are synthetic (a task body that returns a job's result at once, as
`benchmarks/dispatch.py` uses): what is tested is the nightly's own work (the dated directory,
finding the last run, the comparison, the reports, the exit status); real jobs are the other
integration tests'."""

from __future__ import annotations

import json

import numpy as np
import pytest

from orchestrator.fleet.driver import SweepOptions
from orchestrator.fleet.ray_tasks import ray_session
from orchestrator.spec.sweep import parse_spec
from orchestrator.workflows.nightly import (
    REPORT_HTML,
    REPORT_JSON,
    REPORT_MD,
    RUN_NAME,
    earlier_runs,
    run_name,
    run_nightly,
)
from store.schema import read_results
from store.storage import checked

pytestmark = pytest.mark.integration

SWEEP = """\
name: nightly
models: [{id: "python:workers.toy:mlp", name: mlp}]
batch_sizes: [1, 4]
configs: {default: {}, ro: {mode: reduce-overhead}}
hardware: [cpu]
"""


def body(slow: float):
    def job(job_dict, threads, scratch_root=None, extra_path=(), lock_clocks=False):
        rng = np.random.default_rng(abs(hash(json.dumps(job_dict, sort_keys=True))) % 2**32)
        samples = [float(x) for x in 2.0 * slow * (1 + 0.01 * rng.standard_normal(90))]
        return {
            "status": "ok",
            "eager_ms": 4.0,
            "compiled_ms": float(np.median(samples)),
            "compiled_samples_ms": samples,
            "samples_per_repeat": [30, 30, 30],
            "compile_s": 1.0,
            "device_name": "synthetic",
            "started_at": "2026-11-23T00:00:00+00:00",
        }

    return job


def test_three_nights(tmp_path):
    spec = parse_spec(SWEEP, "nightly.yaml")
    history = checked(tmp_path / "nightly")
    with ray_session(None):  # one local cluster for the three nights (each would start its own)
        nights(spec, history, tmp_path)


def nights(spec, history, tmp_path):
    opts = SweepOptions(out_dir=history, cpus_per_job=1)
    first = run_nightly(spec, history, opts, None, task_body=body(1.0), now=1_795_000_000)
    assert first.previous is None and first.comparison is None
    assert first.run.path.endswith("/" + run_name(1_795_000_000)) and read_results(first.run).num_rows == 4
    assert RUN_NAME.match(run_name(1_795_000_000))

    # night 2 is 20% slower: one night over the threshold is only a "watch" (2 consecutive needed)
    opts = SweepOptions(out_dir=history, cpus_per_job=1)
    second = run_nightly(spec, history, opts, None, task_body=body(1.2), now=1_795_086_400)
    assert second.previous is not None and second.previous.path == first.run.path
    assert second.comparison.counts()["regression"] == 0
    assert all(any(r.startswith("watch:") for r in c.reasons) for c in second.comparison.cells)

    # night 3 is as slow: both nights over the threshold against night 1, so it counts
    opts = SweepOptions(out_dir=history, cpus_per_job=1)
    third = run_nightly(spec, history, opts, None, task_body=body(1.2), now=1_795_172_800)
    assert third.comparison.counts()["regression"] == 4
    assert all(any(r.startswith("rule fired") for r in c.reasons) for c in third.comparison.cells)
    report = json.loads((tmp_path / "nightly" / third.run.path.rsplit("/", 1)[1] / REPORT_JSON).read_text())
    assert report["by_model"] == {"mlp": {"regression": ["cpu"], "improvement": []}}
    assert "## Regression report" in third.run.join(REPORT_MD).read_text()
    assert "<svg" in third.run.join(REPORT_HTML).read_text()
    assert earlier_runs(history, "9999")[-1].path == third.run.path  # the newest with rows
