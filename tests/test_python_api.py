"""The Python API (docs/python-api.md): what `orchestrator` exports and what importing it costs,
`read_results(latest=True)` on a real output holding a job's earlier attempts, the page's raw
Parquet reads keeping the same rows, and `run_sweep`'s own checks of its inputs before Ray starts.
The page's notebook session runs in tests/integration/test_notebook.py."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from contextlib import closing
from pathlib import Path

import pytest

import orchestrator
from orchestrator import OptionsError, SweepOptions, load_spec, read_results, run_sweep
from orchestrator.fleet.inventory import MissingHardwareError
from orchestrator.spec.matrix import NoJobMatches, expand
from store.rows import make_row
from store.sink import ResultSink

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "python-api.md"


def doc_blocks(lang: str) -> list[str]:
    """The fenced `lang` blocks of docs/python-api.md, in order."""
    return re.findall(rf"^```{lang}\n(.*?)^```$", DOC.read_text(), flags=re.S | re.M)


def test_importing_orchestrator_imports_neither_ray_nor_torch_and_every_name_resolves():
    code = (
        "import sys, orchestrator\n"
        "heavy = sorted({m.split('.')[0] for m in sys.modules} & {'ray', 'torch', 'pyarrow'})\n"
        "print(heavy)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert proc.stdout.strip() == "[]", proc.stdout + proc.stderr
    assert orchestrator.__all__ == sorted(orchestrator._EXPORTS)
    assert set(orchestrator.__all__) <= set(dir(orchestrator))
    for name in orchestrator.__all__:
        assert getattr(orchestrator, name).__name__ == name
    with pytest.raises(AttributeError, match="has no attribute 'nope'"):
        orchestrator.nope  # noqa: B018


SPEC = {
    "name": "latest",
    "models": [{"id": "python:workers.toy:mlp", "name": "mlp"}],
    "batch_sizes": [1, 2, 4],
    "configs": {"default": {}},
}
STACK = {"python": "3.11", "torch": "2.12.0", "triton": "absent", "transformers": "4.50.0"}


@pytest.fixture
def attempts(tmp_path, make_result) -> Path:
    """An output written by the real sink, as three runs leave it: bs1 ok, bs2 a harness failure,
    bs4 ok on its second try (its worker died once); a resume reruns bs2; a resume after a torch
    upgrade runs bs1 again under the new stack's job id (bs4's job started later than that), and
    one more loses bs4's class before its new job starts (no start time: the oldest row)."""
    spec = load_spec(SPEC)
    old = {j.batch_size: j for j in expand(spec, {"cpu": "cpu"}, stack=STACK)}
    new = {j.batch_size: j for j in expand(spec, {"cpu": "cpu"}, stack={**STACK, "torch": "2.13.0"})}
    out = tmp_path / "out"

    def run(run_id: str, *rows: tuple) -> None:
        with closing(ResultSink(out)) as sink:
            for job, status, day, attempt in rows:
                when = day and f"2026-01-0{day}T10:00:00+00:00"
                sink.add(make_row(job, make_result(status, started_at=when), run_id=run_id, attempt=attempt))

    run("r1", (old[1], "ok", 1, 1), (old[2], "harness_error", 1, 1), (old[4], "ok", 5, 2))
    run("r2", (old[2], "ok", 2, 1))
    run("r3", (new[1], "ok", 3, 1))
    run("r4", (new[4], "hardware_lost", None, 3))
    return out


def by_name(rows: list[dict]) -> dict[str, str]:
    return {r["job_name"]: r["run_id"] for r in rows}


def test_read_results_latest_keeps_one_row_per_job_the_latest_attempt(attempts):
    every = read_results(attempts)  # the default: every row the strict reader accepts
    assert sorted(every.column("run_id").to_pylist()) == ["r1", "r1", "r2", "r3", "r4"]
    assert "harness_error" not in every.column("status").to_pylist()
    latest = read_results(attempts, latest=True)
    assert by_name(latest.to_pylist()) == {
        "cpu/mlp/bs1/fp32/default": "r3",
        "cpu/mlp/bs2/fp32/default": "r2",
        "cpu/mlp/bs4/fp32/default": "r1",
    }
    assert latest.schema == every.schema
    assert [r["attempt"] for r in latest.to_pylist() if r["batch_size"] == 4] == [2]
    ids = read_results(attempts, ["job_id"], latest=True)
    assert ids.column_names == ["job_id"]
    assert sorted(ids.column("job_id").to_pylist()) == sorted(latest.column("job_id").to_pylist())
    assert read_results(attempts.parent / "empty", latest=True).num_rows == 0


def test_the_pages_raw_parquet_reads_keep_the_rows_latest_keeps(attempts):
    """The page's last two Python blocks (the Arrow table handed over, then pandas, polars and
    DuckDB on the raw files) run as written, on an output that holds earlier attempts."""
    pytest.importorskip("pandas", reason="the `test` extra installs pandas")
    pytest.importorskip("polars", reason="the `test` extra installs polars")
    pytest.importorskip("duckdb", reason="the `test` extra installs duckdb")
    results = read_results(attempts, latest=True)
    names: dict = {"out": str(attempts), "results": results}
    for block in doc_blocks("python")[-2:]:
        exec(compile(block, str(DOC), "exec"), names)
    want = by_name(results.to_pylist())
    assert len(names["frame"]) == len(names["table"]) == len(names["fastest"]) == 3
    assert by_name(names["latest_pandas"].to_dict("records")) == want
    assert by_name(names["latest_polars"].to_dicts()) == want
    relation = names["latest_duckdb"]
    assert by_name([dict(zip(relation.columns, r, strict=True)) for r in relation.fetchall()]) == want


def test_run_sweep_checks_its_inputs_before_ray_starts(tmp_path, no_ray):
    spec = load_spec(SPEC)
    with pytest.raises(TypeError, match="expected a SweepSpec, got dict: make one with load_spec"):
        run_sweep(SPEC, SweepOptions(out_dir=tmp_path / "a"))
    with pytest.raises(TypeError, match="expected SweepOptions"):
        run_sweep(spec, {"out_dir": str(tmp_path / "a")})
    bad = SweepOptions(out_dir="", cpus_per_job=0, max_attempts=True, only=" , ", history_dirs="runs/x")
    with pytest.raises(OptionsError) as err:
        run_sweep(spec, bad)
    assert str(err.value) == (
        "5 problems in SweepOptions:\n"
        "  out_dir must be a path or a URI, got ''\n"
        "  history_dirs must be a list of paths or URIs, got 'runs/x'\n"
        "  only must be None or a non-empty string, got ' , '\n"
        "  cpus_per_job must be None or a whole number >= 1, got 0\n"
        "  max_attempts must be a whole number >= 1, got True"
    )
    with pytest.raises(OptionsError, match="^SweepOptions: cache_redis names .* set shared_cache=True too$"):
        run_sweep(spec, SweepOptions(out_dir=tmp_path / "a", cache_redis="127.0.0.1:6379"))
    assert not (tmp_path / "a").exists()  # refused before anything was made


def test_run_sweep_refuses_what_the_cli_refuses_on_this_machine(tmp_path, no_ray):
    spec = load_spec(SPEC)
    (tmp_path / "not-an-output").mkdir()
    with pytest.raises(OptionsError, match="history_dirs: .*not-an-output: not an output directory"):
        run_sweep(spec, SweepOptions(out_dir=tmp_path / "a", history_dirs=[tmp_path / "not-an-output"]))
    (tmp_path / "a-file").write_text("")
    with pytest.raises(OptionsError, match="^scratch_root .*a-file: no directory can be made there"):
        run_sweep(spec, SweepOptions(out_dir=tmp_path / "b", scratch_root=str(tmp_path / "a-file")))
    with pytest.raises(NoJobMatches):
        run_sweep(spec, SweepOptions(out_dir=tmp_path / "c", only="*/no-such-model/*"))
    gpu = load_spec({**SPEC, "hardware": ["NoSuchGPU"]})
    with pytest.raises(MissingHardwareError, match="NoSuchGPU"):
        run_sweep(gpu, SweepOptions(out_dir=tmp_path / "d"))
    for name in "bcd":  # nothing was written, not even a run.json
        assert not (tmp_path / name / "run.json").exists()


def test_a_dict_spec_interrupted_says_how_to_resume_from_python(tmp_path):
    from orchestrator.fleet.driver import _resume_command
    from store.storage import resolve

    out = resolve(tmp_path / "x")
    assert _resume_command(load_spec(SPEC), out) == (
        f"run_sweep(spec, SweepOptions(out_dir={str(out)!r}, resume=True))"
    )
    (tmp_path / "sweep.yaml").write_text(json.dumps(SPEC))  # YAML holds JSON
    assert _resume_command(load_spec(tmp_path / "sweep.yaml"), out) == (
        f"orchestrate sweep {tmp_path / 'sweep.yaml'} --out {out} --resume"
    )
