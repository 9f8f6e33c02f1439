"""Capability-aware planning without a GPU: the table of known classes, the rules that rule a cell
out (or only note what it runs without), `orchestrate plan` over [A100, V100, T4], the tuner's
space, a preset check for `compile_tuned`, and unsupported rows in reports."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest

from compiler.capabilities import (
    MIN_SMS_GEMM_TEMPLATES,
    _arch_in_build,
    cell_support,
    check_preset_supported,
    from_device,
    known,
)
from compiler.config import CompileConfig
from compiler.job import ModelSpec
from compiler.known_gpus import GPUS, TABLE_VERSION
from orchestrator.cli import main
from orchestrator.fleet.support import triage
from orchestrator.spec.matrix import expand
from orchestrator.spec.sweep import load_spec
from orchestrator.tune.space import candidates
from store.rows import failure_row

REPO = Path(__file__).resolve().parent.parent
DEFAULT = CompileConfig("default")
MAX_AUTOTUNE = CompileConfig("max-autotune", mode="max-autotune")
GEMM_TRITON = CompileConfig(
    "gemm-triton", options={"max_autotune": True, "max_autotune_gemm_backends": "TRITON"}
)

SWEEP = """\
name: mixed
models:
  - id: python:workers.toy:mlp
    name: mlp
batch_sizes: [1]
dtypes: [fp32, bf16]
configs:
  default: {}
  max-autotune: {mode: max-autotune}
  gemm-triton: {options: {max_autotune: true, max_autotune_gemm_backends: TRITON}}
hardware: [A100, V100, T4]
"""


def test_table_names_the_issues_classes_and_follows_torchs_rules():
    for name in ("A100", "V100", "T4", "H100", "H200", "L4", "A10G", "cpu"):
        assert known(name) is not None, name
    assert known("RTX-9090") is None
    assert TABLE_VERSION >= 1 and all(len(row) == 3 for row in GPUS.values())
    a100, v100, t4, h100, l4 = (known(n) for n in ("A100", "V100", "T4", "H100", "L4"))
    assert (a100.sm, v100.sm, t4.sm, h100.sm, l4.sm) == ("sm80", "sm70", "sm75", "sm90", "sm89")
    assert a100.bf16 and not v100.bf16 and not t4.bf16
    assert h100.fp8 and l4.fp8 and not a100.fp8
    # is_big_gpu: 68 SMs; T4 (40) and L4 (58) are below it, V100 (80) is not.
    assert MIN_SMS_GEMM_TEMPLATES == 68
    assert (t4.gemm_templates, l4.gemm_templates, v100.gemm_templates) == (False, False, True)
    assert known("cpu").device == "cpu" and known("cpu").gemm_templates is None


def test_min_sms_matches_the_installed_torch():
    source = Path(__import__("torch._inductor.utils").__file__).parent / "_inductor" / "utils.py"
    text = source.read_text()
    body = text[text.index("def is_big_gpu") :][:1500]
    assert f"else {MIN_SMS_GEMM_TEMPLATES}" in body, "torch changed is_big_gpu's SM threshold"


def test_hard_reasons_and_notes():
    v100, t4, a100, cpu = known("V100"), known("T4"), known("A100"), known("cpu")
    reason, _ = cell_support(v100, "bf16", DEFAULT)
    assert reason.startswith("V100 (sm70) has no native bf16")
    assert cell_support(a100, "bf16", DEFAULT) == (None, [])
    assert "fp8 needs sm89+" in cell_support(a100, "fp8", DEFAULT)[0]
    assert cell_support(known("H100"), "fp8", DEFAULT)[0] is None
    # max-autotune on a small GPU still runs (a note); leaving ATen out leaves it no GEMM kernel.
    reason, notes = cell_support(t4, "fp32", MAX_AUTOTUNE)
    assert reason is None and any("T4 has 40 SMs" in n and "is_big_gpu needs >= 68" in n for n in notes)
    reason, _ = cell_support(t4, "fp32", GEMM_TRITON)
    assert "T4 has 40 SMs" in reason and "max_autotune_gemm_backends=TRITON" in reason
    conv = CompileConfig("c", options={"max_autotune": True, "max_autotune_conv_backends": "TRITON"})
    assert "max_autotune_conv_backends" in cell_support(t4, "fp32", conv)[0]
    assert cell_support(v100, "fp32", GEMM_TRITON)[0] is None  # 80 SMs: templates apply
    assert cell_support(a100, "fp32", GEMM_TRITON) == (None, [])
    assert (
        cell_support(v100, "tf32", DEFAULT)[0] is None
        and "runs as fp32" in cell_support(v100, "tf32", DEFAULT)[1][0]
    )
    # CPU: no hard rules; reduce-overhead runs without CUDA graphs.
    assert cell_support(cpu, "bf16", MAX_AUTOTUNE)[0] is None
    assert "no CUDA graphs" in cell_support(cpu, "fp32", CompileConfig("ro", mode="reduce-overhead"))[1][0]
    # Another backend than Inductor is not subject to Inductor's rules, but bf16 is still emulated.
    eager = CompileConfig("e", backend="eager")
    assert cell_support(known("T4"), "fp32", eager) == (None, [])
    assert cell_support(known("T4"), "bf16", eager)[0] is not None


def test_too_old_gpu_and_missing_arch():
    old = dataclasses.replace(known("V100"), compute_capability=(6, 0), name="P100")
    assert "7.0+" in cell_support(old, "fp32", DEFAULT)[0]
    built = dataclasses.replace(known("V100"), arch_in_build=False)
    assert "no kernels for sm70" in cell_support(built, "fp32", DEFAULT)[0]
    assert _arch_in_build((7, 0), ["sm_80", "sm_90"]) is False
    assert _arch_in_build((8, 6), ["sm_80", "sm_90"]) is True  # same major, lower minor
    assert _arch_in_build((8, 9), ["sm_75", "compute_80"]) is True  # PTX JIT
    assert _arch_in_build((9, 0), []) is None


def test_from_device_without_a_gpu():
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU machine: test_from_device_agrees_with_torch checks it")
    caps = from_device()
    assert caps.device == "cpu" and caps.source == "device"


@pytest.mark.gpu
def test_from_device_agrees_with_torch():
    """On a real GPU: the device's capabilities against torch's own answers, and the table's row
    for its class (the SM count of the table is the smallest board's)."""
    import torch
    from torch._inductor.utils import is_big_gpu

    caps = from_device()
    assert caps.device == "cuda" and caps.arch_in_build is True
    assert caps.gemm_templates == is_big_gpu(0)
    assert caps.bf16 == torch.cuda.is_bf16_supported(including_emulation=False)
    assert caps.compute_capability == torch.cuda.get_device_capability(0)
    row = known(caps.name)
    if row is not None:
        assert row.compute_capability == caps.compute_capability
        assert row.sm_count <= caps.sm_count and row.memory_gb <= caps.memory_gb + 1
        assert row.gemm_templates == caps.gemm_templates
    for dtype in ("fp32", "tf32", "bf16", "fp16"):
        assert cell_support(caps, dtype, MAX_AUTOTUNE)[0] is None or not caps.bf16


def test_check_preset_supported():
    preset = {
        "config": "max-autotune",
        "dtype": "bf16",
        "precision": "bf16",
        "compile": {"mode": "max-autotune"},
    }
    assert "no native bf16" in check_preset_supported(known("T4"), preset)
    assert check_preset_supported(known("A100"), preset) is None
    gemm = {
        "precision": "fp32",
        "compile": {"options": {"max_autotune": True, "max_autotune_gemm_backends": "TRITON"}},
    }
    assert "T4 has 40 SMs" in check_preset_supported(known("T4"), gemm)
    assert check_preset_supported(known("cpu"), gemm) is None


def test_compiler_capabilities_imports_no_ray_or_orchestrator():
    code = (
        "import sys, compiler.capabilities as c; c.known('T4');"
        "bad = [m for m in sys.modules if m.split('.')[0] in ('ray', 'orchestrator', 'torch')];"
        "print(bad); sys.exit(1 if bad else 0)"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


# --- plan and sweep --------------------------------------------------------------------------------


@pytest.fixture
def mixed(tmp_path) -> Path:
    path = tmp_path / "mixed.yaml"
    path.write_text(SWEEP)
    return path


def test_plan_over_a100_v100_t4_shows_unsupported_cells_with_reasons(mixed, capsys):
    """Plan of [A100, V100, T4] with bf16 and max-autotune marks the cells a class cannot run, no GPU, no Ray."""
    assert main(["plan", str(mixed)]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[0].endswith(": 18 jobs (7 unsupported)")
    marked = {line.split()[1] for line in lines if line.rstrip().endswith("unsupported") and "/mlp/" in line}
    assert marked == {
        *(
            f"{hw}/mlp/bs1/bf16/{cfg}"
            for hw in ("V100", "T4")
            for cfg in ("default", "max-autotune", "gemm-triton")
        ),
        "T4/mlp/bs1/fp32/gemm-triton",
    }
    assert f"unsupported: 7 jobs (capability table v{TABLE_VERSION}); not run" in out
    assert "3 x V100 (sm70) has no native bf16" in out
    assert "3 x T4 (sm75) has no native bf16" in out
    assert "1 x T4 has 40 SMs: Inductor skips max-autotune GEMM templates (is_big_gpu needs >= 68)" in out
    # max-autotune on T4 in fp32 runs, with a note; nothing about A100.
    assert "note: T4 has 40 SMs" in out and "A100 (" not in out
    assert lines[-1] == "18 jobs: 11 to run, 7 unsupported"
    # docs/commands.md shows this output: its reasons and notes are the ones printed.
    doc = [line.strip() for line in (REPO / "docs" / "commands.md").read_text().splitlines()]
    start = doc.index(f"unsupported: 7 jobs (capability table v{TABLE_VERSION}); not run")
    end = doc.index("18 jobs: 11 to run, 7 unsupported")
    shown = [line.strip() for line in lines[lines.index(doc[start]) : -1]]
    assert doc[start:end] == shown


def test_plan_names_classes_the_table_lacks(mixed, capsys):
    assert main(["plan", str(REPO / "sweeps" / "smoke.yaml"), "--hardware", "RTX-9090"]) == 0
    out = capsys.readouterr().out
    assert "RTX-9090: not in the capability table" in out and "unsupported" not in out


def test_triage_splits_jobs_and_rows_say_why(mixed):
    jobs = expand(load_spec(mixed), {"A100": "cuda", "V100": "cuda", "T4": "cuda"})
    checked = triage(jobs)
    assert len(checked.runnable) == 11 and len(checked.unsupported) == 7
    job, reason = checked.unsupported[0]
    row = failure_row(job, "unsupported", reason, run_id="r")
    assert row["status"] == "unsupported" and "no native bf16" in row["error"]


# --- the tuner ------------------------------------------------------------------------------------


def test_tuner_proposes_nothing_the_class_cannot_run():
    mlp = ModelSpec(id="python:workers.toy:mlp", name="mlp")
    stock = (CompileConfig("default"), MAX_AUTOTUNE)
    free = candidates(stock, mlp, "cuda", "fp32", precisions=("bf16",))
    t4 = candidates(stock, mlp, "cuda", "fp32", precisions=("bf16",), capabilities=known("T4"))
    a100 = candidates(stock, mlp, "cuda", "fp32", precisions=("bf16",), capabilities=known("A100"))
    assert any(c.config.name.endswith("+gemm_triton") for c in free)
    assert any(c.dtype == "bf16" for c in free)
    assert {c.key for c in a100} == {c.key for c in free}
    assert not any(c.dtype == "bf16" or c.config.name.endswith("+gemm_triton") for c in t4)
    assert all(cell_support(known("T4"), c.dtype, c.config)[0] is None for c in t4)
    assert {c.key for c in t4 if c.stock} == {c.key for c in free if c.stock}


# --- reports --------------------------------------------------------------------------------------


def test_an_unsupported_cell_is_never_a_regression_nor_an_improvement(table_jobs, make_result):
    from reports.regression import compare
    from store.schema import rows_to_table
    from tests.test_regression import run_rows

    cell = "A100/resnet/bs1/fp32/default"
    why = {"status": "unsupported", "error": "A100 (sm80): ruled out (capability table v1)"}
    before, now = run_rows(table_jobs, make_result, 3), run_rows(table_jobs, make_result, 4, **{cell: why})
    for current, baseline in ((now, before), (before, now), (now, now)):
        got = {c.name: c for c in compare(rows_to_table(current), rows_to_table(baseline)).cells}
        assert got[cell].verdict == "unchanged", got[cell].reasons
    got = {c.name: c for c in compare(rows_to_table(now), rows_to_table(before)).cells}
    assert got[cell].reasons == ["ok -> unsupported: A100 (sm80): ruled out (capability table v1)"]


# --- the job's own device check -------------------------------------------------------------------


def test_a_gpu_job_checks_its_device_before_compiling(tmp_path, monkeypatch):
    """A job on a device that cannot run its cell ends `unsupported`, naming what the device
    reported (here a T4, as `from_device` would describe it); a runnable cell gets the notes."""
    import json

    import compiler.capabilities as capabilities
    from compiler.job import Job, MeasureSpec
    from workers.bench.run import JobRun

    def job_run(dtype: str, config: CompileConfig) -> JobRun:
        job = Job(
            sweep="s",
            hardware="RTX-9090",  # a class the table lacks: only the device check can judge it
            device="cuda",
            model=ModelSpec(id="python:workers.toy:mlp", name="mlp"),
            batch_size=1,
            dtype=dtype,
            config=config,
            measure=MeasureSpec(),
            timeout_s=60,
        )
        path = tmp_path / f"{dtype}-{config.name}.json"
        path.write_text(json.dumps(job.to_dict()))
        return JobRun(path, tmp_path / "result.json")

    device = dataclasses.replace(known("T4"), name="RTX-9090", source="device", arch_in_build=True)
    monkeypatch.setattr(capabilities, "from_device", lambda index=0: device)
    why = job_run("bf16", DEFAULT).unsupported_here()
    assert (
        why.startswith("RTX-9090 (sm75) has no native bf16")
        and "measured on this device: sm75, 40 SMs" in why
    )
    run = job_run("fp32", MAX_AUTOTUNE)
    assert run.unsupported_here() is None and "RTX-9090 has 40 SMs" in run.notes[0]


def test_export_refuses_presets_the_device_cannot_run_before_any_compile():
    from compiler.serving.files import ExportError
    from orchestrator.tune.export import check_supported

    entries = [
        {
            "model": "vit",
            "batch_size": 1,
            "dtype": "bf16",
            "precision": "bf16",
            "config": "default",
            "compile": {},
        },
        {
            "model": "vit",
            "batch_size": 16,
            "dtype": "fp32",
            "precision": "fp32",
            "config": "default",
            "compile": {},
        },
    ]
    defaults = {"config": "mat", "precision": "fp32", "compile": {"options": {"max_autotune": True}}}
    check_supported(entries, defaults, "A100", known("A100"))  # all of it runs there
    with pytest.raises(ExportError) as err:
        check_supported(entries, defaults, "V100", known("V100"))
    text = str(err.value)
    assert text.startswith("1 V100 preset(s) cannot run on this V100 (sm70): ")
    assert "no native bf16" in text and "Tune again on this class" in text
    check_supported(entries, defaults, "cpu", known("cpu"))  # the CPU has no such limits
