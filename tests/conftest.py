"""Shared fixtures: real `Job`s of a small sweep, hand-made task results, an S3 server (moto), a
small disk of its own (tmpfs) to fill up."""

from __future__ import annotations

import atexit
import contextlib
import errno
import logging
import os
import shutil
import signal
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from compiler.job import Job
from orchestrator.spec.matrix import expand
from orchestrator.spec.sweep import SweepSpec, parse_spec

os.environ["CO_STRICT_ROWS"] = "1"  # a result key that is no column fails the test (store/rows.py)


def _trusting_thresholds() -> str:
    """The project's thresholds with no timing doubted (`compiler.statistics.trust`), in a file of
    this test session's: tests share 2 cores with each other (and perhaps another sweep), so a
    test about something else must not have its cells left undecided for a busy host. The tests
    of doubted timings set `THRESHOLDS_ENV` back (tests/integration/test_doubted_timing.py)."""
    import json
    import tempfile

    from compiler.statistics.thresholds import THRESHOLDS_FILE

    data = json.loads(THRESHOLDS_FILE.read_text())
    data.update({k: 1e9 for k in data if k.startswith("doubt_")})
    fd, path = tempfile.mkstemp(prefix="thresholds-trusting-", suffix=".json")
    with os.fdopen(fd, "w") as f:
        json.dump(data, f)
    atexit.register(lambda: Path(path).unlink(missing_ok=True))  # by the process that made it
    return path


if "ORCHESTRATE_THRESHOLDS" not in os.environ:  # pytest-xdist's workers inherit the controller's
    os.environ["ORCHESTRATE_THRESHOLDS"] = _trusting_thresholds()

TABLE_SPEC = """\
name: tables
models:
  - {id: hf:microsoft/resnet-50, name: resnet}
  - {id: "python:workers.toy:mlp", name: mlp}
batch_sizes: [1, 4]
dtypes: [fp32]
configs:
  default: {}
  ro: {mode: reduce-overhead}
  tuned: {options: {max_autotune: true}}
"""

TABLE_STACK = {"python": "3.11", "torch": "2.13.0", "triton": "absent", "transformers": "4.50.0"}


# Seconds each test file took, summed over its tests, in a run of the CI command on this 2-core
# machine (two workers, this file's order, 2026-11-27: 15m27s, the workers ending 0.2 s apart):
# a scheduling hint only, so a stale figure costs balance, never a result. A file not named here
# counts as DEFAULT_FILE_S if it holds an integration test, else QUICK_TEST_S a test.
FILE_S = {
    "tests/test_benchmarks.py": 500,
    "tests/test_pages_browser.py": 15,  # one browser launch for every page: kept on one worker
    "tests/integration/test_tune.py": 75,
    "tests/integration/test_shared_cache.py": 60,  # its autotune test (124 s) is in the slow tier now
    "tests/integration/test_full_disk.py": 10,  # all but its tune test is in the slow tier now
    "tests/integration/test_output_safety.py": 90,
    "tests/test_kernel_choices.py": 67,  # with its two integration tests (one waits out a 40 s timeout)
    "tests/integration/test_submit.py": 0,  # in the slow tier
    "tests/integration/test_seed_models.py": 0,  # in the slow tier
    "tests/serving/test_export_plan.py": 45,  # measured beside other work, not yet in such a run
    "tests/integration/test_scratch_faults.py": 45,  # measured alone, not yet in such a run
    "tests/integration/test_cache_trust.py": 75,  # measured alone, not yet in such a run
    "tests/tune/test_bundle_safety.py": 30,  # measured alone, not yet in such a run
    "tests/fleet/test_cache_trust.py": 8,  # measured alone, not yet in such a run
    "tests/integration/test_fleet_lost_node.py": 0,  # in the slow tier
    "tests/test_runner_faults.py": 43,
    "tests/integration/test_deadline.py": 43,
    "tests/integration/test_sweep_cpu.py": 41,
    "tests/tune/test_export_apply.py": 36,
    "tests/integration/test_s3_output.py": 33,
    "tests/integration/test_core_venv.py": 32,
    "tests/integration/test_fleet.py": 30,
    "tests/test_isa_probe.py": 27,
    "tests/integration/test_interrupt.py": 25,
    "tests/integration/test_harness_failures.py": 25,
    "tests/test_cli_refusals.py": 25,
    "tests/test_cli_locations.py": 24,
    "tests/spec/test_bad_files.py": 23,
    "tests/integration/test_no_orphans.py": 21,
    "tests/integration/test_damaged_output.py": 20,
    "tests/integration/test_location_locks.py": 19,
    "tests/test_ahead.py": 19,  # 22 s alone since that run (one more gate test)
    "tests/test_lanes.py": 18,  # measured alone, not yet in such a run
    "tests/integration/test_notebook.py": 18,
    "tests/tune/test_apply_sources.py": 18,
    "tests/test_device_time.py": 18,
    "tests/test_measure_method.py": 18,
    "tests/test_regression.py": 14,
    "tests/integration/test_nightly.py": 10,
    "tests/tune/test_runtime_settings.py": 10,
    "tests/test_weights.py": 8,
    "tests/tune/test_deployed.py": 8,
}
DEFAULT_FILE_S = 15
QUICK_TEST_S = 0.1


@pytest.hookimpl(trylast=True)  # after -m has deselected: the halves are of what runs
def pytest_collection_modifyitems(config, items):
    """Two halves of the collection, balanced by the seconds their files take (`FILE_S`), each
    with its integration test files (real Ray, real compiles: up to minutes a test) first, then
    the fast tier's, each part longest first, so that each half ends on its quickest tests.
    `-n 2 --dist worksteal` hands each worker one half (the first len // 2 tests, the rest) and
    lets an idle worker take the end of the other's queue, so both start on long tests at once and
    the run ends on short ones, rather than on one worker finishing a long test alone
    (docs/testing.md). A file's tests stay together (a module fixture is built once), but for the
    quickest tests at a half's end, moved to the other half's end so that the first half holds
    exactly len // 2; the order is the same in every worker, as xdist requires."""
    files: dict[str, list] = {}
    for item in items:
        files.setdefault(item.nodeid.split("::")[0], []).append(item)
    integration = {f for f, tests in files.items() if any(t.get_closest_marker("integration") for t in tests)}

    def seconds(name: str) -> float:
        default = DEFAULT_FILE_S if name in integration else QUICK_TEST_S * len(files[name])
        return FILE_S.get(name, default)

    halves: tuple[list, list] = ([], [])
    totals = [0.0, 0.0]
    for name in sorted(files, key=lambda f: (f not in integration, -seconds(f), f)):
        lighter = totals.index(min(totals))
        totals[lighter] += seconds(name)
        halves[lighter].extend(files[name])
    first, second = halves
    target = len(items) // 2
    if len(first) > target:
        second.extend(first[target:])
        del first[target:]
    elif len(first) < target:
        moved = second[len(second) - (target - len(first)) :]
        del second[len(second) - len(moved) :]
        first.extend(moved)
    items[:] = [*first, *second]


def default_sigint() -> None:
    """`preexec_fn` for a child a test sends Ctrl-C (SIGINT): it takes it the way a terminal's
    foreground command does, even when the tests themselves run in the background (`cmd &` in a
    script starts with SIGINT ignored, a child inherits that, and Python then never raises
    KeyboardInterrupt)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.fixture(scope="session")
def table_spec() -> SweepSpec:
    return parse_spec(TABLE_SPEC, "tables.yaml")


@pytest.fixture(scope="session")
def table_jobs(table_spec) -> dict[str, Job]:
    """name -> Job for hardware A100 (cuda) and cpu: 2 models x 2 batch sizes x 3 configs each."""
    jobs = expand(table_spec, {"A100": "cuda", "cpu": "cpu"}, stack=TABLE_STACK)
    return {j.name: j for j in jobs}


def _result(
    status: str = "ok", eager_ms: float | None = 10.0, compiled_ms: float | None = 5.0, **extra
) -> dict:
    result: dict[str, Any] = {
        "status": status,
        "device_name": "NVIDIA A100-SXM4-80GB",
        "node_id": "node-1",
        "hostname": "worker-1",
        "eager_ms": eager_ms,
        "eager_p10_ms": eager_ms,
        "eager_p90_ms": eager_ms,
        "compiled_ms": compiled_ms,
        "compiled_p10_ms": compiled_ms,
        "compiled_p90_ms": compiled_ms,
        "speedup": eager_ms / compiled_ms if eager_ms and compiled_ms else None,
        "compile_s": 12.5,
        "eager_peak_mem_bytes": 3 * 2**30,
        "peak_mem_bytes": 5 * 2**30,
        "graph_count": 1,
        "graph_breaks": 0,
        "max_abs_err": 1e-6,
        "max_rel_err": 1e-7,
        "torch_version": "2.13.0",
        "python_version": "3.11.9",
        "started_at": "2025-01-02T03:04:05+00:00",
        "subprocess_s": 20.0,
        "error": None if status == "ok" else f"it ended as {status}",
    }
    result.update(extra)
    return result


@pytest.fixture(scope="session")
def make_result() -> Callable[..., dict]:
    """make_result(status="ok", eager_ms=10.0, compiled_ms=5.0, **extra): a task's result dict."""
    return _result


@pytest.fixture
def lock_dir(tmp_path, monkeypatch) -> Path:
    """A directory of the test's own for the node-wide core, spare-core and GPU locks
    (`workers.affinity.LOCK_DIR_ENV`): what other tests or sweeps on the machine hold does not
    reach the test."""
    from workers import affinity

    path = tmp_path / "cores"
    monkeypatch.setenv(affinity.LOCK_DIR_ENV, str(path))
    return path


@pytest.fixture
def gated_spawn() -> Iterator[tuple[Callable, list[subprocess.Popen]]]:
    """A `workers.ahead.Spawn` that starts a bare interpreter waiting at its gate (it reads the
    gate's pipe, then exits), and the processes it started, in order; any still running at the
    end of the test are killed."""
    import sys

    started: list[subprocess.Popen] = []
    code = "import os; os.read(int(os.environ['CO_GATE_FD']), 64)"

    def spawn(step, extra, fds) -> subprocess.Popen:
        env = {**os.environ, **extra}
        started.append(subprocess.Popen([sys.executable, "-c", code], env=env, pass_fds=fds))
        return started[-1]

    yield spawn, started
    for proc in started:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.fixture
def no_ray(monkeypatch):
    """Fail the test if anything starts or connects to Ray."""
    import ray

    def refuse(*args, **kwargs):
        raise AssertionError("ray.init was called")

    monkeypatch.setattr(ray, "init", refuse)
    yield
    assert not ray.is_initialized()


# --- S3 over HTTP: moto's server, reached through pyarrow's S3 filesystem like real S3 -----------


@dataclass(frozen=True)
class S3Bucket:
    endpoint: str
    """host:port of the S3 server."""
    name: str

    def uri(self, prefix: str = "") -> str:
        """s3://BUCKET/PREFIX with the endpoint in the query, as a user of a non-AWS store writes it."""
        return f"s3://{self.name}/{prefix}?endpoint_override={self.endpoint}&scheme=http"

    @property
    def env(self) -> dict[str, str]:
        """Environment for a process that reaches the server with plain s3:// URIs."""
        return {**S3_ENV, "AWS_ENDPOINT_URL": f"http://{self.endpoint}"}


S3_ENV = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_EC2_METADATA_DISABLED": "true",
}


@pytest.fixture(scope="session")
def s3_endpoint() -> Iterator[str]:
    """host:port of a moto S3 server on loopback, for the session.

    moto >= 5.2.2: 5.2.1 answers CompleteMultipartUpload with a root element pyarrow rejects."""
    pytest.importorskip("moto", minversion="5.2.2", reason="needs moto[server] >= 5.2.2 (the `test` extra)")
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # a line per request would bury failures
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    try:
        yield f"{host}:{port}"
    finally:
        server.stop()


@pytest.fixture
def s3_bucket(s3_endpoint, monkeypatch) -> S3Bucket:
    """A new empty bucket; this process's AWS settings point at the fake server's credentials."""
    import pyarrow.fs as pafs

    for var in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3"):
        monkeypatch.delenv(var, raising=False)
    for var, value in S3_ENV.items():
        monkeypatch.setenv(var, value)
    bucket = S3Bucket(s3_endpoint, f"sweeps-{uuid.uuid4().hex[:12]}")
    admin = pafs.S3FileSystem(
        access_key="testing",
        secret_key="testing",
        region="us-east-1",
        endpoint_override=s3_endpoint,
        scheme="http",
        allow_bucket_creation=True,
    )
    admin.create_dir(bucket.name)
    return bucket


# --- a disk of its own: a small tmpfs that fills up for real (ENOSPC) or turns read-only (EROFS) ---


@dataclass(frozen=True)
class SmallDisk:
    path: Path
    """Where it is mounted."""

    def free(self) -> int:
        return shutil.disk_usage(self.path).free

    def fill(self, leave: int = 0) -> Path:
        """Take the free space, all but about `leave` bytes, with a filler file (delete it to free
        the space again)."""
        filler = self.path / f"filler-{uuid.uuid4().hex[:8]}"
        with open(filler, "wb", buffering=0) as f:
            try:
                while (free := self.free()) > leave:
                    f.write(b"\0" * min(1 << 20, free - leave))
            except OSError as exc:
                if exc.errno != errno.ENOSPC:
                    raise
        return filler

    def read_only(self, on: bool = True) -> None:
        """Remount read-only (or writable again); retried while a file is open for writing."""
        for _ in range(100):
            done = subprocess.run(
                ["mount", "-o", f"remount,{'ro' if on else 'rw'}", str(self.path)], capture_output=True
            )
            if done.returncode == 0:
                return
            time.sleep(0.05)
        raise AssertionError(f"remount of {self.path} failed: {done.stderr.decode().strip()}")


@pytest.fixture
def small_disk(tmp_path) -> Iterator[Callable[[int], SmallDisk]]:
    """small_disk(size_bytes): a tmpfs of that size of its own, unmounted after the test. Mounting
    needs root (CAP_SYS_ADMIN): elsewhere the test is skipped, saying so."""
    mounted: list[Path] = []

    def mount(size: int) -> SmallDisk:
        path = tmp_path / f"disk{len(mounted)}"
        path.mkdir()
        try:
            done = subprocess.run(
                ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                capture_output=True,
                text=True,
            )
        except OSError as exc:
            pytest.skip(f"cannot mount a tmpfs to fill up: {exc}")
        if done.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs to fill up (needs root): {done.stderr.strip()}")
        mounted.append(path)
        return SmallDisk(path)

    yield mount
    for path in mounted:
        with contextlib.suppress(OSError):
            if subprocess.run(["umount", str(path)], capture_output=True).returncode != 0:
                subprocess.run(["umount", "-l", str(path)], capture_output=True)
