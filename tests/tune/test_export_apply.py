"""Export planning and the apply API on hand-built tables and export directories: the class
default, stacks, the refusal of a tampered file and the fallback on another class or stack.
(The real bundle round trip, export then apply in a fresh process, is in the integration tier.)"""

from __future__ import annotations

import json
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from compiler import aoti
from compiler.config import CompileConfig
from compiler.hardware import accelerator_type, hardware_class, software_stack
from compiler.serving import (
    EXPORT_FORMAT,
    MANIFEST,
    SERVING_FILE,
    ExportError,
    PresetFallbackWarning,
    compile_tuned,
    find_preset,
    sha256_file,
)
from compiler.serving.files import SERVING_FILE_BEFORE
from compiler.serving.packaged import PackagedModel
from orchestrator.tune.export import export, plan_export
from orchestrator.tune.export_lines import bundle_caveat
from orchestrator.tune.presets import class_defaults
from store.rows import make_row
from store.sink import ResultSink
from tests.elf import needed
from workers import toy

ROOT = Path(__file__).resolve().parents[2]


def local_stack_fields() -> dict:
    return {
        "torch_version": torch.__version__,
        "triton_version": software_stack()["triton"],
        "cuda_version": torch.version.cuda,
        "python_version": platform.python_version(),
    }


# (job name, status, eager_ms, compiled_ms): cpu/mlp/bs4: ro wins; cpu/resnet/bs1: tuned wins but
# ro is ok on both cells, so ro is the class default.
CELLS = [
    ("cpu/mlp/bs4/fp32/default", "ok", 5.0, 5.0),
    ("cpu/mlp/bs4/fp32/ro", "ok", 5.0, 4.0),
    ("cpu/resnet/bs1/fp32/default", "ok", 50.0, 40.0),
    ("cpu/resnet/bs1/fp32/ro", "ok", 50.0, 45.0),
    ("cpu/resnet/bs1/fp32/tuned", "ok", 50.0, 25.0),
    ("cpu/mlp/bs4/fp32/tuned", "compile_error", 5.0, None),
    ("A100/mlp/bs4/fp32/default", "ok", 2.0, 1.0),
]


@pytest.fixture
def results_dir(tmp_path, table_jobs, make_result):
    out = tmp_path / "out"
    sink = ResultSink(out)
    for name, status, eager, compiled in CELLS:
        sink.add(
            make_row(
                table_jobs[name], make_result(status, eager, compiled, **local_stack_fields()), run_id="r1"
            )
        )
    sink.close()
    return out


def test_plan_picks_each_cells_winner_and_a_class_default(results_dir):
    entries, defaults, stack = plan_export(results_dir, "cpu")
    assert {(e["model"], e["batch_size"]): e["config"] for e in entries} == {
        ("mlp", 4): "ro",
        ("resnet", 1): "tuned",
    }
    (default,) = defaults.values()
    # default and ro are both ok on 2 cells; ro's geomean (1.25 x 1.11) beats default's (1.0 x 1.25)
    assert default["config"] == "ro" and default["cells"] == 2
    assert default["geomean_speedup_vs_eager"] == pytest.approx(((5 / 4) * (50 / 45)) ** 0.5)
    assert stack["torch"] == torch.__version__


def test_class_default_prefers_the_config_ok_on_more_cells(table_jobs, make_result):
    rows = [
        make_row(table_jobs[n], make_result(s, e, c), run_id="r")
        for n, s, e, c in [
            ("cpu/mlp/bs4/fp32/tuned", "ok", 5.0, 1.0),  # 5x, but on one cell only
            ("cpu/mlp/bs4/fp32/default", "ok", 5.0, 4.0),
            ("cpu/resnet/bs1/fp32/default", "ok", 50.0, 40.0),
        ]
    ]
    assert class_defaults(rows)["fp32"]["config"] == "default"


def test_export_refuses_before_compiling(results_dir, tmp_path, table_jobs, make_result):
    dest = tmp_path / "dest"
    with pytest.raises(ExportError, match="no result rows of hardware class 'T4'.*A100, cpu"):
        plan_export(results_dir, "T4")
    if hardware_class() != "A100":
        with pytest.raises(ExportError, match="must be compiled on a A100 node; this machine is"):
            export(results_dir, "A100", dest)
        assert not dest.exists()
    # rows from two torch versions cannot share a bundle
    sink = ResultSink(results_dir)
    other = {**local_stack_fields(), "torch_version": "1.0.0"}
    sink.add(make_row(table_jobs["cpu/mlp/bs1/fp32/default"], make_result("ok", **other), run_id="r2"))
    sink.close()
    with pytest.raises(ExportError, match="2 software stacks"):
        plan_export(results_dir, "cpu")


def test_a_cell_whose_timing_is_doubted_is_left_out_by_name_and_none_left_refuses_the_export(
    tmp_path, table_jobs, make_result, monkeypatch
):
    """A sweep cell timed while other processes held its cores (`host_other_share`) has no preset
    (`presets` leaves it undecided): the export says which cell and how to measure it again, and
    refuses where that leaves nothing, rather than write an export of no presets."""
    from compiler.statistics.thresholds import THRESHOLDS_ENV

    monkeypatch.delenv(THRESHOLDS_ENV)  # the project's limits, not the suite's trusting ones
    doubted = {"host_other_share": [0.27], **local_stack_fields()}
    out = tmp_path / "out"
    sink = ResultSink(out)
    sink.add(make_row(table_jobs["cpu/mlp/bs4/fp32/ro"], make_result("ok", 5.0, 4.0, **doubted), run_id="r"))
    sink.close()
    with pytest.raises(
        ExportError,
        match=r"no cpu preset under .*nothing to export\. cpu/mlp/bs4/fp32: "
        r"undecided, timing doubted .*other processes took 27% of its cores.*--only 'cpu/mlp/bs4/fp32/\*'",
    ):
        plan_export(out, "cpu")
    sink = ResultSink(out)
    row = make_result("ok", 50.0, 25.0, **local_stack_fields())
    sink.add(make_row(table_jobs["cpu/resnet/bs1/fp32/tuned"], row, run_id="r"))
    sink.close()
    left_out: list[str] = []
    entries, _, _ = plan_export(out, "cpu", left_out=left_out)
    assert [e["model"] for e in entries] == ["resnet"], entries
    assert len(left_out) == 1 and left_out[0].startswith("cpu/mlp/bs4/fp32: undecided"), left_out


HIDE_TRANSFORMERS = """
import sys
sys.modules["transformers"] = None  # as in an environment without the hf extra: nothing imports it
from orchestrator.cli import main
sys.exit(main(sys.argv[1:]))
"""


def test_an_export_whose_models_need_a_missing_extra_refuses_before_compiling(results_dir, tmp_path):
    """The resnet preset is an hf: model: without transformers the export says which extra to
    install and exits 2 at once, before any bundle job (a real process without the package)."""
    dest = tmp_path / "dest"
    t0 = time.monotonic()
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            HIDE_TRANSFORMERS,
            "export",
            str(results_dir),
            "--hardware",
            "cpu",
            "--dest",
            str(dest),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2, done.stderr[-2000:]
    assert time.monotonic() - t0 < 30  # a start-up, no compile (the 10 s, on a loaded 2-core machine)
    said = done.stderr.strip().splitlines()[-1]
    assert "building hf:microsoft/resnet-50 needs the hf extra" in said, said
    assert "pip install 'compile-orchestrator[hf]'" in said and "nothing was compiled" in said, said
    assert not list(dest.glob("bundles/*")), list(dest.rglob("*"))


def test_an_interrupted_export_resumes_without_compiling_what_it_finished(
    results_dir, tmp_path, table_jobs, make_result
):
    """Both compiled presets finished before the (simulated) kill: the resumed export compiles
    nothing and writes the manifest over exactly the files it had made; a stale temporary file is
    dropped. The third cell's preset is eager (its rows timed eager faster in 3 processes): it gets
    no bundle or package, and stays in serving.json and the manifest with its runtime settings."""
    from orchestrator.tune.export import PROGRESS
    from tests.tune.test_tune import samples

    sink = ResultSink(results_dir)
    for config, compiled in (("default", 5.0), ("ro", 4.0)):
        fields = {
            "eager_samples_ms": samples(3.0, 30, 3, seed=1),
            "compiled_samples_ms": samples(compiled, 30, 3, seed=2),
            "samples_per_repeat": [30, 30, 30],
        }
        result = make_result("ok", 3.0, compiled, **fields, **local_stack_fields())
        sink.add(make_row(table_jobs[f"cpu/mlp/bs1/fp32/{config}"], result, run_id="r1"))
    sink.close()
    dest = tmp_path / "dest"
    (dest / "bundles").mkdir(parents=True)
    entries, _, _ = plan_export(results_dir, "cpu")
    assert [(e["model"], e["batch_size"], e["config"]) for e in entries] == [
        ("mlp", 1, "eager"),
        ("mlp", 4, "ro"),
        ("resnet", 1, "tuned"),
    ]
    compiled = entries[1:]
    finished = []
    for entry in compiled:
        name = f"bundles/{entry['model']}.bin"
        (dest / name).write_bytes(entry["model"].encode())
        finished.append({**entry, "bundle": name, "package": None})
    (dest / "bundles" / ".resnet.bin.tmp").write_bytes(b"half written")
    key = {"source": str(results_dir), "hardware": "cpu", "packages": True}
    (dest / PROGRESS).write_text(json.dumps({"key": key, "entries": finished}))

    with pytest.raises(ExportError, match="not empty .*add --resume"):
        export(results_dir, "cpu", dest)
    with pytest.raises(ExportError, match="resume it with the same arguments"):
        export(results_dir, "cpu", dest, resume=True, packages=False)
    lines = []
    manifest = export(results_dir, "cpu", dest, resume=True, log=lines.append)
    assert lines == [
        "resuming the export into " + str(dest) + ": 2 of 3 presets already done",
        "[1/3] mlp/bs1/fp32/eager: eager (do not compile: compiled ro was slower), no bundle or package; "
        "runtime torch defaults",
    ]
    assert set(manifest["files"]) == {SERVING_FILE, "bundles/mlp.bin", "bundles/resnet.bin"}
    assert manifest["runtime"] == {
        "mlp/bs1/fp32/eager": {},
        "mlp/bs4/fp32/ro": {},
        "resnet/bs1/fp32/tuned": {},
    }
    assert not (dest / PROGRESS).exists() and not (dest / "bundles" / ".resnet.bin.tmp").exists()
    eager, *rest = json.loads((dest / SERVING_FILE).read_text())["presets"]
    assert [e["bundle"] for e in rest] == [f"bundles/{e['model']}.bin" for e in compiled]
    assert eager["compile"] is None and eager["runtime"] == {} and eager["bundle"] is eager["package"] is None
    with pytest.raises(ExportError, match="a finished export"):
        export(results_dir, "cpu", dest, resume=True)


def test_a_bundle_job_killed_while_packaging_keeps_its_bundle(tmp_path):
    from orchestrator.tune.export import _bundle_outcome

    bundle = tmp_path / "b.bin"
    bundle.write_bytes(b"12345")
    killed = {
        "status": "timeout",
        "phase": "package",
        "bundle_bytes": 5,
        "error": "timed out after 600 s in phase 'package'; killed the process tree\n--- last output ---",
    }
    got = _bundle_outcome(killed, bundle)
    assert got["status"] == "ok" and got["package_error"].startswith("timeout: timed out after 600 s")
    assert _bundle_outcome({**killed, "phase": "bundle"}, bundle)["status"] == "timeout"  # no bundle yet
    assert _bundle_outcome({**killed, "bundle_bytes": 9}, bundle)["status"] == "timeout"  # not that bundle
    bundle.unlink()
    assert _bundle_outcome(killed, bundle)["status"] == "timeout"


def test_after_a_package_crashed_its_loader_the_export_builds_no_more():
    from orchestrator.tune.export_lines import package_line

    crash = "PackageError: loading it killed a fresh process (SIGSEGV): the AOTInductor loader crashes on this stack"
    entry: dict = {}
    assert package_line(entry, "packages/a.pt2", {"package_error": crash}) == f", no package ({crash})"
    assert entry == {"package": None, "package_error": crash}
    later: dict = {}
    assert "crashed loading an earlier one" in package_line(later, None, {}, crashed=crash)
    assert later["package"] is None and later["package_error"].endswith(crash)
    made: dict = {}
    result = {"package_bytes": 2e6, "package_compile_s": 12.0, "package_inputs": [[[4], "float32", "cpu"]]}
    assert package_line(made, "packages/b.pt2", result) == ", package 2.0 MB in 12.0 s"
    assert made["package"] == "packages/b.pt2" and made["package_inputs"] == [[[4], "float32", "cpu"]]


def test_the_export_says_when_a_bundle_cannot_skip_aot_autograd():
    from compiler.config import CompileConfig

    frozen, plain = CompileConfig(name="f", freezing=True), CompileConfig(name="p")
    full = {"inductor": 1, "aot_autograd": 1, "autotune": 18}
    assert bundle_caveat(plain, full) == "" and bundle_caveat(frozen, full) == ""
    caveat = bundle_caveat(frozen, {"inductor": 1, "autotune": 17})  # an H200 freezing preset's bundle
    assert "no AOTAutograd entry (freezing" in caveat and "re-runs AOTAutograd" in caveat
    other = bundle_caveat(plain, {"inductor": 1})  # no entry for another reason: said, not blamed on freezing
    assert other and "(freezing" not in other


def test_hardware_class_names_gpus_as_ray_does():
    from ray._private.accelerators.nvidia_gpu import NvidiaGPUAcceleratorManager as nv

    names = [
        "NVIDIA H100 80GB HBM3",
        "NVIDIA A100-SXM4-80GB",
        "Tesla V100-SXM2-16GB",
        "Tesla T4",
        "NVIDIA GeForce RTX 5090",
        "NVIDIA RTX PRO 6000 Blackwell",
    ]
    for name in names:
        assert accelerator_type(name) == nv._gpu_name_to_accelerator_type(name), name
    assert accelerator_type("NVIDIA H100 80GB HBM3") == "H100"
    assert hardware_class("cpu") == "cpu"


# --- apply on hand-made export directories -----------------------------------------------------


def write_export(
    dest: Path, *, hardware: str | None = None, bundle: bytes | None = None, package: bytes | None = None
) -> Path:
    """A minimal export of toy mlp bs4 fp32 (config `default`), optionally with a bundle file and a
    package file (for the mlp's bs4 input signature)."""
    stack = software_stack()
    entry = {
        "model": "mlp",
        "batch_size": 4,
        "dtype": "fp32",
        "config": "default",
        "compile": {"backend": "inductor", "mode": None, "fullgraph": False, "dynamic": None, "options": {}},
        "bundle": "bundles/mlp.bin" if bundle is not None else None,
        "package": "packages/mlp.pt2" if package is not None else None,
        "package_inputs": [[[4, 128], "float32", "cpu"]],
        "package_cudagraphs": False,
    }
    default = {
        **entry,
        "config": "cdt",
        "bundle": None,
        "compile": {**entry["compile"], "options": {"coordinate_descent_tuning": True}},
    }
    dest.mkdir(parents=True)
    (dest / SERVING_FILE).write_text(
        json.dumps({"format": 1, "presets": [entry], "defaults": {"fp32": default}})
    )
    if bundle is not None:
        (dest / "bundles").mkdir()
        (dest / "bundles" / "mlp.bin").write_bytes(bundle)
    if package is not None:
        (dest / "packages").mkdir()
        (dest / "packages" / "mlp.pt2").write_bytes(package)
    files = {str(p.relative_to(dest)): sha256_file(p) for p in dest.rglob("*") if p.is_file()}
    manifest = {
        "format": EXPORT_FORMAT,
        "hardware": hardware or hardware_class(),
        "stack": stack,
        "files": files,
    }
    (dest / MANIFEST).write_text(json.dumps(manifest))
    return dest


def valid_bundle() -> bytes:
    """A compile-cache bundle torch reads: its own serializer's bytes for an empty set of artifacts
    (what `torch.compiler.save_cache_artifacts` writes, checksum included, with nothing in it)."""
    from torch.utils._appending_byte_serializer import AppendingByteSerializer

    return AppendingByteSerializer(serialize_fn=lambda writer, item: None).to_bytes()


def edit_presets(dest: Path, edit) -> Path:
    """Change the export's serving.json with `edit(presets)` and give the manifest its new sha256,
    as an export that wrote it so would have."""
    presets = json.loads((dest / SERVING_FILE).read_text())
    edit(presets)
    (dest / SERVING_FILE).write_text(json.dumps(presets))
    manifest = json.loads((dest / MANIFEST).read_text())
    manifest["files"][SERVING_FILE] = sha256_file(dest / SERVING_FILE)
    (dest / MANIFEST).write_text(json.dumps(manifest))
    return dest


def rehash(dest: Path, manifest: dict | None = None) -> Path:
    """Give the export's manifest (its own, or `manifest` where the test wrote the files itself)
    the sha256 of every file now in the export, as an export that wrote them so would have."""
    manifest = json.loads((dest / MANIFEST).read_text()) if manifest is None else manifest
    manifest["files"] = {
        str(p.relative_to(dest)): sha256_file(p)
        for p in dest.rglob("*")
        if p.is_file() and p.name != MANIFEST
    }
    (dest / MANIFEST).write_text(json.dumps(manifest))
    return dest


def compile_tuned_in_fresh_process(dest: Path, kwargs: str, report: str) -> dict:
    """`compile_tuned` of the toy mlp at batch 4 with the export `dest` (and the keyword arguments
    `kwargs`, as Python source) in a fresh process, cuDNN's benchmark flag off before it: the JSON
    object that the expression `report` gives there (over `model`, `served`, `applied`, `torch`,
    `sys` and `warned`, the messages of the warnings it raised)."""
    code = (
        "import json, sys, warnings, torch\n"
        "from compiler.serving import compile_tuned\n"
        "from workers import toy\n"
        "model, inputs = toy.mlp(4, None, {})\n"
        "assert torch.backends.cudnn.benchmark is False\n"
        "with warnings.catch_warnings(record=True) as seen:\n"
        "    warnings.simplefilter('always')\n"
        f"    served, applied = compile_tuned(model, inputs, {str(dest)!r}, model_name='mlp', {kwargs})\n"
        "warned = [str(w.message) for w in seen]\n"
        f"print(json.dumps({report}))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_exact_cell_then_the_class_default_then_nothing():
    presets = {
        "presets": [
            {"model": "mlp", "batch_size": 4, "dtype": "tf32"},
            {"model": "mlp", "batch_size": 4, "dtype": "fp32"},
        ],
        "defaults": {"fp32": {"config": "d"}},
    }
    assert find_preset(presets, "mlp", 4, ("fp32", "tf32"))[1]["dtype"] == "fp32"
    assert find_preset(presets, "mlp", 8, ("fp32", "tf32")) == ("class_default", {"config": "d"})
    assert find_preset(presets, "mlp", 8, ("bf16",)) == ("fallback", None)


@pytest.mark.parametrize("kind, rel", [("bundle", "bundles/mlp.bin"), ("package", "packages/mlp.pt2")])
def test_a_tampered_bundle_or_package_is_refused_never_loaded(tmp_path, kind, rel):
    dest = write_export(tmp_path / "exp", **{kind: b"not what was exported"})
    (dest / rel).write_bytes(b"not what was exported, changed")  # after the manifest
    model, inputs = toy.mlp(4)
    with pytest.warns(PresetFallbackWarning, match=f"{rel}: sha256 .* does not match the manifest"):
        compiled, applied = compile_tuned(model, inputs, dest, model_name="mlp", run_example=False)
    assert (
        getattr(applied, kind) == "refused"
        and applied.match == "exact"
        and applied.config["name"] == "default"
    )
    assert compiled is not model
    with pytest.raises(ExportError, match="does not match the manifest"):
        compile_tuned(model, inputs, dest, model_name="mlp", run_example=False, strict=True)


def test_a_package_that_will_not_load_falls_back_to_the_preset(tmp_path):
    dest = write_export(tmp_path / "exp", package=b"hashed, but no package")
    model, inputs = toy.mlp(4)
    with pytest.warns(PresetFallbackWarning, match="packages/mlp.pt2: .*compiling the preset instead"):
        compiled, applied = compile_tuned(model, inputs, dest, model_name="mlp", run_example=False)
    assert applied.package == "failed" and applied.config["name"] == "default"
    with torch.no_grad():
        assert torch.allclose(compiled(**inputs), model(**inputs), atol=1e-5)


def test_a_package_serves_only_its_input_signature(tmp_path):
    dest = write_export(tmp_path / "exp", package=b"never read")
    model, inputs = toy.mlp(4)
    _, applied = compile_tuned(
        model, inputs, dest, model_name="mlp", batch_size=4, run_example=False, use_package=False
    )
    assert applied.package == "skipped"
    _, applied = compile_tuned(
        model, {"x": inputs["x"].double()}, dest, model_name="mlp", batch_size=4, run_example=False
    )
    assert applied.package == "skipped" and not applied.warnings  # another dtype: the preset compiles


def test_the_load_probe_says_why_a_package_would_not_load(tmp_path):
    bad = tmp_path / "bad.pt2"
    bad.write_bytes(b"not a package")
    assert aoti.probe_load(bad).startswith("loading it in a fresh process failed: RuntimeError")
    # the H200 with torch 2.11 killed the loading process: a process that really segfaults
    crash = "import os, signal, sys; open(sys.argv[1], 'rb'); os.kill(os.getpid(), signal.SIGSEGV)"
    assert "killed a fresh process (SIGSEGV)" in aoti.probe_load(bad, code=crash)
    assert "did not finish in 1 s" in aoti.probe_load(bad, timeout_s=1, code="import time; time.sleep(30)")


STATIC_ONLY_CXX = """#!/bin/sh
# a C++ compiler with only a static libstdc++, as the H200 image's CXX=/opt/gcc/bin/g++
for arg in "$@"; do
  if [ "$arg" = "-print-file-name=libstdc++.so" ]; then echo libstdc++.so; exit 0; fi
done
for arg in "$@"; do
  if [ "$arg" = "-shared" ]; then exec '{real}' "$@" -static-libstdc++; fi
done
exec '{real}' "$@"
"""

REGEX_LIBRARY = """#include <regex>
#include <string>
extern "C" int device_index(const char* text) {  // what AOTInductor's parse_device_str does
  std::smatch m;
  std::string s(text);
  return std::regex_match(s, m, std::regex("([a-z]+)[:]?([0-9]*)")) ? std::stoi(m[2].str()) : -1;
}
"""

LOAD_AFTER_TORCH = "import sys, ctypes, torch; print(ctypes.CDLL(sys.argv[1]).device_index(b'cuda:3'))"


def test_a_static_cxx_runtime_is_linked_shared_as_the_loader_needs(tmp_path):
    # the H200 image's compiler linked libstdc++ statically into every package's library, and
    # loading one into a torch process (which runs the shared libstdc++) crashed in its std::regex
    # code: a real library built that way dies the same way here, and links right through the script
    real = shutil.which("g++") or shutil.which("c++")
    assert real, "the fast tier needs the C++ compiler Inductor uses"
    static_only = tmp_path / "bin" / "g++"
    static_only.parent.mkdir()
    static_only.write_text(STATIC_ONLY_CXX.format(real=real))
    static_only.chmod(0o755)
    assert aoti.links_shared_runtime(real) and aoti.runtime_link_options(real) == {}  # left as it is
    assert not aoti.links_shared_runtime(str(static_only))
    options = aoti.runtime_link_options(str(static_only))
    script = str(options["cpp.cxx"][1])
    assert Path(script).name == "g++" and aoti.runtime_link_options(str(static_only)) == options
    (tmp_path / "lib.cpp").write_text(REGEX_LIBRARY)
    for cxx, lib in ((str(static_only), "static.so"), (script, "linked.so")):
        subprocess.run(
            [cxx, "-c", "-fPIC", str(tmp_path / "lib.cpp"), "-o", str(tmp_path / "lib.o")], check=True
        )
        subprocess.run([cxx, "-shared", str(tmp_path / "lib.o"), "-o", str(tmp_path / lib)], check=True)
    assert not any("libstdc++" in n for n in needed(tmp_path / "static.so"))
    assert "libstdc++.so.6" in needed(tmp_path / "linked.so")
    crashed = subprocess.run(
        [sys.executable, "-c", LOAD_AFTER_TORCH, str(tmp_path / "static.so")], capture_output=True
    )
    assert crashed.returncode != 0  # SIGSEGV on the H200 image, std::bad_cast (abort) with GCC 12
    served = subprocess.run(
        [sys.executable, "-c", LOAD_AFTER_TORCH, str(tmp_path / "linked.so")], capture_output=True, text=True
    )
    assert served.returncode == 0 and served.stdout.strip() == "3", served.stderr[-2000:]


def test_a_freezing_presets_package_serves_the_callers_weights(tmp_path):
    # on the H200 every freezing preset's package asked for _frozen_param* constants (weights
    # folded at compile time from the exporting process's values) that no caller has
    config = CompileConfig(name="f", freezing=True)
    built, inputs = toy.conv_bn(2)
    caller, _ = toy.conv_bn(2, overrides={"seed": 1})  # other weights: the package must take these
    with torch._inductor.config.patch(freezing=True):  # as the export job runs a freezing preset
        info = aoti.build_package(built, inputs, config, tmp_path / "p.pt2")
    runner = aoti.load_runner(tmp_path / "p.pt2", single_threaded=True)
    assert not [n for n in runner.get_constant_fqns() if n.startswith("_frozen_param")]
    packaged = PackagedModel.load(tmp_path / "p.pt2", caller, info["package_inputs"], False, lambda: None)
    with torch.no_grad():
        assert torch.allclose(packaged(**inputs), caller(**inputs), rtol=1e-4, atol=1e-5)
        other = toy.conv_bn(2)[0](**inputs)  # the seeds' outputs differ: matching the caller's is no given
        assert not torch.allclose(packaged(**inputs), other, rtol=1e-4, atol=1e-5)


def test_a_cpu_reduce_overhead_preset_is_served_from_its_package(tmp_path):
    """A CPU-class reduce-overhead preset exported a package marked for CUDA graphs, and on a
    CPU-only torch `compile_tuned` failed on `torch.cuda.Stream requires CUDA support` and compiled
    the preset instead. No CUDA graph is recorded for a package whose inputs are on the CPU, and
    one already marked so (an older export) is served without one."""
    model, inputs = toy.mlp(4)
    info = aoti.build_package(
        model, inputs, CompileConfig(name="ro", mode="reduce-overhead"), tmp_path / "p.pt2"
    )
    assert info["package_cudagraphs"] is False
    dest = write_export(tmp_path / "exp", package=(tmp_path / "p.pt2").read_bytes())
    edit_presets(dest, lambda p: p["presets"][0].update(config="ro", package_cudagraphs=True))
    serving, _ = toy.mlp(4)
    compiled, applied = compile_tuned(serving, inputs, dest, model_name="mlp", strict=True)
    assert applied.package == "loaded", applied.warnings
    with torch.no_grad():
        assert torch.allclose(compiled(**inputs), serving(**inputs), rtol=1e-4, atol=1e-5)


def test_cpu_isa_mismatch_ranks_what_a_cpu_can_run():
    assert aoti.isa_mismatch("AVX512", "AVX2") == (
        "the package was built for CPU vector ISA AVX512; this CPU reports AVX2"
    )
    assert aoti.isa_mismatch("AVX2", "AVX512") == ""  # an AVX512 CPU runs AVX2 code
    assert aoti.isa_mismatch("avx2", "AVX2") == "" and aoti.isa_mismatch("", "DEFAULT") == ""
    assert aoti.isa_mismatch("AVX2", "NO AVX").endswith("this CPU reports NO AVX")
    # an ISA the ranking does not know: no warning (torch's own check only warns too)
    assert aoti.isa_mismatch("AMX_TILE", "AVX2") == ""


def test_package_options_expand_the_mode_and_take_cuda_graphs_out():
    options, cudagraphs = aoti.package_options(
        CompileConfig(
            name="p", mode="max-autotune", options={"coordinate_descent_tuning": True}, freezing=True
        )
    )
    assert cudagraphs and "triton.cudagraphs" not in options
    assert options["max_autotune"] and options["coordinate_descent_tuning"]
    assert options["freezing"] is False  # never in a package: it would bake the export's weights in
    assert (
        options["aot_inductor.package_constants_in_so"] is False
    )  # the caller's weights, never the export's
    assert aoti.package_options(CompileConfig(name="d"))[1] is False
    assert aoti.packageable(CompileConfig(name="d", dynamic=True)).startswith("dynamic=True")
    assert aoti.packageable(CompileConfig(name="e", backend="eager")).startswith("backend 'eager'")


def test_a_tampered_preset_file_falls_back_to_plain_compile(tmp_path):
    dest = write_export(tmp_path / "exp")
    (dest / SERVING_FILE).write_text((dest / SERVING_FILE).read_text().replace('"default"', '"evil"'))
    model, inputs = toy.mlp(4)
    with pytest.warns(PresetFallbackWarning, match="serving.json: sha256"):
        compiled, applied = compile_tuned(model, inputs, dest, model_name="mlp", run_example=False)
    assert applied.match == "fallback" and applied.config is None and compiled is not model


def test_an_export_whose_presets_file_has_its_earlier_name_is_served(tmp_path):
    """Exports written before the export's presets document was named serving.json (apart from a
    tune output's presets.json) list it as presets.json in their manifest: read so, and named so."""
    dest = write_export(tmp_path / "exp")
    (dest / SERVING_FILE).rename(dest / SERVING_FILE_BEFORE)
    manifest = json.loads((dest / MANIFEST).read_text())
    manifest["files"][SERVING_FILE_BEFORE] = manifest["files"].pop(SERVING_FILE)
    (dest / MANIFEST).write_text(json.dumps(manifest))
    model, inputs = toy.mlp(4)
    compiled, applied = compile_tuned(model, inputs, dest, model_name="mlp", run_example=False)
    assert applied.match == "exact" and applied.config is not None and compiled is not model
    (dest / SERVING_FILE_BEFORE).write_text(
        (dest / SERVING_FILE_BEFORE).read_text().replace('"default"', '"evil"')
    )
    with pytest.warns(PresetFallbackWarning, match="/presets.json: sha256"):
        compiled, applied = compile_tuned(model, inputs, dest, model_name="mlp", run_example=False)
    assert applied.match == "fallback"


@pytest.mark.parametrize("what", ["hardware", "stack"])
def test_another_class_or_stack_warns_once_and_falls_back(tmp_path, what):
    dest = write_export(tmp_path / "exp", hardware="H100" if what == "hardware" else None)
    if what == "stack":
        manifest = json.loads((dest / MANIFEST).read_text())
        manifest["stack"]["torch"] = "2.0.0"
        (dest / MANIFEST).write_text(json.dumps(manifest))
    model, inputs = toy.mlp(4)
    with pytest.warns(PresetFallbackWarning) as record:
        _, applied = compile_tuned(model, inputs, dest, model_name="mlp", run_example=False)
    # (pytest.warns records every warning: torch's own DeprecationWarnings too, where this test is
    # the first of its process to import Inductor)
    (warned,) = [w for w in record if w.category is PresetFallbackWarning]
    expected = "are for hardware class 'H100'" if what == "hardware" else "another stack: torch 2.0.0"
    assert expected in str(warned.message) and applied.match == "fallback"


def test_a_model_never_swept_gets_the_class_default(tmp_path):
    dest = write_export(tmp_path / "exp")
    model, inputs = toy.mlp(2)
    _, applied = compile_tuned(model, inputs, dest, model_name="unknown", run_example=False)
    assert applied.match == "class_default" and applied.config["options"] == {
        "coordinate_descent_tuning": True
    }


def test_the_apply_api_imports_neither_ray_nor_the_orchestrator():
    code = "import sys; from compiler.serving import *; print(sorted(m for m in sys.modules if m.split('.')[0] in ('ray', 'orchestrator', 'workers')))"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_compiler_apply_is_a_deprecated_alias_of_the_serving_api():
    """Serving code written before `compiler.serving` imports `compiler.apply`: it gets the same
    objects, and one DeprecationWarning naming the new path, attributed to the importing line."""
    code = (
        "import json, warnings\n"
        "with warnings.catch_warnings(record=True) as seen:\n"
        "    warnings.simplefilter('always')\n"
        "    import compiler.apply as old\n"
        "    from compiler.apply import compile_tuned\n"
        "import compiler.serving as new\n"
        "print(json.dumps({'warned': [[w.category.__name__, str(w.message), w.filename] for w in seen],\n"
        "    'same': [n for n in new.__all__ if getattr(old, n) is getattr(new, n)], 'all': old.__all__,\n"
        "    'exports': sorted(new._EXPORTS), 'tuned': compile_tuned is new.compile_tuned}))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    said = json.loads(out.stdout.strip().splitlines()[-1])
    assert said["warned"] == [
        [
            "DeprecationWarning",
            "compiler.apply is deprecated: import compile_tuned and the serving API from compiler.serving",
            "<string>",
        ]
    ]
    assert said["same"] == said["all"] and sorted(said["all"]) == said["exports"] and said["tuned"]
    names = {"compile_tuned", "Applied", "ExportError", "SignatureError", "PresetFallbackWarning"}
    assert names <= set(said["all"])


def test_the_serving_files_earlier_name_is_a_deprecated_alias():
    """`PRESETS`, `SERVING_FILE`'s name before, still imports from `compiler.serving` (and from
    `compiler.apply`), with a DeprecationWarning naming the new one; it is not in `__all__`."""
    import warnings

    import compiler.serving as serving

    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        from compiler.serving import PRESETS
    assert PRESETS == SERVING_FILE == "serving.json" and "PRESETS" not in serving.__all__
    assert {str(w.message) for w in seen} == {"compiler.serving.PRESETS is deprecated: use SERVING_FILE"}
    assert all(w.category is DeprecationWarning for w in seen)
