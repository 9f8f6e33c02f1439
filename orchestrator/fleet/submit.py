"""Ray Jobs submission: send a sweep to a running cluster, then read its status and logs.

`submit` packages the project (this checkout, with `EXCLUDES` left out) as the job's
`working_dir` and runs `python -m orchestrator sweep <file> --address auto --out <out>` as the
job's entrypoint, so the driver runs on the cluster (on the head node) and the jobs reach every
node. Everything talks to the cluster through `ray.job_submission.JobSubmissionClient`, i.e. the
dashboard's HTTP Jobs API (`http://HEAD:8265`).

Addresses follow Ray's convention: an explicit address, else `RAY_API_SERVER_ADDRESS`, else
`RAY_ADDRESS`; unlike Ray's client, an explicit address always wins over the environment.

Token authentication is Ray's own: when `RAY_AUTH_MODE=token` is set in the environment, the
Jobs client sends `Authorization: Bearer <token>` with every request, the token read from
`RAY_AUTH_TOKEN`, else the file named by `RAY_AUTH_TOKEN_PATH`, else `~/.ray/auth_token`. This
module leaves all of that to Ray and only turns its 401/403 answers into an error that says
which of those to set.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shlex
import shutil
import socket
import subprocess
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, TextIO
from urllib.parse import urlsplit

from orchestrator.fleet.address import auth_hint
from orchestrator.spec.sweep import SweepSpec, load_spec
from store.location_forms import check_form, printable
from store.storage import StorageError, is_uri, redact

EXCLUDES = [
    ".git",
    "runs/",
    "__pycache__",
    "*.parquet",
    ".pytest_cache",
    ".ruff_cache",
    "*.egg-info",
    "docs/results",
]
"""Left out of the job's working_dir (gitignore syntax, as Ray applies it); Ray also honours
the project's .gitignore files."""

_EXCLUDED_DIRS = {".git", "runs", "__pycache__", ".pytest_cache", ".ruff_cache"}

ADDRESS_ENV_VARS = ("RAY_API_SERVER_ADDRESS", "RAY_ADDRESS")
"""Where Ray's Jobs client looks for the address, in this order."""


TERMINAL_STATUSES = frozenset({"SUCCEEDED", "FAILED", "STOPPED"})
CONNECT_TIMEOUT_S = 10.0
PROBE_TIMEOUT_S = 5.0
"""How long the first request (the Jobs API's version) may wait for an answer."""
HTTP_TIMEOUT_S = 60.0
"""How long any later request may wait between bytes of the answer (a job's logs, a submission)."""
DASHBOARD_PORT = 8265


class SubmitError(RuntimeError):
    """Bad input or an unusable cluster; the message is one line meant for the user."""


@dataclass(frozen=True)
class Submission:
    """What `submit` sends: built and checked locally, before any cluster is contacted."""

    spec: SweepSpec
    sweep: str
    """The sweep file, relative to the project root (the job's working directory)."""
    out: str
    entrypoint: str
    runtime_env: dict[str, Any]

    @property
    def out_is_uri(self) -> bool:
        return is_uri(self.out)

    @property
    def out_is_relative(self) -> bool:
        return not self.out_is_uri and not Path(self.out).is_absolute()


def project_root() -> Path:
    """The checkout this package runs from; it becomes the job's working directory."""
    root = Path(__file__).resolve().parents[2]
    if not (root / "pyproject.toml").is_file() or not (root / "workers").is_dir():
        raise SubmitError(
            f"orchestrator is installed at {root}, which is not a source checkout; `submit` ships the "
            "checkout as the job's working directory, so install it with `pip install -e .` from one"
        )
    return root


def build_submission(
    sweep: str,
    out: str,
    extra_args: Sequence[str] = (),
    root: str | Path | None = None,
    runtime_env_extra: dict[str, Any] | None = None,
) -> tuple[str, dict[str, Any]]:
    """(entrypoint, runtime_env) for a sweep file given relative to the project root `root`.

    `extra_args` are appended to the `orchestrate sweep` command line. `runtime_env_extra` is
    merged into the runtime env; its `excludes` are added to ours."""
    root = Path(root) if root is not None else project_root()
    command = ["python", "-m", "orchestrator", "sweep", sweep, "--address", "auto", "--out", out]
    entrypoint = shlex.join([*command, *extra_args])
    runtime_env: dict[str, Any] = {"working_dir": str(root), "excludes": list(EXCLUDES)}
    for key, value in (runtime_env_extra or {}).items():
        if key == "excludes":
            runtime_env["excludes"] += [e for e in value if e not in runtime_env["excludes"]]
        elif key == "working_dir":
            raise SubmitError("runtime_env_extra cannot replace working_dir: it is the project checkout")
        else:
            runtime_env[key] = value
    return entrypoint, runtime_env


def _relative_sweep(sweep_path: Path, root: Path) -> str:
    path = sweep_path.resolve()
    try:
        rel = path.relative_to(root)
    except ValueError:
        raise SubmitError(
            f"{sweep_path} is outside the project ({root}); only the project travels to the cluster "
            f"as the job's working directory, so move or copy the sweep file under it (e.g. {root / 'sweeps'})"
        ) from None
    parts = rel.parts
    excluded = (
        any(p in _EXCLUDED_DIRS or p.endswith(".egg-info") for p in parts[:-1])
        or parts[:2] == ("docs", "results")
        or _gitignored(rel, root)
    )
    if excluded:
        raise SubmitError(
            f"{sweep_path} lies in a part of the project that is not uploaded (excluded or gitignored); "
            f"move it somewhere that is, e.g. {root / 'sweeps'}"
        )
    return rel.as_posix()


def _gitignored(rel: Path, root: Path) -> bool:
    """Ray leaves gitignored files out of a working_dir; ask git whether `rel` is one of them."""
    if not (root / ".git").exists() or shutil.which("git") is None:
        return False
    proc = subprocess.run(
        ["git", "-C", str(root), "check-ignore", "-q", "--", rel.as_posix()], capture_output=True
    )
    return proc.returncode == 0


def prepare(
    sweep_path: str | Path,
    out: str | Path | None = None,
    extra_args: Sequence[str] = (),
    runtime_env_extra: dict[str, Any] | None = None,
    root: str | Path | None = None,
) -> Submission:
    """Check everything that can be checked locally and build the submission.

    Raises `SpecError` for a bad sweep file and `SubmitError` for a sweep file the job would not
    see or an output URI no filesystem serves; nothing is contacted. A URI output (s3://, gs://)
    passes through to the sweep, which checks its bucket on the head node before it starts."""
    spec = load_spec(sweep_path)  # SpecError first: nothing is sent for a bad file
    root = Path(root).resolve() if root is not None else project_root()
    sweep = _relative_sweep(Path(sweep_path), root)
    out = str(out) if out is not None else f"runs/{spec.name}"
    # Only the form is checked here: the output is the head node's to reach, with its credentials.
    try:
        check_form(out)
    except StorageError as exc:
        raise SubmitError(f"--out {exc}") from None
    entrypoint, runtime_env = build_submission(sweep, out, extra_args, root, runtime_env_extra)
    return Submission(spec, sweep, out, entrypoint, runtime_env)


# --- talking to the cluster ---------------------------------------------------------------------


def resolve_address(address: str | None) -> str:
    """The Jobs API address: `address`, else $RAY_API_SERVER_ADDRESS, else $RAY_ADDRESS."""
    if not address:
        address = next((os.environ[v] for v in ADDRESS_ENV_VARS if os.environ.get(v)), None)
    if not address:
        raise SubmitError(
            f"no Ray cluster address: pass --address http://HEAD:{DASHBOARD_PORT} (the head's dashboard, "
            f"which serves the Jobs API) or set RAY_API_SERVER_ADDRESS"
        )
    address = address.rstrip("/")
    if "://" not in address and address != "auto":
        address = f"http://{address}"  # what Ray's client assumes too
    return address


def _check_reachable(address: str) -> None:
    """Fail in seconds, naming the address, where Ray's client would wait for a TCP timeout."""
    if address == "auto":
        return
    bad = SubmitError(
        f"bad address {address!r}: expected http://HOST:PORT, the head's dashboard (port {DASHBOARD_PORT}), "
        "which serves the Jobs API"
    )
    try:
        parts = urlsplit(address)
        port = parts.port or (443 if parts.scheme == "https" else 80)
        host = parts.hostname
    except ValueError:
        raise bad from None
    if parts.scheme not in ("http", "https") or not host:
        if parts.scheme == "ray":
            raise SubmitError(
                f"{printable(address)}: ray:// is Ray Client, which `orchestrate sweep --address` uses; "
                f"`orchestrate submit`, `status` and `logs` talk to the Jobs API at http://HEAD:{DASHBOARD_PORT}"
            )
        raise bad
    try:
        socket.create_connection((host, port), timeout=CONNECT_TIMEOUT_S).close()
    except UnicodeError:  # a host name no DNS label can hold (over 63 characters a label)
        raise bad from None
    except OSError as exc:
        raise SubmitError(_unreachable(address, exc)) from None


def _unreachable(address: str, exc: BaseException) -> str:
    return (
        f"cannot reach the Ray dashboard at {printable(address)} ({exc}); is the cluster up, and started with its "
        f"dashboard (`ray start --head --include-dashboard=true`, port {DASHBOARD_PORT} by default)? "
        f"From outside its network, `ray dashboard CLUSTER.yaml` forwards it to localhost:{DASHBOARD_PORT}"
    )


@contextmanager
def _cluster_errors(address: str, job_id: str | None = None) -> Iterator[None]:
    """Turn the Jobs client's exceptions into one-line `SubmitError`s."""
    import requests
    from ray.exceptions import AuthenticationError

    try:
        yield
    except AuthenticationError as exc:
        raise SubmitError(auth_hint(address, exc)) from None
    except requests.exceptions.ReadTimeout:
        raise SubmitError(
            f"the server at {address} accepted the connection but sent no HTTP answer in time (the first "
            f"request waits {PROBE_TIMEOUT_S:g} s, later ones {HTTP_TIMEOUT_S:g} s); is that the Ray dashboard "
            f"(port {DASHBOARD_PORT}), and is the head node responsive?"
        ) from None
    except (ConnectionError, requests.exceptions.ConnectionError) as exc:
        raise SubmitError(_unreachable(address, exc)) from None
    except RuntimeError as exc:
        text = str(exc)
        if job_id and ("404" in text or "does not exist" in text):
            raise SubmitError(
                f"no job {job_id!r} on the cluster at {address} (`ray job list --address {address}` lists them)"
            ) from None
        if "401" in text or "403" in text:
            raise SubmitError(auth_hint(address, exc)) from None
        raise SubmitError(f"the Ray Jobs API at {address} failed: {' '.join(text.split())}") from None


@contextmanager
def _address_env_masked() -> Iterator[None]:
    """Ray's client lets RAY_API_SERVER_ADDRESS / RAY_ADDRESS override an explicit address;
    hide them while it resolves one, so the address we resolved (flag first) is the one used."""
    saved = {v: os.environ.pop(v) for v in ADDRESS_ENV_VARS if v in os.environ}
    try:
        yield
    finally:
        os.environ.update(saved)


_RAY_CHATTY_LOGGERS = (
    "ray._private.runtime_env",  # "Ignoring upload ... .gitignore", ".git is now ignored by default"
    "ray.dashboard.modules.dashboard_sdk",  # "Uploading package ..."
    "ray.dashboard.modules.job.sdk",  # "WebSocket closed ..."
)


@contextmanager
def _quiet_ray_logs() -> Iterator[None]:
    """Ray's client logs every packaging step at INFO; keep its warnings and errors only."""
    loggers = [logging.getLogger(name) for name in _RAY_CHATTY_LOGGERS]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.ERROR)
    try:
        yield
    finally:
        for lg, level in zip(loggers, levels, strict=True):
            lg.setLevel(level)


def client(address: str | None):
    """A connected `JobSubmissionClient` for `address` (see `resolve_address`), whose every
    request has a timeout: a port that takes connections and never answers fails in seconds."""
    from ray.job_submission import JobSubmissionClient

    class TimedClient(JobSubmissionClient):
        def _do_request(self, method: str, endpoint: str, **kwargs):
            first = endpoint == "/api/version"  # the probe the client sends as it connects
            kwargs.setdefault("timeout", (CONNECT_TIMEOUT_S, PROBE_TIMEOUT_S if first else HTTP_TIMEOUT_S))
            return super()._do_request(method, endpoint, **kwargs)

    url = resolve_address(address)
    _check_reachable(url)
    with _cluster_errors(url), _address_env_masked():
        return TimedClient(url)


def submit(
    sweep_path: str | Path,
    address: str | None,
    out: str | Path | None = None,
    extra_args: Sequence[str] = (),
    runtime_env_extra: dict[str, Any] | None = None,
) -> str:
    """Submit a sweep as a Ray job; return its submission id.

    The sweep file is validated first (`SpecError`, nothing submitted); `out` defaults to
    `runs/<sweep name>`, which, being relative, resolves inside the job's working directory on
    the head node."""
    return submit_prepared(prepare(sweep_path, out, extra_args, runtime_env_extra), address)


def submit_prepared(sub: Submission, address: str | None) -> str:
    """Submit what `prepare` built; return the submission id."""
    jobs = client(address)
    url = jobs.get_address()
    with _cluster_errors(url), _quiet_ray_logs():
        return jobs.submit_job(
            entrypoint=sub.entrypoint,
            runtime_env=sub.runtime_env,
            metadata={"orchestrator.sweep": sub.spec.name, "orchestrator.out": redact(sub.out)},
        )


def _iso(ms: int | None) -> str | None:
    if not ms:
        return None
    return datetime.fromtimestamp(ms / 1000, tz=timezone.utc).isoformat(timespec="seconds")


def _status(jobs, job_id: str) -> dict[str, Any]:
    url = jobs.get_address()
    with _cluster_errors(url, job_id):
        info = jobs.get_job_info(job_id)
    status = getattr(info.status, "value", str(info.status))
    duration = None
    if info.start_time:
        end = info.end_time or datetime.now(timezone.utc).timestamp() * 1000
        duration = round((end - info.start_time) / 1000, 1)
    return {
        "job_id": info.submission_id or job_id,
        "status": status,
        "message": info.message,
        "start_time": _iso(info.start_time),
        "end_time": _iso(info.end_time),
        "duration_s": duration,
        "entrypoint": info.entrypoint,
        "metadata": dict(info.metadata or {}),
        "address": url,
    }


def status(address: str | None, job_id: str) -> dict[str, Any]:
    """The job's status (PENDING, RUNNING, SUCCEEDED, FAILED, STOPPED), message, start and end
    time (ISO 8601, UTC), duration, entrypoint and metadata."""
    return _status(client(address), job_id)


def logs(address: str | None, job_id: str, follow: bool = False, stream: TextIO | None = None) -> str:
    """Write the job's logs to `stream`; with `follow`, keep writing until the job ends.

    Returns the job's status afterwards."""
    stream = stream or sys.stdout
    jobs = client(address)
    url = jobs.get_address()
    _status(jobs, job_id)  # an unknown id or a refused token fails here, with a clear message
    if not follow:
        with _cluster_errors(url, job_id):
            text = jobs.get_job_logs(job_id)
        stream.write(text)
        stream.flush()
    else:

        async def tail() -> None:
            async for chunk in jobs.tail_job_logs(job_id):
                stream.write(chunk)
                stream.flush()

        try:
            with _cluster_errors(url, job_id), _quiet_ray_logs():
                asyncio.run(tail())
        except SubmitError:
            raise
        except Exception as exc:  # aiohttp's websocket errors
            raise SubmitError(f"following the logs of {job_id} at {url} failed: {exc}") from None
    return _status(jobs, job_id)["status"]
