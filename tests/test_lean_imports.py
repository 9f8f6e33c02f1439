"""The optional packages a job process skips (workers/lean_imports.py): a module that imported
one under `if is_<package>_available():` while transformers saw it absent gets the real check
back and stand-ins that import at first use. The import times this saves are in the report of
the change; the seed models still build and run with it (tests/integration/test_seed_models.py)."""

from __future__ import annotations

import importlib.util
import sys
import textwrap

from workers import lean_imports

MODULE = """
from transformers.utils import is_scipy_available

if is_scipy_available():
    from json import dumps as encode
    import json.decoder as decoder
    import email.utils
    import html as markup

def uses_it(value):
    return encode(value) if is_scipy_available() else None
"""


def _load(tmp_path, source: str, check) -> object:
    """The module of `source`, loaded with `is_scipy_available` as `check`."""
    path = tmp_path / "skipping.py"
    path.write_text(textwrap.dedent(source))
    spec = importlib.util.spec_from_file_location("skipping", path)
    module = importlib.util.module_from_spec(spec)
    fake = type(sys)("transformers.utils")
    fake.is_scipy_available = check
    saved = {name: sys.modules.get(name) for name in ("transformers", "transformers.utils")}
    sys.modules["transformers"] = type(sys)("transformers")
    sys.modules["transformers.utils"] = fake
    try:
        spec.loader.exec_module(module)
    finally:
        for name, was in saved.items():
            if was is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = was
    return module


def test_a_skipped_import_gets_the_real_check_and_stand_ins(tmp_path):
    module = _load(tmp_path, MODULE, lean_imports._absent)
    assert not hasattr(module, "encode") and module.uses_it(1) is None  # skipped, as it loaded

    lean_imports._restore_module(module, "is_scipy_available", lambda: True)
    assert module.is_scipy_available() is True
    assert isinstance(module.encode, lean_imports.Deferred)
    assert module.uses_it([1]) == "[1]"  # imported at its first call
    assert module.decoder.JSONDecodeError.__name__ == "JSONDecodeError"  # a module, at its first attribute
    assert module.email.utils.formatdate  # `import a.b` binds `a`, with a.b imported
    assert module.markup.escape("<") == "&lt;"


def test_a_package_not_installed_stays_absent(tmp_path):
    module = _load(tmp_path, MODULE, lean_imports._absent)
    lean_imports._restore_module(module, "is_scipy_available", lambda: False)
    assert module.is_scipy_available() is False and not hasattr(module, "encode")


def test_a_block_that_does_more_than_import_keeps_the_package_absent(tmp_path):
    source = MODULE.replace("    import html as markup\n", "    import html as markup\n    READY = True\n")
    module = _load(tmp_path, source, lean_imports._absent)
    lean_imports._restore_module(module, "is_scipy_available", lambda: True)
    assert module.is_scipy_available is lean_imports._absent and not hasattr(module, "encode")


def test_a_job_loads_inductors_compiler_only_where_it_compiles_with_inductor():
    """Dynamo's `eager` and `aot_eager` backends never load Inductor's compiler: a job process of
    such a config leaves it out of its imports (0.9 s a process here); one whose candidate or
    baseline uses Inductor loads it before its compile is timed."""
    import json
    import subprocess
    from pathlib import Path

    from compiler.config import CompileConfig
    from compiler.job import Baseline, Job, MeasureSpec, ModelSpec
    from workers.bench.imports import uses_inductor

    def job(backend: str, baseline: Baseline | None = None) -> Job:
        model = ModelSpec(id="python:workers.toy:mlp", name="mlp")
        config = CompileConfig(name="c", backend=backend)
        return Job("s", "cpu", "cpu", model, 1, "fp32", config, MeasureSpec(), 60, baseline=baseline)

    stock = Baseline(config=CompileConfig(name="stock"), dtype="fp32")
    assert [uses_inductor(job(b)) for b in ("eager", "aot_eager", "inductor")] == [False, False, True]
    assert uses_inductor(job("eager", stock))  # a candidate confirmed against stock torch.compile

    code = textwrap.dedent(
        """
        import json, sys
        from workers.bench.imports import import_compile_stack
        from compiler.job import Job
        import_compile_stack(Job.from_dict(json.loads(sys.argv[1])))
        print(json.dumps(["torch._dynamo" in sys.modules, "torch._inductor.compile_fx" in sys.modules]))
        """
    )
    root = Path(__file__).resolve().parents[1]
    loaded = []
    for backend in ("eager", "inductor"):
        done = subprocess.run(
            [sys.executable, "-c", code, json.dumps(job(backend).to_dict())],
            capture_output=True,
            text=True,
            cwd=root,
            timeout=120,
        )
        assert done.returncode == 0, done.stderr[-2000:]
        loaded.append(json.loads(done.stdout.strip().splitlines()[-1]))
    assert loaded == [[True, False], [True, True]]
