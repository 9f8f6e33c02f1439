"""Export then apply, for real: `orchestrate export` compiles the cpu class's preset cold in a
fresh process and bundles its caches; a serving process with empty caches (and neither Ray nor
the orchestrator imported) loads the bundle through `compiler.apply.compile_tuned` and compiles
from it, faster than a plain cold compile in the same conditions."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from compiler.apply import MANIFEST, PRESETS, sha256_file
from orchestrator.cli import main
from orchestrator.store.rows import make_row
from orchestrator.store.sink import ResultSink
from tests.tune.test_export_apply import local_stack_fields

pytestmark = pytest.mark.integration

SERVE = """
import json, sys, time
import torch, torch._dynamo, torch._inductor.compile_fx  # imported before the timed first call
from torch._dynamo.utils import counters
from torch._inductor.cpu_vec_isa import pick_vec_isa

pick_vec_isa()  # the C++ compiler's ISA probe (4 s here): once per process, with or without a bundle
from workers import toy

model, inputs = toy.mlp(4)
if sys.argv[1] == "plain":
    compiled, t0 = torch.compile(model), time.perf_counter()
    with torch.no_grad():
        compiled(**inputs)
    out = {"compile_s": time.perf_counter() - t0}
else:
    from compiler.apply import compile_tuned

    compiled, applied = compile_tuned(model, inputs, sys.argv[2], model_name="mlp")
    out = applied.to_dict()
out["counters"] = dict(counters["inductor"])
out["modules"] = sorted(m for m in sys.modules if m.split(".")[0] in ("ray", "orchestrator"))
print(json.dumps(out, default=str))
"""


def serve(tmp_path, *args):
    env = {
        **os.environ,
        "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / f"cache-{args[0]}"),
        "OMP_NUM_THREADS": "1",
    }
    proc = subprocess.run(
        [sys.executable, "-c", SERVE, *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=os.getcwd(),
        check=True,
    )
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_export_then_apply_in_a_fresh_process(tmp_path, table_jobs, make_result, capsys):
    out, dest = tmp_path / "out", tmp_path / "export"
    sink = ResultSink(out)
    for config, compiled_ms in (("default", 4.0), ("ro", 5.0)):
        job = table_jobs[f"cpu/mlp/bs4/fp32/{config}"]
        sink.add(make_row(job, make_result("ok", 5.0, compiled_ms, **local_stack_fields()), run_id="r1"))
    sink.close()

    assert main(["export", str(out), "--hardware", "cpu", "--dest", str(dest), "--cpus", "1"]) == 0
    assert "mlp/bs4/fp32/default: bundle" in capsys.readouterr().out
    manifest = json.loads((dest / MANIFEST).read_text())
    presets = json.loads((dest / PRESETS).read_text())
    (entry,) = presets["presets"]
    assert entry["config"] == "default" and entry["bundle"] == "bundles/mlp-bs4-fp32.bin"
    assert set(manifest["files"]) == {PRESETS, entry["bundle"]}
    assert all(sha256_file(dest / f) == h for f, h in manifest["files"].items())
    assert manifest["hardware"] == "cpu" and manifest["stack"]["torch"] == presets["stack"]["torch"]

    tuned = serve(tmp_path, "tuned", str(dest))
    plain = serve(tmp_path, "plain")
    assert tuned["modules"] == [] and tuned["match"] == "exact" and tuned["bundle"] == "loaded", tuned
    assert tuned["cache_artifacts"].get("inductor", 0) >= 1
    assert tuned["counters"].get("fxgraph_cache_hit", 0) >= 1 and not tuned["counters"].get(
        "fxgraph_cache_miss"
    )
    assert plain["counters"].get("fxgraph_cache_miss", 0) >= 1
    print("first call with the bundle", tuned["compile_s"], "plain", plain["compile_s"])
    assert tuned["compile_s"] < plain["compile_s"], (tuned["compile_s"], plain["compile_s"])
