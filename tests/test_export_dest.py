"""`export --dest` on an object store (a moto S3 server over HTTP, reached as real S3 is): the
export is built in a local staging directory, then uploaded with the manifest last; a destination
that is missing, finished or not empty is refused in one line before anything is built."""

from __future__ import annotations

import hashlib
import json

import pytest

from orchestrator.cli import main


@pytest.fixture
def cpu_output(tmp_path, table_jobs, make_result):
    """A sweep output of this machine's stack, whose cpu presets an export here may build."""
    from store.rows import make_row
    from store.sink import ResultSink
    from tests.tune.test_export_apply import CELLS, local_stack_fields

    out = tmp_path / "out"
    sink = ResultSink(out)
    for name, status, eager, compiled in CELLS:
        result = make_result(status, eager, compiled, **local_stack_fields())
        sink.add(make_row(table_jobs[name], result, run_id="r1"))
    sink.close()
    return out


def _interrupted_build(staging, out) -> None:
    """What an export killed after its last preset leaves in its staging directory: every bundle
    and the progress file (so the resumed export compiles nothing)."""
    from orchestrator.tune.export import PROGRESS, plan_export

    entries, _, _ = plan_export(out, "cpu")
    (staging / "bundles").mkdir(parents=True)
    finished = []
    for entry in entries:
        name = f"bundles/{entry['model']}.bin"
        (staging / name).write_bytes(entry["model"].encode())
        finished.append({**entry, "bundle": name, "package": None})
    key = {"source": str(out), "hardware": "cpu", "packages": True}
    (staging / PROGRESS).write_text(json.dumps({"key": key, "entries": finished}))


def test_an_export_to_s3_is_uploaded_manifest_last_and_reads_back(
    s3_bucket, cpu_output, tmp_path, capsys, monkeypatch
):
    from compiler.serving import MANIFEST, SERVING_FILE
    from compiler.serving.files import CACHE_ENV, open_export
    from orchestrator.commands.export import staging_dir
    from store.storage import resolve

    dest, scratch = s3_bucket.uri("exports/cpu"), tmp_path / "scratch"
    staging = staging_dir(resolve(dest), str(scratch))
    _interrupted_build(staging, cpu_output)
    argv = ["export", str(cpu_output), "--hardware", "cpu", "--dest", dest, "--scratch", str(scratch)]
    assert main([*argv, "--resume"]) == 0, capsys.readouterr().err
    printed = capsys.readouterr().out
    assert "uploaded 4 files" in printed and f"wrote s3://{s3_bucket.name}/exports/cpu" in printed
    assert not staging.exists()  # built, uploaded, gone

    remote = resolve(dest)
    manifest = json.loads(remote.join(MANIFEST).read_text())
    assert set(manifest["files"]) == {SERVING_FILE, "bundles/mlp.bin", "bundles/resnet.bin"}
    for rel, digest in manifest["files"].items():  # every listed file is there, byte for byte
        assert hashlib.sha256(remote.join(rel).read_bytes()).hexdigest() == digest
    # and compile_tuned's reader takes it: manifest and presets checked, each bundle verified
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))
    served = open_export(dest)
    assert [e["model"] for e in served.presets["presets"]] == ["mlp", "resnet"]
    assert served.verified("bundles/mlp.bin") == b"mlp"

    # a finished export is never overwritten, resumed or not
    for extra in ([], ["--resume"]):
        assert main([*argv, *extra]) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith("error: --dest s3://") and "holds a finished export" in err, err


def test_an_s3_dest_that_holds_other_objects_is_refused_before_any_build(
    s3_bucket, cpu_output, tmp_path, capsys
):
    from store.storage import resolve

    dest = s3_bucket.uri("taken")
    resolve(dest).join("notes.txt").write_text("someone else's")
    argv = ["export", str(cpu_output), "--hardware", "cpu", "--dest", dest, "--scratch", str(tmp_path / "s")]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "is not empty; export into a new prefix" in err, err
    assert not (tmp_path / "s").exists()


def test_an_s3_dest_in_a_missing_bucket_is_one_line_before_any_build(s3_bucket, cpu_output, tmp_path, capsys):
    dest = s3_bucket.uri("x").replace(s3_bucket.name, "no-such-bucket", 1)
    argv = ["export", str(cpu_output), "--hardware", "cpu", "--dest", dest, "--scratch", str(tmp_path / "s")]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "bucket 'no-such-bucket' does not exist" in err, err
    assert not (tmp_path / "s").exists()


def test_an_s3_dest_another_driver_holds_is_refused_naming_it(
    s3_bucket, cpu_output, tmp_path, capsys, monkeypatch
):
    from store import lock as locking
    from store.lock import OutputLock

    monkeypatch.setattr(locking, "SETTLE_S", 0.1)
    dest = s3_bucket.uri("held")
    argv = ["export", str(cpu_output), "--hardware", "cpu", "--dest", dest, "--scratch", str(tmp_path / "s")]
    with OutputLock.acquire(dest, ["orchestrate", "sweep", "held.yaml"]):
        assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "is in use by another orchestrate driver" in err, err
    assert "held.yaml" in err and "pass another --dest" in err
    assert not (tmp_path / "s").exists()  # nothing built
