"""docs/python-api.md's notebook session, run as written: its Python blocks in order, in a fresh
interpreter (a sweep built from a dict, run on a private local Ray, its results read back and
handed to pandas, polars and DuckDB), so the page cannot drift from the API."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.test_python_api import ROOT, doc_blocks

pytestmark = pytest.mark.integration

CHECKS = """
# the test's own checks, after the page's blocks
assert summary.counts == {"ok": 1} and summary.planned == 1, summary
(row,) = results.to_pylist()
assert row["job_name"] == "cpu/mlp/bs2/fp32/default" and row["status"] == "ok", row
assert row["eager_ms"] > 0 and row["compiled_ms"] > 0 and row["speedup"] > 0, row
assert len(frame) == len(table) == len(fastest) == 1
for raw in (latest_pandas.to_dict("records"), latest_polars.to_dicts()):
    assert [r["job_id"] for r in raw] == [row["job_id"]], raw
assert latest_duckdb.fetchall()[0][latest_duckdb.columns.index("job_id")] == row["job_id"]
print("checked")
"""


def test_the_python_api_page_runs_as_a_notebook_would(tmp_path):
    for module in ("pandas", "polars", "duckdb"):
        pytest.importorskip(module, reason="the `test` extra installs pandas, polars and duckdb")
    script = tmp_path / "notebook.py"
    script.write_text("\n".join([*doc_blocks("python"), CHECKS]))
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    }
    proc = subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.rstrip().endswith("checked"), proc.stdout
    (shown,) = doc_blocks("text")  # the SpecError the page shows is the one printed
    assert shown in proc.stdout, proc.stdout
    assert "1 jobs planned, 0 already done, 1 to run on cpu" in proc.stderr, proc.stderr
    assert (tmp_path / "runs" / "api-demo" / "results").is_dir()
