"""The processes an export job starts on its behalf (`workers.bench.serving_stock.helper_process`):
a package build or the stock user keeps the job's thread caps and cores; the cold prepare, which
stands in for a serving process a user starts, leaves both behind."""

from __future__ import annotations

from compiler.config import CompileConfig
from tests.benchmark_scripts import load_benchmark
from workers.affinity import AFFINITY_ENV, AHEAD_AFFINITY_ENV, UNPIN_ENV
from workers.bench import PARENT_PID_ENV
from workers.bench.run import JobRun
from workers.bench.serving_stock import PLAIN_DROPS, helper_process

JOB = {"model_spec": {"id": "python:workers.toy:mlp", "name": "mlp"}, "batch_size": 2}


def test_a_plain_helper_has_neither_the_jobs_thread_caps_nor_its_cores(tmp_path, monkeypatch):
    import json
    import os

    run = JobRun.for_preset("t", "cpu", JOB, CompileConfig(name="default"), "fp32")
    for name in (AFFINITY_ENV, AHEAD_AFFINITY_ENV, *PLAIN_DROPS):
        monkeypatch.setenv(name, "1")
    kept, job_file = helper_process(run, tmp_path)
    assert all(kept[name] == "1" for name in (AFFINITY_ENV, *PLAIN_DROPS)), kept
    assert AHEAD_AFFINITY_ENV not in kept and kept[PARENT_PID_ENV] == str(os.getpid())
    assert json.loads(job_file.read_text())["model"]["name"] == "mlp"
    assert UNPIN_ENV not in kept
    plain, _ = helper_process(run, tmp_path, plain=True)
    assert not {AFFINITY_ENV, AHEAD_AFFINITY_ENV, *PLAIN_DROPS} & set(plain), sorted(plain)
    assert plain[UNPIN_ENV] == "1"  # it leaves the pinning it inherits (pin_from_environment)
    from workers.runner import job_environment

    caps = {k for k, v in job_environment(tmp_path, 7, base={}).items() if v == "7"}
    assert caps == set(PLAIN_DROPS), caps  # every thread cap a job's environment sets


def test_the_stock_user_runs_under_torchs_runtime_defaults_not_the_presets(tmp_path):
    """The stock user under traffic is torch's defaults: a job whose config turns cuDNN off (or
    on its benchmark) still times its stock user with cuDNN on, as a stock user runs."""
    import json

    from compiler import runtime
    from workers.bench.serving_stock import serve_stock

    before = runtime.current()
    try:
        off = CompileConfig(name="off", runtime={"cudnn_enabled": False, "cudnn_benchmark": True})
        run = JobRun.for_preset("t", "cpu", JOB, off, "fp32")
        run.imports()
        serve_stock(run, {"mode": "default", "dtype": "fp32", "profile": {"batch": {"min": 1, "max": 2}}})
        got = run.result["serving_stock"]
        assert got["runtime"] == {"cudnn_benchmark": False, "cudnn_enabled": True}, got
        # the job's own side (what build set) stays recorded as the config's
        assert json.loads(run.result["runtime"]) == {"cudnn_benchmark": True, "cudnn_enabled": False}
        assert set(got["ms"]) == {"1", "2"} and got["weighted_ms"] > 0, got
    finally:
        runtime.restore(before)


def test_the_traffic_benchmarks_oracle_compiles_with_the_presets_own_config(tmp_path):
    """benchmarks/serving_traffic.py's oracle (an exact preset per batch size) is compiled and run
    with the config of the export's preset it is held against, read from the verified serving.json:
    its mode, freezing and runtime settings, whatever `--mode` says; without an export, or for
    another model, `--mode` under torch's runtime defaults."""
    import argparse

    from tests.tune.test_export_apply import edit_presets, write_export

    oracle = load_benchmark("serving_oracle")

    def frozen_off(presets):
        compile_ = presets["presets"][0]["compile"]
        compile_.update(mode="max-autotune-no-cudagraphs", freezing=True, runtime={"cudnn_enabled": False})

    dest = edit_presets(write_export(tmp_path / "export"), frozen_off)
    config = oracle.compile_config(argparse.Namespace(mode="reduce-overhead", export=str(dest), name="mlp"))
    assert config.runtime == {"cudnn_enabled": False} and config.freezing, config
    assert config.mode == "max-autotune-no-cudagraphs" and config.name == "default", config
    plain = oracle.compile_config(argparse.Namespace(mode="reduce-overhead", export=None, name="mlp"))
    assert plain.mode == "reduce-overhead" and plain.runtime == {} and not plain.freezing, plain
    other = oracle.compile_config(argparse.Namespace(mode="default", export=str(dest), name="vit"))
    assert other.mode is None and other.runtime == {}, other
    assert oracle.export_runtime(argparse.Namespace(export=str(dest), name="vit")) == {}


def test_the_traffic_benchmark_serves_and_holds_the_oracle_in_the_presets_precision(tmp_path):
    """Under an accuracy budget a preset may run in another precision than its cell's dtype (tf32
    for an fp32 model under the stock budget): the traffic benchmark runs its served plan and its
    oracle in that precision, and refuses a --dtype that names another before any process starts."""
    import argparse

    import pytest

    from tests.tune.test_export_apply import edit_presets, write_export

    traffic = load_benchmark("serving_traffic")

    def tf32(presets):
        presets["presets"][0]["precision"] = "tf32"

    dest = edit_presets(write_export(tmp_path / "export"), tf32)
    assert traffic.export_precision(argparse.Namespace(export=str(dest), name="mlp")) == "tf32"
    assert (
        traffic.export_precision(argparse.Namespace(export=str(write_export(tmp_path / "e2")), name="mlp"))
        == "fp32"
    )
    assert traffic.export_precision(argparse.Namespace(export=None, name="mlp")) is None
    with pytest.raises(SystemExit, match="runs in tf32, .*pass --dtype tf32 or leave it out"):
        traffic.main(["--export", str(dest), "--name", "mlp", "--dtype", "fp32"])


def test_what_a_cold_prepares_own_children_did_is_its_own_work_not_another_processes():
    """A cold prepare's other share (`compiler.host_state.HostShare(children=True)`) counts the CPU
    time of children it waited for as its own (on the CPU, the compiler a package's first load
    runs), so a serving process is not called doubted for its own work."""
    import subprocess
    import sys

    from compiler import host_state

    spin = "import time\nwhile time.process_time() < 0.3: pass"
    alone, with_children, share = (
        host_state.own_cpu_s(),
        host_state.own_cpu_s(children=True),
        host_state.HostShare(children=True),
    )
    subprocess.run([sys.executable, "-c", spin], check=True)
    grew = host_state.own_cpu_s(children=True) - with_children
    assert grew - (host_state.own_cpu_s() - alone) >= 0.3, grew  # the child's 0.3 s of CPU, its own
    got = share.since()
    assert got is None or 0.0 <= got <= 1.0, got
