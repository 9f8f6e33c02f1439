"""A real sweep on the embedded local Ray: real models compiled by Inductor, real faults."""

from __future__ import annotations

import json

import pyarrow.dataset as ds
import pytest

from orchestrator.cli import main
from store.schema import read_results
from tests.columns import assert_pinned_or_says_why
from tests.integration.conftest import orchestrate, planned_count

pytestmark = pytest.mark.integration

SWEEP = """\
name: it-cpu
models:
  - id: hf:microsoft/resnet-50
    name: resnet-tiny
    input_size: 64
    overrides: {embedding_size: 16, hidden_sizes: [16, 32, 64, 128], depths: [1, 1, 1, 1]}
  - {id: python:workers.toy:mlp, name: mlp}
  - {id: python:tests.faulty:segfault, name: segfault}
  - {id: python:tests.faulty:hang, name: hang, timeout_s: 8}
  - {id: python:tests.faulty:raising, name: raising}
batch_sizes: [2]
configs:
  default: {}
measure: {warmup: 2, iterations: 5}
timeout_s: 240
"""

EXPECTED_STATUS = {
    "resnet-tiny": "ok",
    "mlp": "ok",
    "segfault": "crash",
    "hang": "timeout",
    "raising": "runtime_error",
}


def test_sweep_records_every_job_and_faults_become_rows(sweep_file, tmp_path, capsys):
    sweep = sweep_file(SWEEP)
    out = tmp_path / "out"
    planned = planned_count(sweep)
    assert planned == 5

    proc = orchestrate("sweep", str(sweep), "--out", str(out), "--cpus-per-job", "1", "--lock-clocks")
    assert "done in" in proc.stdout
    # where the run's time went (analysis/efficiency.py), after the counts
    assert "of wall time over 5 jobs; " in proc.stdout.split("done in")[1], proc.stdout
    assert "--lock-clocks: this sweep runs on no GPU class; nothing to lock" in proc.stderr

    table = read_results(out)
    assert table.num_rows == planned
    rows = {r["model"]: r for r in table.to_pylist()}
    assert {m: r["status"] for m, r in rows.items()} == EXPECTED_STATUS
    assert len(set(table.column("job_id").to_pylist())) == planned
    for model in ("resnet-tiny", "mlp"):
        r = rows[model]
        assert r["compile_s"] > 0 and r["eager_ms"] > 0 and r["compiled_ms"] > 0, r
        assert r["speedup"] == pytest.approx(r["eager_ms"] / r["compiled_ms"])
        assert r["graph_count"] >= 1 and r["error"] is None
        assert r["max_rel_err"] < 1e-3
        # two jobs at a time on their own core each (unless another sweep holds the cores: then
        # unpinned, saying so), timed in one process, its phases accounted
        assert_pinned_or_says_why(r, cores=1)
        assert r["repeats"] == 1 and r["ci_scope"] == "one process" and r["clocks_locked"] is None
        assert 0 < r["job_efficiency"] < 1 and r["phase_imports_s"] > 0
    assert "SIGSEGV" in rows["segfault"]["error"]
    assert "timed out after 8 s" in rows["hang"]["error"]
    assert "this model always fails" in rows["raising"]["error"]
    assert all(r["node_id"] and r["hardware"] == "cpu" and r["wall_s"] > 0 for r in rows.values())

    # Plain pyarrow reads the dataset too, with the hardware class from the directory names.
    plain = ds.dataset(out / "results", partitioning="hive").to_table()
    assert plain.num_rows == planned and set(plain.column("hardware").to_pylist()) == {"cpu"}

    runs = json.loads((out / "run.json").read_text())["runs"]
    assert len(runs) == 1 and runs[0]["planned"] == planned and runs[0]["versions"]["torch"]

    # Running the same sweep again into the same directory is refused without --resume (what
    # --resume then skips is tests/integration/test_resume.py's); in this process, as the report
    # and the presets, to spare three interpreter starts
    assert main(["sweep", str(sweep), "--out", str(out)]) == 2
    assert "--resume" in capsys.readouterr().err
    assert read_results(out).num_rows == planned

    assert main(["report", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "resnet-tiny" in printed and "timeout" in printed and (out / "report.md").exists()
    assert "job efficiency " in printed and "# Where the time went" in (out / "report.md").read_text()
    assert main(["presets", str(out)]) == 0
    presets = json.loads((out / "presets.json").read_text())
    assert {p["model"] for p in presets["presets"]} == {"resnet-tiny", "mlp"}
    assert {m["model"] for m in presets["no_preset"]} == {"segfault", "hang", "raising"}
