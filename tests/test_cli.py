"""The `orchestrate` command line, without a Ray cluster: validate, plan, refusals, report, presets."""

from __future__ import annotations

import re
from contextlib import closing
from pathlib import Path

import pytest

from orchestrator.cli import main
from orchestrator.fleet.inventory import local_classes
from orchestrator.spec.matrix import expand
from orchestrator.spec.sweep import load_spec
from store.rows import make_row
from store.sink import ResultSink

REPO = Path(__file__).resolve().parent.parent
SMOKE = REPO / "sweeps" / "smoke.yaml"

BAD = """\
name: bad
models: [hf:microsoft/resnet-50]
batch_sizes: [1, 0]
configs:
  default: {}
  fast: {mode: max-autotuned}
unknown_key: 1
"""


@pytest.fixture
def bad_file(tmp_path) -> Path:
    path = tmp_path / "bad.yaml"
    path.write_text(BAD)
    return path


def snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def job_count(stdout: str) -> int:
    match = re.search(r"^(\d+) jobs$", stdout.strip().splitlines()[-1])
    assert match, stdout[-500:]
    return int(match.group(1))


# --- validate -------------------------------------------------------------------------------------


def test_version_is_the_projects(capsys):
    import tomllib

    import orchestrator

    want = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    assert main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"orchestrate {want}" and orchestrator.__version__ == want
    assert (REPO / "LICENSE").read_text().split()[:3] == ["Apache", "License", "Version"]


def test_validate_ok(capsys):
    assert main(["validate", str(SMOKE)]) == 0
    out = capsys.readouterr().out
    assert "ok" in out
    spec = load_spec(SMOKE)
    assert f"{len(spec.models)} models x {len(spec.batch_sizes)} batch sizes" in out


def test_validate_bad_file_lists_every_problem(capsys, bad_file):
    assert main(["validate", str(bad_file)]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    err = captured.err
    assert "3 problem(s)" in err
    assert f"{bad_file}:3: batch size must be a positive integer" in err
    assert f"{bad_file}:6: config 'fast': unknown mode 'max-autotuned'" in err
    assert f"{bad_file}:7: unknown key 'unknown_key'" in err


def test_validate_missing_file(capsys, tmp_path):
    assert main(["validate", str(tmp_path / "nope.yaml")]) == 2
    assert "cannot read" in capsys.readouterr().err


# --- sweep refusals, all before Ray starts --------------------------------------------------------


def test_sweep_bad_file_creates_nothing(capsys, bad_file, tmp_path, no_ray):
    out = tmp_path / "out"
    assert main(["sweep", str(bad_file), "--out", str(out)]) == 2
    assert not out.exists()
    assert f"{bad_file}:6:" in capsys.readouterr().err


def test_sweep_bad_cpus_per_job(capsys, tmp_path, no_ray):
    out = tmp_path / "out"
    assert main(["sweep", str(SMOKE), "--out", str(out), "--cpus-per-job", "0"]) == 2
    assert "--cpus-per-job" in capsys.readouterr().err
    assert not out.exists()


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--precisions", "fp32,bf8"], "unknown policy 'bf8'"),
        (["--knobs", "freezing,turbo"], "unknown knob 'turbo'"),
        (["--eta", "1"], "--eta: must be at least 2, got 1"),
        (["--confirm-repeats", "1"], "--confirm-repeats: must be at least 2"),
        (["--max-compile-s", "0"], "--max-compile-s: must be a positive number, got '0'"),
        (["--max-memory-mb", "nan"], "--max-memory-mb: must be a positive number, got 'nan'"),
    ],
)
def test_tune_refuses_bad_flags_before_any_work(capsys, tmp_path, no_ray, flags, message):
    out = tmp_path / "out"
    assert main(["tune", str(SMOKE), "--out", str(out), *flags]) == 2
    assert message in capsys.readouterr().err
    assert not out.exists()


def test_nightly_refuses_bad_input_before_any_work(capsys, tmp_path, no_ray):
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("x")
    assert main(["nightly", str(SMOKE), "--history", str(not_a_dir / "runs")]) == 2
    assert "error:" in capsys.readouterr().err
    bad = tmp_path / "t.json"
    bad.write_text("{}")
    assert main(["nightly", str(SMOKE), "--history", str(tmp_path / "h"), "--thresholds", str(bad)]) == 2
    assert "missing keys" in capsys.readouterr().err
    assert main(["nightly", str(SMOKE), "--history", str(tmp_path / "h"), "--cpus-per-job", "0"]) == 2
    assert not (tmp_path / "h").exists()


def test_tune_refuses_an_output_dir_with_a_tune(capsys, tmp_path, no_ray):
    out = tmp_path / "out"
    out.mkdir()
    (out / "tune.json").write_text("{}")
    assert main(["tune", str(SMOKE), "--out", str(out)]) == 2
    assert "--resume" in capsys.readouterr().err


def test_sweep_refuses_an_output_dir_with_rows(capsys, tmp_path, no_ray, make_result):
    out = tmp_path / "out"
    job = expand(load_spec(SMOKE), {"cpu": "cpu"})[0]
    with closing(ResultSink(out)) as sink:
        sink.add(make_row(job, make_result(), run_id="earlier"))
    before = snapshot(out)
    assert any(name.endswith(".parquet") for name in before)

    assert main(["sweep", str(SMOKE), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "--resume" in err and "1 result rows" in err
    assert snapshot(out) == before  # same files, same bytes; no run.json
    assert not (out / "run.json").exists()


# --- plan -----------------------------------------------------------------------------------------


def test_plan_prints_every_job(capsys):
    spec = load_spec(SMOKE)
    # `hardware: auto` plans for this machine: cpu here, its GPU type on a GPU machine.
    jobs = expand(spec, {name: hw.device for name, hw in local_classes().items()})
    assert main(["plan", str(SMOKE)]) == 0
    out = capsys.readouterr().out
    assert job_count(out) == len(jobs) == len(expand(spec, {"cpu": "cpu"}))
    assert f"{len(jobs)} jobs" in out.splitlines()[0]
    for job in jobs:
        (line,) = [line for line in out.splitlines() if job.job_id in line]
        assert job.name in line and f"{job.timeout_s:g}s" in line


def test_plan_for_named_hardware_classes(capsys):
    n = len(expand(load_spec(SMOKE), {"cpu": "cpu"}))
    assert main(["plan", str(SMOKE), "--hardware", "A100"]) == 0
    one = capsys.readouterr().out
    assert job_count(one) == n
    assert main(["plan", str(SMOKE), "--hardware", "A100,T4"]) == 0
    two = capsys.readouterr().out
    assert job_count(two) == 2 * n
    assert "hardware: A100, T4" in two
    planned = expand(load_spec(SMOKE), {"A100": "cuda", "T4": "cuda"})
    assert all(j.job_id in two and j.name in two for j in planned)


def test_plan_only(capsys):
    jobs = expand(load_spec(SMOKE), {"cpu": "cpu"})
    bs1 = [j for j in jobs if j.batch_size == 1]
    assert 0 < len(bs1) < len(jobs)
    assert main(["plan", str(SMOKE), "--hardware", "cpu", "--only", "*/bs1/*"]) == 0
    out = capsys.readouterr().out
    assert job_count(out) == len(bs1)
    assert all(j.job_id in out for j in bs1)
    assert not any(j.job_id in out for j in jobs if j.batch_size != 1)


def test_plan_hardware_the_spec_does_not_name(capsys, tmp_path):
    path = tmp_path / "a100.yaml"
    path.write_text(SMOKE.read_text().replace("hardware: auto", "hardware: [A100]"))
    assert main(["plan", str(path), "--hardware", "T4"]) == 2
    assert "A100" in capsys.readouterr().err


def test_plan_bad_file(capsys, bad_file):
    assert main(["plan", str(bad_file)]) == 2
    assert f"{bad_file}:7:" in capsys.readouterr().err


# --- report and presets ---------------------------------------------------------------------------


@pytest.mark.parametrize("command", ["report", "presets"])
def test_report_and_presets_on_an_empty_dir(capsys, tmp_path, command):
    assert main([command, str(tmp_path)]) == 2
    assert "no result rows" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_report_and_presets_on_results(capsys, tmp_path, table_jobs, make_result):
    with closing(ResultSink(tmp_path)) as sink:
        sink.add(
            make_row(
                table_jobs["cpu/mlp/bs1/fp32/default"], make_result(eager_ms=9.0, compiled_ms=3.0), run_id="r"
            )
        )
        sink.add(
            make_row(table_jobs["cpu/mlp/bs1/fp32/ro"], make_result("oom", compiled_ms=None), run_id="r")
        )
    assert main(["report", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "[cpu]" in out and "3.00x" in out and "oom" in out
    assert (tmp_path / "report.md").exists()
    assert main(["presets", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert (
        "cpu/mlp/bs1/fp32: default (3.00x vs eager, 1.00x vs default; vs stock torch.compile (default) 1.00x"
        in out
    )
    assert (tmp_path / "presets.json").exists()


# --- help -----------------------------------------------------------------------------------------

FLAGS = {
    "validate": ["sweep"],
    "plan": ["sweep", "--hardware", "--cpus-per-job", "--only"],
    "sweep": [
        "sweep",
        "--out",
        "--address",
        "--resume",
        "--only",
        "--cpus-per-job",
        "--scratch",
        "--lock-clocks",
    ],
    "report": ["out", "--baseline", "--md", "--json", "--fail-on", "--thresholds"],
    "nightly": ["sweep", "--history", "--address", "--thresholds", "--only"],
    "presets": ["out", "--max-compile-s", "--max-memory-mb"],
    "tune": [
        "sweep",
        "--out",
        "--resume",
        "--precisions",
        "--knobs",
        "--eta",
        "--confirm-repeats",
        "--max-compile-s",
        "--max-memory-mb",
        "--only",
    ],
}


@pytest.mark.parametrize("command", list(FLAGS))
def test_subcommand_help(capsys, command):
    assert main([command, "--help"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"usage: orchestrate {command}")
    for flag in [*FLAGS[command], "--help"]:
        assert flag in out, flag


def test_top_level_help_lists_commands(capsys):
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    for command in FLAGS:
        assert command in out


def test_no_command_is_a_usage_error(capsys):
    assert main([]) == 2
    err = capsys.readouterr().err
    assert err == "error: the following arguments are required: COMMAND (see `orchestrate --help`)\n"


def test_report_into_a_closed_pipe_still_writes_the_file_and_exits_quietly(tmp_path, table_jobs, make_result):
    import dataclasses
    import subprocess
    import sys

    from compiler.job import ModelSpec

    base = table_jobs["cpu/mlp/bs1/fp32/default"]
    with closing(ResultSink(tmp_path)) as sink:  # a report far larger than a pipe's 64 KiB buffer
        for i in range(1500):
            job = dataclasses.replace(base, model=ModelSpec(id=f"python:pkg.mod:m{i}", name=f"model-{i:04d}"))
            sink.add(make_row(job, make_result(), run_id="r"))
    # `orchestrate report OUT | head -c 1`: the reader closes the pipe after one byte.
    proc = subprocess.run(
        f"{sys.executable} -m orchestrator report {tmp_path} | head -c 1",
        shell=True,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert "Traceback" not in proc.stderr and "BrokenPipe" not in proc.stderr, proc.stderr
    assert (tmp_path / "report.md").exists()


def test_the_resume_command_keeps_the_flags_that_choose_the_work():
    """A tune stopped by --deadline printed `orchestrate tune SWEEP --out OUT --resume`: without its
    --only and --precisions, that resume would run other work. It repeats the command's own flags,
    without --deadline, with --out and one --resume."""
    from orchestrator.cli import build_parser
    from orchestrator.commands.common import resume_command

    argv = ["tune", "s.yaml", "--only", "*/vit/*", "--precisions", "fp32,bf16", "--deadline=20m", "--resume"]
    args = build_parser().parse_args(argv)
    args.argv = argv
    assert resume_command(args, "runs/s-tune") == (
        "orchestrate tune s.yaml --only '*/vit/*' --precisions fp32,bf16 --out runs/s-tune --resume"
    )
    argv = ["sweep", "s.yaml", "--deadline", "90", "--out", "o", "--cpus-per-job", "2"]
    args = build_parser().parse_args(argv)
    args.argv = argv
    assert resume_command(args, "o") == "orchestrate sweep s.yaml --out o --cpus-per-job 2 --resume"


def test_a_nightly_that_left_harness_errors_resumes_its_run_as_a_sweep(capsys):
    """A nightly whose run left `harness_error` jobs exits 3 and prints the sweep that finishes
    that run (its own flags but --history and --thresholds, into the run's folder) and the
    comparison to make again; a run that finished exits 0 and prints nothing more."""
    from types import SimpleNamespace

    from orchestrator.cli import build_parser
    from orchestrator.commands.common import EXIT_UNFINISHED, unfinished_exit
    from orchestrator.commands.nightly import _unfinished
    from orchestrator.fleet.summary import SweepSummary

    argv = [
        "nightly",
        "s.yaml",
        "--history",
        "h",
        "--only",
        "*/bs1/*",
        "--thresholds=t.json",
        "--scratch",
        "/s",
    ]
    args = build_parser().parse_args(argv)
    args.argv = argv
    summary = SweepSummary("r", None, 2, 0, {"ok": 1, "harness_error": 1}, 1.0, 1.0, {"cpu": 1})
    result = SimpleNamespace(run="h/2026-11-29T010000Z", summary=summary, comparison=object())
    assert unfinished_exit(_unfinished(args, result, "h")) == EXIT_UNFINISHED == 3
    err = capsys.readouterr().err
    assert err.endswith(
        "Run it again with:\n  orchestrate sweep s.yaml --only '*/bs1/*' --scratch /s --out h/2026-11-29T010000Z "
        "--resume\nthen compare it again:\n  orchestrate report h/2026-11-29T010000Z --history h\n"
    ), err
    assert unfinished_exit(None) == 0 and capsys.readouterr().err == ""
