"""Locations and network targets, tried as an adversary would: every flag that takes a location
(`--out`, `--dest`, `--history`, `--baseline`, `--prune-from`, the OUT of `report`, `presets`,
`kernels`, `export`) refuses the same bad forms with one `error:` line and exit 2, before anything
runs or is written; an existing directory that is no output is refused; and a port that accepts
connections but never answers fails each network command in seconds, not never."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from orchestrator.cli import main

REPO = Path(__file__).resolve().parents[1]
SMOKE = str(REPO / "sweeps" / "smoke.yaml")
# The sweep file of the sweeps and nightlies run as processes below: what they check is the address,
# after the file is read; smoke.yaml's hf: models would have each process import transformers and
# torch to validate them (about 2.5 s of CPU a process), the toy MLP imports neither. (`submit`
# takes a file of the project only: it ships the project to the cluster.)
TOY_SWEEP = "name: toy\nmodels: [{id: 'python:workers.toy:mlp', name: mlp}]\nbatch_sizes: [1]\nconfigs: {default: {}}\n"
LONG_NAME = "/tmp/" + "n" * 300
LONG_PATH = "/tmp/" + "/".join(["p" * 200] * 25)

BAD_FORMS = {
    "file: with one slash": ("file:/tmp/x", "file:///ABSOLUTE/PATH (three slashes)"),
    "s3: without //": ("s3:bucket/x", "write s3://BUCKET/PREFIX"),
    "gs: without //": ("gs:bucket", "write gs://BUCKET/PREFIX"),
    "hdfs: without //": ("hdfs:x", "write hdfs://HOST/PATH"),
    "a word and a colon": ("runs:x", "write ./runs:x"),
    "a query on file://": ("file:///tmp/x?x=1", "takes no '?query'"),
    "a fragment": ("file:///tmp/x#frag", "'#fragment' means nothing"),
    "a fragment on s3://": ("s3://bucket/x#frag", "'#fragment' means nothing"),
    "an unknown scheme": ("zz://bucket/x", "unknown filesystem scheme 'zz://'"),
    "a name over NAME_MAX": (LONG_NAME, "names is 300 bytes long"),
    "a path over PATH_MAX": (LONG_PATH, "this system allows 4095"),
}

FLAGS = {
    "sweep --out": ["sweep", SMOKE, "--out", "{}"],
    "sweep --history": ["sweep", SMOKE, "--out", "out", "--history", "{}"],
    "tune --out": ["tune", SMOKE, "--out", "{}"],
    "tune --prune-from": ["tune", SMOKE, "--out", "out", "--prune-from", "{}"],
    "nightly --history": ["nightly", SMOKE, "--history", "{}"],
    "submit --out": ["submit", SMOKE, "--address", "http://127.0.0.1:1", "--out", "{}"],
    "report OUT": ["report", "{}"],
    "report --baseline": ["report", "out", "--baseline", "{}"],
    "report --history": ["report", "out", "--history", "{}"],
    "presets OUT": ["presets", "{}"],
    "kernels OUT": ["kernels", "{}"],
    "export OUT": ["export", "{}", "--hardware", "cpu", "--dest", "dest"],
    "export --dest": ["export", "out", "--hardware", "cpu", "--dest", "{}"],
}


def one_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert "Traceback" not in err
    assert lines[0].startswith("error: "), lines[0]
    return lines[0]


@pytest.mark.parametrize("form", BAD_FORMS)
@pytest.mark.parametrize("flag", FLAGS)
def test_every_location_flag_refuses_the_same_bad_forms(flag, form, tmp_path, capsys, monkeypatch, no_ray):
    monkeypatch.chdir(tmp_path)  # a form taken as a relative path would appear here
    text, says = BAD_FORMS[form]
    argv = [a.format(text) for a in FLAGS[flag]]
    assert main(argv) == 2
    line = one_line(capsys.readouterr().err)
    assert says in line, line
    assert len(line) < 800, line  # a 5 kB path is shown shortened
    assert list(tmp_path.iterdir()) == []


def test_a_local_path_whose_first_name_holds_a_colon_is_read_when_written_with_dot_slash(
    tmp_path, capsys, monkeypatch, table_jobs, make_result
):
    from contextlib import closing

    from store.rows import make_row
    from store.sink import ResultSink

    monkeypatch.chdir(tmp_path)
    with closing(ResultSink(tmp_path / "runs:x")) as sink:
        for job in table_jobs.values():
            sink.add(make_row(job, make_result("ok", 10.0, 5.0), run_id="r"))
    assert main(["report", "./runs:x"]) == 0
    assert "wrote" in capsys.readouterr().out
    assert main(["report", "runs:x"]) == 2  # the same without ./ reads as a URI: refused with the fix
    assert "write ./runs:x" in one_line(capsys.readouterr().err)


def test_a_file_uri_dest_is_the_local_directory(tmp_path):
    from orchestrator.commands.export import _local_dest

    assert _local_dest(f"file://{tmp_path}/dest") == tmp_path / "dest"
    assert (tmp_path / "dest").is_dir()


def test_azure_without_credentials_is_one_line_on_stderr(tmp_path):
    """The Azure SDK runs `az` through a shell, which wrote `az: not found` to our stderr."""
    done = subprocess.run(
        [sys.executable, "-m", "orchestrator", "report", "abfs://container@account/x"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert done.returncode == 2, done.stderr
    line = one_line(done.stderr)
    assert line.startswith("error: abfs://container@account/x: ") and "az login" in line, line


# --- an existing directory that is no output ----------------------------------------------------


def snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("command", ["sweep", "tune"])
def test_an_existing_directory_that_is_no_output_is_refused(command, tmp_path, capsys, no_ray):
    home = tmp_path / "home"
    (home / "results").mkdir(parents=True)  # a folder named like a table, holding no partition
    (home / "results" / "notes.md").write_text("mine")
    (home / ".bashrc").write_text("mine")
    before = snapshot(home)
    assert main([command, SMOKE, "--out", str(home)]) == 2
    line = one_line(capsys.readouterr().err)
    assert line.startswith(f"error: {home}: a directory that holds other files (.bashrc, results)"), line
    assert snapshot(home) == before and sorted(p.name for p in home.iterdir()) == [".bashrc", "results"]


def test_the_root_directory_is_refused(capsys, no_ray):
    assert main(["sweep", SMOKE, "--out", "/"]) == 2
    assert "is no orchestrate output" in one_line(capsys.readouterr().err)


def test_an_empty_directory_is_an_output(tmp_path):
    from store.storage import check_own_output, resolve

    check_own_output(resolve(str(tmp_path)))  # nothing raised
    check_own_output(resolve(str(tmp_path / "missing")))


# --- network targets that accept and never answer -----------------------------------------------


@contextlib.contextmanager
def _serving(handle) -> int:
    """A real TCP server on 127.0.0.1 whose accepted connections go to `handle`; yields its port."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(64)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except OSError:
                return
            held.append(conn)
            handle(conn)

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield server.getsockname()[1]
    finally:
        stop.set()
        server.close()
        for conn in held:
            conn.close()


@pytest.fixture
def silent_port():
    """Accepts every connection and never sends a byte."""
    with _serving(lambda conn: None) as port:
        yield port


@pytest.fixture
def http_port():
    """Answers anything with an HTTP/1.1 error, as a web server that is not Ray would."""

    def answer(conn: socket.socket) -> None:
        with contextlib.suppress(OSError):
            conn.recv(4096)
            conn.sendall(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")

    with _serving(answer) as port:
        yield port


def run_cli(
    args: list[str], tmp_path: Path, bound_s: float = 40.0
) -> tuple[subprocess.CompletedProcess, float]:
    t0 = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "orchestrator", *args],
        capture_output=True,
        text=True,
        timeout=bound_s,  # a hang fails the test here instead of stalling the suite
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(REPO), "RAY_ADDRESS": "", "RAY_API_SERVER_ADDRESS": ""},
    )
    return done, time.monotonic() - t0


# front door -> (its arguments, what its one error line says)
NEVER_ANSWERS = {
    "status": (
        ["status", "raysubmit_x", "--address", "http://127.0.0.1:{port}"],
        "sent no HTTP answer in time",
    ),
    "logs": (["logs", "raysubmit_x", "--address", "127.0.0.1:{port}"], "sent no HTTP answer in time"),
    "submit": (
        ["submit", SMOKE, "--address", "http://127.0.0.1:{port}", "--no-wait"],  # a file of the project
        "sent no HTTP answer in time",
    ),
    "sweep": (["sweep", "{sweep}", "--out", "out", "--address", "127.0.0.1:{port}"], "sent nothing in 5 s"),
    "sweep-ray-client": (
        ["sweep", "{sweep}", "--out", "out", "--address", "ray://127.0.0.1:{port}"],
        "sent nothing in 5 s",
    ),
    "nightly": (
        ["nightly", "{sweep}", "--history", "hist", "--address", "127.0.0.1:{port}"],
        "sent nothing in 5 s",
    ),
}


def test_a_port_that_never_answers_fails_in_seconds(silent_port, tmp_path):
    """Every front door, each in a directory of its own. Each run mostly waits out the 5 s probe,
    so they all go at once (one after the other they took 50 s of the suite's time, three at a
    time 29 s)."""

    sweep = tmp_path / "toy.yaml"
    sweep.write_text(TOY_SWEEP)

    def run(name: str) -> tuple[Path, subprocess.CompletedProcess, float]:
        cwd = tmp_path / name
        cwd.mkdir()
        args, _ = NEVER_ANSWERS[name]
        return (cwd, *run_cli([a.format(port=silent_port, sweep=sweep) for a in args], cwd))

    with ThreadPoolExecutor(max_workers=len(NEVER_ANSWERS)) as pool:
        runs = dict(zip(NEVER_ANSWERS, pool.map(run, NEVER_ANSWERS), strict=True))
    for name, (cwd, done, took) in runs.items():
        _, says = NEVER_ANSWERS[name]
        assert done.returncode == 2, (name, done.stderr)
        assert says in one_line(done.stderr), name
        # the probe waits 5 s; the rest is Python, Ray and the sweep file loading
        assert took < 40, (name, took)
        assert sorted(p.name for p in cwd.iterdir()) == [], name  # no output, no lock, no history


def test_a_web_server_given_as_the_cluster_address_is_refused(http_port, tmp_path):
    (tmp_path / "toy.yaml").write_text(TOY_SWEEP)
    done, _ = run_cli(["sweep", "toy.yaml", "--out", "out", "--address", f"127.0.0.1:{http_port}"], tmp_path)
    assert done.returncode == 2, done.stderr
    assert "answers, but not as a Ray cluster (no gRPC)" in one_line(done.stderr)
    assert not (tmp_path / "out").exists()


def test_a_grpc_server_passes_the_address_check():
    """The probe must not refuse a real cluster: a gRPC server (what Ray's GCS and its Client
    server are) answers the HTTP/2 preface."""
    from concurrent import futures

    grpc = pytest.importorskip("grpc")
    from orchestrator.fleet.address import check_ray_address

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=1))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        check_ray_address(f"127.0.0.1:{port}")
        check_ray_address(f"ray://127.0.0.1:{port}")
    finally:
        server.stop(None)


def test_a_300_character_host_is_one_line(capsys, no_ray):
    host = "h" * 300
    for argv in (
        ["sweep", SMOKE, "--out", "out", "--address", f"{host}:6379"],
        ["status", "raysubmit_x", "--address", f"http://{host}:8265"],
    ):
        assert main(argv) == 2
        line = one_line(capsys.readouterr().err)
        assert len(line) < 600, line


def test_the_readme_example_output_is_not_refused(tmp_path):
    """`runs/NAME` under a project checkout (a directory with other files) is a new directory."""
    from store.storage import check_own_output, resolve

    shutil.copy(REPO / "README.md", tmp_path / "README.md")
    check_own_output(resolve(str(tmp_path / "runs" / "smoke")))
