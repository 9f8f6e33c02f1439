"""Every benchmark that runs on a CPU runs here in a small mode, so a benchmark the code outgrew
fails a test (`benchmarks/dispatch.py` once failed on main: its synthetic rows broke the strict
reader's rules, and nothing ran it). What a benchmark measures is checked by its own targets when
it runs at full size, not here: these assert that it runs to its table, not how fast.

Each small mode goes through the script's own code path with the least work: the toy MLP (or a
model that ends a tune at rung 0), one process where the full run takes several, a few timed
calls. `benchmarks/transfer/` holds no benchmark: pack.py and unpack.py move a sweep's output
between hosts. `two_class_cluster.py` is two_class.py's cluster, run by its test."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from reports.regression import VERDICTS

pytestmark = pytest.mark.bench  # a tier of its own, after the default one (docs/testing.md)

ROOT = Path(__file__).resolve().parents[1]
MEASURE = "measure: {warmup: 1, iterations: 3, rounds: 1, flops: false}"


def bench(script: str, *args: str, timeout: float = 300) -> str:
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / script), *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    # exit 1 only for a target missed (a loaded machine), never for an error
    assert done.returncode in (0, 1), done.stderr[-3000:]
    return done.stdout


def table_row(out: str, first: str) -> list[str]:
    """The cells of the one Markdown row whose first cell is `first`."""
    [row] = [line for line in out.splitlines() if line.startswith(f"| {first} |")]
    return [cell.strip() for cell in row.strip().strip("|").split("|")]


def interval(text: str) -> tuple[float, float, float]:
    """'1.234 [0.9, 1.5]...' -> (1.234, 0.9, 1.5)."""
    estimate, rest = text.split(" [", 1)
    low, high = rest.split("]", 1)[0].split(", ")
    return float(estimate), float(low), float(high)


def test_ledger_rate_prints_its_table():
    out = bench("ledger_rate.py", "--commits", "20")
    assert "| with ledger |" in out and "| without ledger |" in out


@pytest.mark.integration
def test_dispatch_prints_its_rate():
    out = bench("dispatch.py", "--jobs", "20")
    assert "targets >= 200 jobs/s and < 1 GiB:" in out
    [row] = [line.split() for line in out.splitlines() if line.split()[:1] == ["20"]]
    assert float(row[3]) > 0  # jobs/s


@pytest.mark.integration
def test_overhead_prints_its_percentiles():
    """Two jobs, one after the other (a job takes every core): a median and a p90 of two."""
    out = bench("overhead.py", "--jobs", "2")
    assert "2 jobs on {" in out and "target median overhead <= 1 s:" in out
    [row] = [line.split() for line in out.splitlines() if line.startswith("orchestration overhead")]
    assert float(row[-3].rstrip("s")) >= 0  # the median, in seconds


# --- an export's presets: bundle.py and runtime_apply.py -----------------------------------------

EXPORT_SWEEP = f"""\
name: bench-export
models:
  - {{id: "python:workers.toy:mlp", name: mlp}}
batch_sizes: [2]
configs:
  cudnn: {{runtime: {{cudnn_benchmark: true}}}}  # a runtime setting (moves nothing on a CPU)
{MEASURE}
timeout_s: 300
"""
CELL = "mlp/bs2/fp32/cudnn"


@pytest.fixture(scope="module")
def export_dir(tmp_path_factory) -> Path:
    """`orchestrate export` of a real sweep's one preset, the MLP under a config that sets a
    runtime setting: its bundle and its AOTInductor package, for both benchmarks below."""
    from orchestrator.cli import main

    root = tmp_path_factory.mktemp("bench-export")
    (root / "sweep.yaml").write_text(EXPORT_SWEEP)
    out, dest = root / "out", root / "export"
    assert main(["sweep", str(root / "sweep.yaml"), "--out", str(out), "--cpus-per-job", "1"]) == 0
    assert main(["presets", str(out)]) == 0
    assert main(["export", str(out), "--hardware", "cpu", "--dest", str(dest), "--cpus", "1"]) == 0
    return dest


@pytest.mark.integration
def test_bundle_prints_cold_bundle_and_package_first_calls(export_dir):
    out = bench("bundle.py", str(export_dir), "--iterations", "20")
    assert f"1 presets with bundles in {export_dir} (cpu)" in out
    cell, cold, bundle, package, by_bundle, by_package, preset_ms, package_ms, ratio = table_row(out, CELL)
    # a process that failed leaves its time out: nan, and nan > 0 is False
    assert float(cold) > 0 and float(bundle) > 0 and float(package) > 0, (cold, bundle, package)
    assert by_bundle.endswith("x") and by_package.endswith("x")
    assert float(preset_ms) > 0 and float(package_ms) > 0  # both timed in the package's process
    estimate, low, high = interval(ratio)
    assert low <= estimate <= high


@pytest.mark.integration
def test_runtime_apply_prints_tuned_against_stock(export_dir):
    out = bench("runtime_apply.py", str(export_dir), "--repeats", "1", "--iterations", "20")
    cell, runtime, tuned_ms, stock_ms, ratio, peaks, first = table_row(out, CELL)
    assert json.loads(runtime) == {"cudnn_benchmark": True}
    assert float(tuned_ms) > 0 and float(stock_ms) > 0
    assert ratio.endswith(" over 1 processes each")
    estimate, low, high = interval(ratio)
    assert low <= estimate <= high
    assert all(float(s) > 0 for s in first.split(" / "))  # seconds to each side's first output


@pytest.mark.integration
def test_dynamo_cache_prints_its_four_modes():
    out = bench("dynamo_cache.py", "--small", "--models", "mlp", "--batch-size", "2")
    cells = table_row(out, "mlp")
    cold, bundle, cold_dynamo, dynamo = cells[1:5]
    assert float(cold) > 0 and float(bundle) > 0 and float(cold_dynamo) > 0, cells
    # the canary's column: a time, or what the process loaded from Dynamo's entry raised
    assert dynamo and cells[-1].count(",") >= 2, cells


# --- noise.py, and regression_aa.py on what it saved ---------------------------------------------


@pytest.fixture(scope="module")
def noise(tmp_path_factory) -> tuple[str, Path]:
    """noise.py's small mode, two sweeps of one process each of the toy MLP: what it printed, and
    the rows it saved."""
    saved = tmp_path_factory.mktemp("noise") / "noise.json"
    small = ["--small", "--device", "cpu", "--cells", "mlp", "--sweeps", "2", "--repeats", "1"]
    brief = ["--warmup", "1", "--iterations", "5", "--rounds", "1", "--threads", "1"]
    return bench("noise.py", *small, *brief, "--save", str(saved)), saved


@pytest.mark.integration
def test_noise_prints_each_sweep_and_the_spread(noise):
    out, saved = noise
    assert "mlp/bs1/fp32/default: 2 sweeps x 1 processes on cpu" in out
    for sweep in ("1", "2"):
        row = table_row(out, sweep)
        assert row[1] == "ok" and interval(row[4])[0] > 0, row  # the speedup
    spread = table_row(out, "speedup")
    assert spread[1].endswith("%") and spread[3].endswith(" of 2")
    assert "Target (speedup spread <= 5%, or every sweep's interval contains the median):" in out
    assert len(json.loads(saved.read_text())["cells"]["mlp/bs1/fp32/default"]) == 2


@pytest.mark.integration
def test_regression_aa_compares_the_saved_sweeps(noise):
    _, saved = noise
    out = bench("regression_aa.py", str(saved))
    header = table_row(out, "cell")
    rows = [line for line in out.splitlines() if line.startswith("| mlp/bs1/fp32/default |")]
    assert len(rows) == 2  # one pair of sweeps, as it is and slowed
    for row, slowdown in zip(rows, ("x1", "x1.1"), strict=True):
        cells = table_row(row, "mlp/bs1/fp32/default")
        assert len(cells) == len(header) and cells[1:3] == ["0 vs 1", slowdown], (header, cells)
        assert cells[3] in VERDICTS and cells[4] in VERDICTS, cells  # the cell's, latency's
    assert "slowdown x1: {" in out and "slowdown x1.1: {" in out


# --- the orchestration benchmarks: real Ray, real tunes, a multi-node cluster ---------------------


@pytest.mark.integration
def test_scaling_prints_both_runs_and_the_efficiency(tmp_path):
    sweep = tmp_path / "scaling.yaml"
    sweep.write_text(
        "name: scaling-small\nmodels:\n  - {id: python:workers.toy:mlp, name: mlp}\n"
        f"batch_sizes: [1, 2]\nconfigs:\n  dynamo: {{backend: eager}}\n{MEASURE}\n"
    )
    out = bench("scaling.py", "run", str(sweep), "--out", str(tmp_path / "out"), "--cpu-slots", "2")
    assert table_row(out, "serial")[:4] == ["serial", "1", "2", "2"]  # slots, jobs, ok
    assert table_row(out, "parallel")[:4] == ["parallel", "2", "2", "2"]
    [line] = [x for x in out.splitlines() if x.startswith("- scaling efficiency = ")]
    assert float(line.split("**")[1]) > 0
    assert "- targets: met" in out or "- targets: MISSED" in out


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.integration
def test_cache_pair_serial_shares_the_cold_tunes_work_with_the_warm_one(tmp_path):
    """Three tunes one after another against one Redis, each of one stock config: its job compiles
    (sharing its FX graph with the Redis), and a compile-time budget no compile meets ends the tune
    at rung 0, with no candidate to confirm (three more processes)."""
    sweep = tmp_path / "tune.yaml"
    sweep.write_text(
        "name: cache-pair-small\nmodels:\n  - {id: python:workers.toy:mlp, name: mlp}\n"
        f"batch_sizes: [2]\nconfigs:\n  default: {{}}\n{MEASURE}\ntimeout_s: 120\n"
    )
    out = tmp_path / "out"
    flags = ["--cpu", "--out", str(out), "--deadline", "240", "--port", str(_free_port())]
    # cudnn_benchmark: a GPU knob, so no knob job on a CPU
    tune = [str(sweep), "--bases", "", "--knobs", "cudnn_benchmark", "--max-compile-s", "0.001"]
    printed = bench("cache_pair.py", "serial", *flags, "--", *tune)
    result = json.loads(printed[printed.index("\n{") :])
    tunes = result["tunes"]
    assert list(tunes) == ["shared-cold", "shared-warm", "nocache"]
    assert all(t["rc"] == 0 and not t["interrupted"] and t["wall_s"] > 0 for t in tunes.values()), tunes
    assert tunes["shared-cold"]["redis_at_start"]["dbsize"] == 0
    kept = tunes["shared-warm"]["redis_at_start"]  # what the cold tune left in the server
    assert kept["dbsize"] >= 1 and all(k.startswith("co:cpu") for k in kept["key_prefixes"]), kept
    assert result["redis_at_end"]["dbsize"] == tunes["nocache"]["redis_at_start"]["dbsize"]
    assert json.loads((out / "serial.json").read_text()) == result and (out / "serial.done").is_file()


@pytest.mark.integration
def test_two_class_rehearsal_places_each_class_on_its_nodes(tmp_path):
    """two_class.py with --fake-gpus: a head and GPU nodes that claim GPUs this machine lacks, so
    every job fails at once as a row (no CUDA): the cluster, the placement per class and the three
    nightlies run for real; the lost node's retry, the presets and the export need GPUs."""
    sweep = (
        "name: NAME\nmodels:\n  - {id: python:workers.toy:mlp, name: mlp}\nbatch_sizes: [1]\n"
        f"configs:\n  default: {{}}\nhardware: auto\n{MEASURE}\n"
    )
    (tmp_path / "sweep.yaml").write_text(sweep.replace("NAME", "tc-small"))
    (tmp_path / "nightly.yaml").write_text(sweep.replace("NAME", "tc-nightly"))
    out = tmp_path / "out"
    files = ["--sweep", str(tmp_path / "sweep.yaml"), "--nightly-sweep", str(tmp_path / "nightly.yaml")]
    printed = bench("two_class.py", "--out", str(out), "--fake-gpus", *files, "--cpus", "1", timeout=400)
    assert "# Two GPU classes on one host: H100 and A100" in printed
    for check in ("placement", "rows_per_class", "one_row_per_job"):
        assert table_row(printed, check)[1] == "yes", table_row(printed, check)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["sweep_rc"] == summary["presets_rc"] == 0 and summary["nightly_rc"] == [0, 0, 0]
    assert set(summary["checks"]["rows_per_class"]["statuses"]) == {"H100", "A100"}
    assert len(summary["checks"]["nightly_flags_one_class"]["runs"]) == 3


def test_bucket_prepare_times_each_buckets_first_run_in_a_fresh_process():
    out = bench("bucket_prepare.py", "--small", timeout=600)
    row = table_row(out, "served")
    assert len(row) == 8 and all(float(cell) >= 0 for cell in row[1:]), out


def test_bucket_prepare_refuses_a_packages_folder_others_can_write(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)  # anyone could put a package there for its processes to run
    done = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "bucket_prepare.py"),
            "--small",
            "--packages",
            str(shared),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode != 0 and "| served |" not in done.stdout, done.stdout
    assert "not this user's alone" in done.stderr and "chmod go-w" in done.stderr, done.stderr
    assert list(shared.iterdir()) == [], "nothing was built there"


def test_serving_traffic_replays_the_trace_and_the_served_plan_never_compiles_after_preparing(tmp_path):
    save, summary = tmp_path / "trace.json", tmp_path / "summary.json"
    out = bench(
        "serving_traffic.py",
        "--small",
        "--prepare-repeats",
        "2",
        "--save",
        str(save),
        "--summary",
        str(summary),
        timeout=600,
    )
    served, oracle, stock = (table_row(out, side) for side in ("served", "oracle", "stock:default"))
    assert served[2] == "0" and oracle[2] == "0", out  # prepared before the first request
    assert int(stock[2]) >= 1, out  # the stock user compiles as the sizes arrive
    assert float(stock[4]) > float(served[4]), out  # and its stalls are the compiles
    assert "served plan: buckets" in out, out  # the MLP's rows are independent: padding passes
    # prepared in two fresh processes, the first of which replayed the trace: the slowest counts
    runs = json.loads(save.read_text())["sides"]["served"]["prepare_runs"]
    assert len(runs) == 2 and all(r["prepare_s"] > 0 for r in runs), runs
    assert "served prepare in 2 fresh processes" in out, out
    # with the share of its cores other processes took meanwhile (this machine may be busy)
    assert all(r["other_share"] is None or 0 <= r["other_share"] <= 1 for r in runs), runs
    entry = json.loads(summary.read_text())[0]["models"][0]
    assert entry["prepare_s_runs"] == [r["prepare_s"] for r in runs], entry
    assert entry["prepare_other_shares"] == [r["other_share"] for r in runs], entry
    assert entry["prepare_s"] == max(entry["prepare_s_runs"]), entry
    slowest = max(runs, key=lambda r: r["prepare_s"])  # its steps are the slowest process's
    assert entry.get("prepare_steps") == slowest.get("steps"), (entry, slowest)
    assert entry.get("bucket_prepare_s") == slowest.get("bucket_prepare_s"), (entry, slowest)
    assert abs(float(served[1]) - entry["prepare_s"]) < 0.006, (served, entry)  # the table shows it too


SERVING_SWEEP = f"""\
name: served-branching
models: [{{id: "python:workers.toy:batch_branching", name: branching}}]
batch_sizes: [4]
dtypes: [fp32]
serving: {{batch: {{min: 1, max: 5}}}}
configs: {{plain: {{}}}}  # not --mode's name: the oracle compiles the export's config
{MEASURE}
"""


def test_the_serving_results_flow_runs_on_the_cpu_sweep_export_then_traffic_against_the_export(tmp_path):
    """What docs/results/serving-h200.md's commands do, on the CPU at batch 1..5: a sweep with a
    serving profile, its export (a package per bucket), then the traffic benchmark with --export:
    the served plan is compile_tuned's on the export, in the precision of its preset (no --dtype
    given), and the oracle of packages reuses the export's bucket packages for their sizes.

    The model branches on its batch size (`workers.toy.batch_branching`, as DETR's graph
    specializes it), so the buckets plan is the only one it can take over 1..5 and the export's
    choice does not hang on two plans' timings, which another process on the cores can sway (an
    mlp's packages once timed 77x slower than its dynamic graph while the other test worker ran)."""

    def orchestrate(*args: str) -> str:
        done = subprocess.run(
            [sys.executable, "-m", "orchestrator", *args],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=900,
        )
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
        return done.stdout

    sweep, out, dest, save = tmp_path / "s.yaml", tmp_path / "out", tmp_path / "export", tmp_path / "t.json"
    sweep.write_text(SERVING_SWEEP)
    orchestrate("sweep", str(sweep), "--out", str(out))
    line = orchestrate("export", str(out), "--hardware", "cpu", "--dest", str(dest))
    assert "serves batch 1..5, traffic uniform on buckets" in line, line
    served = json.loads((dest / "serving.json").read_text())["presets"][0]["serving"]
    assert "ConstraintViolationError" in served["plans"]["dynamic"]["error"], served["plans"]["dynamic"]
    got = bench(
        "serving_traffic.py",
        "python:workers.toy:batch_branching",
        "--name",
        "branching",
        "--export",
        str(dest),
        *("--min", "1", "--max", "5", "--requests", "40"),  # --small's, over the export's range
        "--oracle",
        "packages",
        "--save",
        str(save),
        "--summary",
        str(tmp_path / "summary.json"),
        timeout=900,
    )
    assert "fp32 on cpu" in got and table_row(got, "served")[2] == "0", got
    (entry,) = json.loads((tmp_path / "summary.json").read_text())[0]["models"]
    assert entry["oracle"] == "packages: an AOTInductor package of plain per batch size", entry["oracle"]
    assert f"served plan: buckets {served['buckets']}" in got, got
    sides = json.loads(save.read_text())["sides"]
    assert sides["served"]["applied"]["serving"]["plan_from"] == "export", sides["served"]["applied"]
    build = sides["oracle"]["package_build"]
    assert build["reused_from_export"] == served["buckets"] and build["buckets"] == 5 - len(
        served["buckets"]
    ), build


def test_serving_traffic_oracle_of_packages_serves_every_size_from_its_own_package(tmp_path):
    save = tmp_path / "trace.json"
    out = bench("serving_traffic.py", "--small", "--oracle", "packages", "--save", str(save), timeout=900)
    assert table_row(out, "oracle")[2] == "0", out  # nothing compiled once the packages were loaded
    oracle = json.loads(save.read_text())["sides"]["oracle"]
    assert oracle["process"]["threads"] >= 1 and oracle["process"]["cpus"], oracle["process"]
    assert oracle["package_build"]["buckets"] == 4, oracle["package_build"]  # sizes 1..4, a package each
    serving = oracle["applied"]["serving"]
    assert serving["buckets"] == [1, 2, 3, 4] and serving["prepare_graphs"] == 0, serving
