"""`orchestrate submit/status/logs` without a cluster: what is refused locally, what is sent.

A fake stands in for Ray's `JobSubmissionClient`; tests/integration/test_submit.py runs the
same commands against a real cluster."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest

from orchestrator.cli import main
from orchestrator.fleet import submit as jobs
from orchestrator.spec.sweep import SpecError

REPO = Path(__file__).resolve().parents[2]
SMOKE = REPO / "sweeps" / "smoke.yaml"
UNREACHABLE = "http://127.0.0.1:1"

BAD = """\
name: bad
models: [hf:microsoft/resnet-50]
batch_sizes: [0]
configs: {default: {}}
"""


class FakeJobs:
    """The parts of `JobSubmissionClient` that orchestrator.fleet.submit uses."""

    def __init__(self, final: str = "SUCCEEDED", address: str = "http://head:8265"):
        self.final = final
        self.address = address
        self.submitted: list[dict] = []

    def get_address(self) -> str:
        return self.address

    def submit_job(self, **kwargs) -> str:
        self.submitted.append(kwargs)
        return "raysubmit_fake123"

    def get_job_info(self, job_id: str):
        if job_id != "raysubmit_fake123":
            raise RuntimeError(f"Request failed with status code 404: Job {job_id} does not exist.")
        return SimpleNamespace(
            submission_id=job_id,
            status=self.final,
            message="Job finished.",
            start_time=1_700_000_000_000,
            end_time=1_700_000_065_500,
            entrypoint="python -m orchestrator sweep sweeps/smoke.yaml --address auto --out /shared/o",
            metadata={"orchestrator.sweep": "smoke", "orchestrator.out": "/shared/o"},
        )

    def get_job_logs(self, job_id: str) -> str:
        return "sweep 'smoke': 2 jobs planned\ndone in 42s: 2 ok\n"

    async def tail_job_logs(self, job_id: str):
        for chunk in ("sweep 'smoke': 2 jobs planned\n", "done in 42s: 2 ok\n"):
            yield chunk


@pytest.fixture
def fake(monkeypatch) -> FakeJobs:
    fake = FakeJobs()
    monkeypatch.setattr(jobs, "client", lambda address: fake)
    return fake


@pytest.fixture
def no_client(monkeypatch):
    def refuse(address):
        raise AssertionError(f"a Jobs client was created for {address}")

    monkeypatch.setattr(jobs, "client", refuse)


@pytest.fixture
def no_address_env(monkeypatch):
    for var in jobs.ADDRESS_ENV_VARS:
        monkeypatch.delenv(var, raising=False)


def _one_line_error(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    return lines[0]


# --- refused before anything is contacted -------------------------------------------------------


def test_bad_sweep_file_is_refused_before_any_client(tmp_path, no_client, capsys):
    # Broken, outside the project and sent to a dead address: the sweep file's problems win.
    bad = tmp_path / "bad.yaml"
    bad.write_text(BAD)
    with pytest.raises(SpecError, match="batch"):
        jobs.submit(bad, UNREACHABLE)
    assert main(["submit", str(bad), "--address", UNREACHABLE]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {bad}:3: batch size") and "reach" not in err


def test_sweep_outside_the_project_is_refused(tmp_path, no_client, capsys):
    outside = tmp_path / "smoke.yaml"
    shutil.copy(SMOKE, outside)
    with pytest.raises(jobs.SubmitError, match="outside the project"):
        jobs.submit(outside, UNREACHABLE)
    assert main(["submit", str(outside), "--address", UNREACHABLE]) == 2
    line = _one_line_error(capsys.readouterr().err)
    assert str(outside) in line and "sweeps" in line


@pytest.mark.parametrize(
    "out",
    ["s3://bucket/runs/smoke", "gs://bucket/x", "s3://bucket/run?endpoint_override=minio:9000&scheme=http"],
)
def test_uri_output_passes_through_to_the_sweep(out):
    sub = jobs.prepare(SMOKE, out)
    assert sub.out == out and sub.out_is_uri and not sub.out_is_relative
    argv = shlex.split(sub.entrypoint)
    assert argv[argv.index("--out") + 1] == out  # quoted for the shell, '?' and '&' included


def test_uri_output_credentials_stay_out_of_the_job_metadata(fake):
    out = "s3://KEY:SECRET@bucket/run"
    assert main(["submit", str(SMOKE), "--out", out, "--address", "http://head:8265", "--no-wait"]) == 0
    (call,) = fake.submitted
    assert call["metadata"]["orchestrator.out"] == "s3://KEY:***@bucket/run"


@pytest.mark.parametrize(
    ("out", "says"),
    [("foo://bucket/x", "unknown filesystem scheme"), ("s3:///x", "no bucket"), ("gs://", "no bucket")],
)
def test_unusable_uri_output_is_refused_before_any_client(out, says, no_client, capsys):
    with pytest.raises(jobs.SubmitError, match=says):
        jobs.submit(SMOKE, UNREACHABLE, out=out)
    assert main(["submit", str(SMOKE), "--out", out, "--address", UNREACHABLE]) == 2
    line = _one_line_error(capsys.readouterr().err)
    assert out in line and says in line


def test_sweep_in_a_part_that_is_not_uploaded_is_refused(tmp_path):
    for rel in ("runs/smoke/sweep.yaml", "docs/results/s.yaml"):
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(SMOKE, path)
        with pytest.raises(jobs.SubmitError, match="not uploaded"):
            jobs.prepare(path, root=tmp_path)
    ok = tmp_path / "sweeps" / "mine.yaml"
    ok.parent.mkdir()
    shutil.copy(SMOKE, ok)
    sub = jobs.prepare(ok, "/shared/out", root=tmp_path)
    assert sub.sweep == "sweeps/mine.yaml"
    assert sub.runtime_env["working_dir"] == str(tmp_path.resolve())


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_gitignored_sweep_is_refused(tmp_path):
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    (tmp_path / ".gitignore").write_text("private/\n")
    (tmp_path / "private").mkdir()
    shutil.copy(SMOKE, tmp_path / "private" / "s.yaml")
    with pytest.raises(jobs.SubmitError, match="gitignored"):
        jobs.prepare(tmp_path / "private" / "s.yaml", root=tmp_path)


def test_bad_flags_exit_2(no_client, capsys):
    assert main(["submit", str(SMOKE), "--cpus-per-job", "0", "--address", UNREACHABLE]) == 2
    assert "--cpus-per-job" in _one_line_error(capsys.readouterr().err)
    assert main(["submit", str(SMOKE), "--timeout-cap", "-1", "--address", UNREACHABLE]) == 2
    assert "--timeout-cap" in _one_line_error(capsys.readouterr().err)


def test_missing_address_is_a_clear_error(no_address_env, capsys):
    with pytest.raises(jobs.SubmitError, match="--address http://HEAD:8265"):
        jobs.resolve_address(None)
    assert main(["status", "raysubmit_x"]) == 2
    assert "no Ray cluster address" in _one_line_error(capsys.readouterr().err)


def test_unreachable_address_is_named(no_address_env, capsys):
    assert main(["status", "raysubmit_x", "--address", UNREACHABLE]) == 2
    line = _one_line_error(capsys.readouterr().err)
    assert UNREACHABLE in line and "8265" in line and "ray dashboard" in line


# --- what is sent ----------------------------------------------------------------------------------


def test_build_submission():
    entrypoint, runtime_env = jobs.build_submission(
        "sweeps/smoke.yaml", "/shared/runs/smoke", ["--only", "*/bs1/*", "--resume"], root="/proj"
    )
    assert entrypoint == (
        "python -m orchestrator sweep sweeps/smoke.yaml --address auto --out /shared/runs/smoke "
        "--only '*/bs1/*' --resume"
    )
    assert shlex.split(entrypoint)[-3:] == ["--only", "*/bs1/*", "--resume"]
    assert runtime_env == {
        "working_dir": "/proj",
        "excludes": [
            ".git",
            "runs/",
            "__pycache__",
            "*.parquet",
            ".pytest_cache",
            ".ruff_cache",
            "*.egg-info",
            "docs/results",
        ],
    }


def test_build_submission_merges_runtime_env_extra():
    _, env = jobs.build_submission(
        "s.yaml",
        "/o",
        root="/proj",
        runtime_env_extra={"env_vars": {"A": "1"}, "excludes": ["big/", ".git"]},
    )
    assert env["env_vars"] == {"A": "1"}
    assert env["excludes"][-1] == "big/" and env["excludes"].count(".git") == 1
    with pytest.raises(jobs.SubmitError, match="working_dir"):
        jobs.build_submission("s.yaml", "/o", root="/proj", runtime_env_extra={"working_dir": "/x"})


def test_prepare_defaults_to_runs_of_the_sweep_name():
    sub = jobs.prepare(SMOKE)
    assert sub.sweep == "sweeps/smoke.yaml" and sub.out == "runs/smoke" and sub.out_is_relative
    assert sub.runtime_env["working_dir"] == str(REPO)
    assert shlex.split(sub.entrypoint) == [
        "python",
        "-m",
        "orchestrator",
        "sweep",
        "sweeps/smoke.yaml",
        "--address",
        "auto",
        "--out",
        "runs/smoke",
    ]


def test_address_flag_wins_over_the_environment(monkeypatch):
    monkeypatch.setenv("RAY_ADDRESS", "http://from-ray-address:8265")
    monkeypatch.delenv("RAY_API_SERVER_ADDRESS", raising=False)
    assert jobs.resolve_address(None) == "http://from-ray-address:8265"
    monkeypatch.setenv("RAY_API_SERVER_ADDRESS", "api:8265")
    assert jobs.resolve_address(None) == "http://api:8265"  # Ray's order, and its http default
    assert jobs.resolve_address("http://flag:8265/") == "http://flag:8265"

    # Ray's own client lets the environment override an explicit address; ours does not.
    import ray.job_submission

    seen = {}

    class Recorder:
        def __init__(self, address):
            seen["address"] = address
            seen["env"] = {v: os.environ.get(v) for v in jobs.ADDRESS_ENV_VARS}

    monkeypatch.setattr(ray.job_submission, "JobSubmissionClient", Recorder)
    monkeypatch.setattr(jobs, "_check_reachable", lambda url: None)
    jobs.client("http://flag:8265")
    assert seen == {
        "address": "http://flag:8265",
        "env": {"RAY_API_SERVER_ADDRESS": None, "RAY_ADDRESS": None},
    }
    assert os.environ["RAY_ADDRESS"] == "http://from-ray-address:8265"  # restored


def test_submit_no_wait_prints_the_id_and_next_commands(fake, capsys):
    argv = ["submit", str(SMOKE), "--address", "http://head:8265", "--out", "/shared/o", "--no-wait"]
    argv += ["--only", "mlp", "--resume", "--timeout-cap", "30", "--cpus-per-job", "1", "--lock-clocks"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "job raysubmit_fake123" in out
    assert "orchestrate status raysubmit_fake123 --address http://head:8265" in out
    assert "orchestrate logs raysubmit_fake123 --follow --address http://head:8265" in out
    (sent,) = fake.submitted
    assert sent["entrypoint"] == (
        "python -m orchestrator sweep sweeps/smoke.yaml --address auto --out /shared/o "
        "--only mlp --resume --timeout-cap 30 --cpus-per-job 1 --lock-clocks"
    )
    assert sent["runtime_env"]["working_dir"] == str(REPO)
    assert sent["metadata"] == {"orchestrator.sweep": "smoke", "orchestrator.out": "/shared/o"}


@pytest.mark.parametrize(("final", "code"), [("SUCCEEDED", 0), ("FAILED", 1)])
def test_submit_follows_the_logs_and_exits_with_the_job(final, code, fake, capsys):
    fake.final = final
    assert main(["submit", str(SMOKE), "--address", "http://head:8265"]) == code
    out = capsys.readouterr().out
    assert "done in 42s" in out and out.rstrip().endswith(f"job raysubmit_fake123: {final}")
    assert "relative: inside the job's working directory" in out


def test_status_and_logs(fake, capsys):
    assert jobs.status("http://head:8265", "raysubmit_fake123") == {
        "job_id": "raysubmit_fake123",
        "status": "SUCCEEDED",
        "message": "Job finished.",
        "start_time": "2023-11-14T22:13:20+00:00",
        "end_time": "2023-11-14T22:14:25+00:00",
        "duration_s": 65.5,
        "entrypoint": "python -m orchestrator sweep sweeps/smoke.yaml --address auto --out /shared/o",
        "metadata": {"orchestrator.sweep": "smoke", "orchestrator.out": "/shared/o"},
        "address": "http://head:8265",
    }
    assert main(["status", "raysubmit_fake123", "--address", "http://head:8265"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("job raysubmit_fake123: SUCCEEDED\n") and "out:" in out and "/shared/o" in out

    for follow in ([], ["--follow"]):
        assert main(["logs", "raysubmit_fake123", "--address", "http://head:8265", *follow]) == 0
        assert capsys.readouterr().out == "sweep 'smoke': 2 jobs planned\ndone in 42s: 2 ok\n"

    assert main(["logs", "raysubmit_nope", "--address", "http://head:8265"]) == 2
    assert "no job 'raysubmit_nope'" in _one_line_error(capsys.readouterr().err)


def test_authentication_errors_say_what_to_set(monkeypatch):
    from ray.exceptions import AuthenticationError

    monkeypatch.delenv("RAY_AUTH_MODE", raising=False)
    monkeypatch.setenv("RAY_AUTH_TOKEN", "t0ken")
    with pytest.raises(jobs.SubmitError) as missing, jobs._cluster_errors("http://head:8265"):
        raise AuthenticationError("Authentication required: Unauthorized: Missing authentication token")
    text = str(missing.value)
    assert "requires a token" in text and "RAY_AUTH_MODE=token" in text and "ray get-auth-token" in text
    assert "RAY_AUTH_TOKEN is set, but Ray sends a token only when RAY_AUTH_MODE=token" in text
    assert "t0ken" not in text  # never echo the secret

    monkeypatch.setenv("RAY_AUTH_MODE", "token")
    with pytest.raises(jobs.SubmitError) as wrong, jobs._cluster_errors("http://head:8265"):
        raise AuthenticationError("Authentication failed: Forbidden: Invalid authentication token")
    assert "rejected the token" in str(wrong.value) and "is set, but" not in str(wrong.value)


def test_submit_passes_on_every_sweep_flag_it_takes():
    """The flags `submit` shares with `sweep` reach the `orchestrate sweep` it runs, from one table."""
    from orchestrator.cli import build_parser
    from orchestrator.commands.jobs import FORWARDED, forwarded

    given = [
        "--only", "*/bs1/*", "--resume", "--timeout-cap", "60", "--cpus-per-job", "2", "--allow-missing",
        "--max-attempts", "2", "--lock-clocks", "--no-overlap", "--shared-cache", "--cache-redis", "head:6379",
        "--cache-password-file", "/etc/cache/password", "--cache-secret-file", "/etc/cache/secret",
    ]  # fmt: skip
    args = build_parser().parse_args(["submit", "s.yaml", *given])
    assert forwarded(args) == given
    assert {f for f in given if f.startswith("--")} == set(FORWARDED)
    assert forwarded(build_parser().parse_args(["submit", "s.yaml"])) == []
