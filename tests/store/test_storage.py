"""Outputs at a `pyarrow.fs` URI: file:// and S3 over HTTP (a moto server), round trips through the
sink, run.json, read_results and History, the CLI on URIs, and bad URIs refused before any work."""

from __future__ import annotations

import json
from contextlib import closing
from pathlib import Path

import pyarrow.fs as pafs
import pytest

from orchestrator.cli import main
from orchestrator.fleet.ordering import History
from store import runlog
from store.rows import make_row
from store.schema import RESULT_COLUMNS, read_results
from store.sink import ResultSink, finished_job_ids
from store.storage import StorageError, check_uri, check_writable, redact, resolve

REPO = Path(__file__).resolve().parents[2]
SMOKE = REPO / "sweeps" / "smoke.yaml"

NAMES = [
    "A100/resnet/bs1/fp32/default",
    "A100/resnet/bs1/fp32/ro",
    "A100/mlp/bs4/fp32/tuned",
    "cpu/resnet/bs1/fp32/default",
    "cpu/mlp/bs1/fp32/ro",
]


@pytest.fixture
def rows(table_jobs, make_result):
    """Five rows: three on A100, two on cpu, one of them failed."""
    out = [make_row(table_jobs[n], make_result(), run_id="run-1") for n in NAMES[:-1]]
    out.append(
        make_row(table_jobs[NAMES[-1]], make_result("compile_error", compiled_ms=None), run_id="run-1")
    )
    return out


def files_under(uri: str) -> list[str]:
    """Every file below `uri`, relative to it."""
    loc = resolve(uri)
    infos = loc.fs.get_file_info(pafs.FileSelector(loc.path, recursive=True, allow_not_found=True))
    return sorted(i.path[len(loc.path) + 1 :] for i in infos if i.type == pafs.FileType.File)


def round_trip(out: str, other: str, rows, table_jobs, make_result, table_spec) -> None:
    """Sink, read_results, run.json and History on the output `out` and the history `other`."""
    with closing(ResultSink(out, max_delay_s=60)) as sink:
        for row in rows:
            sink.add(row)
    assert (sink.rows_written, sink.files_written) == (5, 2)
    table = read_results(out)
    assert table.num_rows == 5 and table.schema.names == list(RESULT_COLUMNS)
    assert sorted(table.column("hardware").to_pylist()) == ["A100"] * 3 + ["cpu"] * 2
    by_id = {r["job_id"]: r for r in table.to_pylist()}
    assert all(by_id[r["job_id"]]["started_at"] == r["started_at"] for r in rows)
    assert read_results(out, columns=["job_id", "status"]).column_names == ["job_id", "status"]
    assert finished_job_ids(out) == {r["job_id"] for r in rows}

    runlog.start_run(out, "run-a", table_spec, ["orchestrate", "sweep", "--out", out], {"cpu": {}}, 5, 0)
    runlog.finish_run(out, "run-a", {"ok": 4, "compile_error": 1}, dispatch_s=1.5)
    (run,) = runlog.read_runs(out)
    assert run["counts"] == {"ok": 4, "compile_error": 1} and run["dispatch_s"] == 1.5
    assert run["argv"][-1] == out and run["spec_file"] == "tables.yaml"

    ledger, *files = files_under(out)
    assert ledger.startswith("_ledger/") and ledger.endswith(".jsonl")  # the commit ledger: one segment
    assert files[-1] == "run.json" and len(files) == 3
    assert [f.rsplit("/", 1)[0] for f in files[:2]] == ["results/hardware=A100", "results/hardware=cpu"]
    assert all(f.rsplit("/", 1)[1].startswith("part-") for f in files[:2])  # no dot-file, no tmp file
    listed = [json.loads(line)["part"] for line in resolve(out).join(ledger).read_text().splitlines()]
    assert sorted(listed) == files[:2]

    earlier = table_jobs["A100/mlp/bs1/fp32/default"]
    with closing(ResultSink(other)) as sink:
        sink.add(make_row(earlier, make_result(subprocess_s=99.0), run_id="run-0"))
    history = History.from_output(out, [other])
    assert history.job_ids == {r["job_id"] for r in rows}  # the other output's rows are timing only
    assert history.expected_s(earlier) == 99.0
    assert history.expected_s(table_jobs[NAMES[0]]) == 20.0


# --- file:// --------------------------------------------------------------------------------------


def test_file_uri_round_trip(tmp_path, rows, table_jobs, make_result, table_spec):
    out, other = f"file://{tmp_path}/out", f"file://{tmp_path}/other"
    round_trip(out, other, rows, table_jobs, make_result, table_spec)
    # the same files a local path gets: read back through the plain path
    assert read_results(tmp_path / "out").num_rows == 5
    assert json.loads((tmp_path / "out" / "run.json").read_text())["runs"][0]["run_id"] == "run-a"


def test_history_of_a_missing_output_is_an_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="no such output directory"):
        History.from_output(tmp_path, [f"file://{tmp_path}/nothing"])


def test_report_and_presets_on_a_file_uri(capsys, tmp_path, rows):
    with closing(ResultSink(tmp_path)) as sink:
        for row in rows:
            sink.add(row)
    uri = f"file://{tmp_path}"
    assert main(["report", uri]) == 0
    out = capsys.readouterr().out
    assert "[A100]" in out and f"wrote {uri}/report.md" in out
    assert (tmp_path / "report.md").read_text().startswith("# Speedup")
    assert main(["presets", uri]) == 0
    assert f"wrote {uri}/presets.json" in capsys.readouterr().out
    assert json.loads((tmp_path / "presets.json").read_text())["presets"]
    assert not list(tmp_path.glob(".*"))  # written through a dot-file renamed into place


# --- locations ------------------------------------------------------------------------------------


def test_join_keeps_the_filesystem_and_the_query():
    loc = resolve("s3://bucket/runs/x?region=eu-west-1&scheme=http")  # a region: nothing is contacted
    results = loc.join("results", "hardware=cpu")
    assert results.fs is loc.fs and results.path == "bucket/runs/x/results/hardware=cpu"
    assert str(results) == "s3://bucket/runs/x/results/hardware=cpu?region=eu-west-1&scheme=http"
    assert [p.path for p in results.parents()] == [
        "bucket/runs/x/results",
        "bucket/runs/x",
        "bucket/runs",
        "bucket",
    ]
    assert str(results.parents()[1]) == "s3://bucket/runs/x?region=eu-west-1&scheme=http"
    assert (
        resolve("s3://bucket?region=eu-west-1").join("run.json").uri
        == "s3://bucket/run.json?region=eu-west-1"
    )


def test_local_paths_stay_as_given():
    loc = resolve("runs/smoke")
    assert loc.is_local and loc.uri is None and str(loc) == "runs/smoke"
    assert str(loc.join("results")) == "runs/smoke/results" and loc.join("x").target == Path("runs/smoke/x")
    assert resolve(Path("/tmp/a")).path == "/tmp/a"


def test_a_uri_mangled_by_pathlib_is_refused():
    with pytest.raises(StorageError, match="pathlib"):
        resolve(Path("s3://bucket/x"))  # Path() makes it s3:/bucket/x


def test_secrets_in_uris_are_redacted():
    assert redact("s3://KEY:SECRET@bucket/x?region=r") == "s3://KEY:***@bucket/x?region=r"
    assert redact("s3://bucket/x") == "s3://bucket/x" and redact("runs/x") == "runs/x"


BAD_URIS = [
    ("foo://bucket/x", "unknown filesystem scheme"),
    ("s3://", "no bucket"),
    ("s3:///prefix", "no bucket"),
    ("gs://", "no bucket"),
    ("file://host/abs", "file:///ABSOLUTE/PATH"),
]


@pytest.mark.parametrize(("uri", "says"), BAD_URIS)
def test_check_uri_names_the_uri_and_the_fix(uri, says):
    with pytest.raises(StorageError) as info:
        check_uri(uri)
    assert str(info.value).startswith(uri) and says in str(info.value)


@pytest.mark.parametrize(("uri", "says"), BAD_URIS[:3])
@pytest.mark.parametrize("command", ["sweep", "history", "report", "presets"])
def test_cli_refuses_a_bad_uri_before_any_work(command, uri, says, capsys, tmp_path, no_ray, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the default --out, runs/<name>, would land here
    argv = {
        "sweep": ["sweep", str(SMOKE), "--out", uri],
        "history": ["sweep", str(SMOKE), "--out", str(tmp_path / "out"), "--history", uri],
        "report": ["report", uri],
        "presets": ["presets", uri],
    }[command]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    # refused as the flags are parsed (naming the flag) or as the output is opened
    assert len(err.splitlines()) == 1 and err.startswith("error: ") and uri in err and says in err, err
    assert list(tmp_path.iterdir()) == []


# --- S3 over HTTP (moto) --------------------------------------------------------------------------


def test_s3_round_trip(s3_bucket, rows, table_jobs, make_result, table_spec):
    out, other = s3_bucket.uri("runs/smoke"), s3_bucket.uri("runs/earlier")
    round_trip(out, other, rows, table_jobs, make_result, table_spec)
    assert files_under(s3_bucket.uri()) == [
        *(f"runs/earlier/{f}" for f in files_under(other)),
        *(f"runs/smoke/{f}" for f in files_under(out)),
    ]


def test_s3_endpoint_from_the_environment(s3_bucket, rows, monkeypatch):
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://{s3_bucket.endpoint}")
    out = f"s3://{s3_bucket.name}/plain"
    with closing(ResultSink(out)) as sink:
        sink.add(rows[0])
    assert read_results(out).num_rows == 1
    assert read_results(s3_bucket.uri("plain")).num_rows == 1  # the same objects


def test_report_and_presets_on_s3(capsys, s3_bucket, rows):
    out = s3_bucket.uri("run")
    assert main(["report", out]) == 2
    assert f"no result rows under {s3_bucket.uri('run/results')}" in capsys.readouterr().err
    with closing(ResultSink(out)) as sink:
        for row in rows:
            sink.add(row)
    assert main(["report", out]) == 0
    assert f"wrote {s3_bucket.uri('run/report.md')}" in capsys.readouterr().out
    assert resolve(out).join("report.md").read_text().startswith("# Speedup")
    assert main(["presets", out]) == 0
    capsys.readouterr()
    assert json.loads(resolve(out).join("presets.json").read_text())["presets"]


def test_missing_bucket_is_refused_before_any_work(capsys, s3_bucket, tmp_path, no_ray):
    uri = s3_bucket.uri("run").replace(s3_bucket.name, "no-such-bucket")
    for argv in (["sweep", str(SMOKE), "--out", uri], ["report", uri], ["presets", uri]):
        assert main(argv) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and err.startswith(f"error: {uri}"), err
        assert "bucket 'no-such-bucket' does not exist" in err and "aws s3 mb" in err
    assert files_under(s3_bucket.uri()) == []


def test_an_output_that_cannot_be_written_is_refused_before_any_work(capsys, tmp_path, no_ray):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    out = blocker / "run"
    assert main(["sweep", str(SMOKE), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert f"error: {out}: {blocker} is a regular file, not a directory" in err
    assert blocker.read_text() == "not a directory"


def test_write_probe_leaves_nothing_behind(tmp_path, s3_bucket):
    check_writable(resolve(str(tmp_path / "new" / "run")))
    assert list(tmp_path.iterdir()) == []  # the probe created no directory
    check_writable(resolve(s3_bucket.uri("run")))
    assert files_under(s3_bucket.uri()) == []
