"""The house rules of the source tree, checked: no import circle between the modules of one
package, between the top-level packages (the floors: compiler, workers, store, analysis, reports,
orchestrator), nor between `orchestrator`'s subpackages (counting imports inside functions: a
lazy import still ties two modules together); and no module over 500 lines, no function over 80."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _imports(package: str) -> dict[str, set[str]]:
    """module -> the modules of the same package it imports, anywhere in its body."""
    graph: dict[str, set[str]] = {}
    for path in sorted((ROOT / package).rglob("*.py")):
        name = ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
        found = graph.setdefault(name, set())
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                found.update(a.name for a in node.names if a.name.startswith(package + "."))
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                if node.module == package:
                    found.update(f"{package}.{a.name}" for a in node.names)
                elif node.module.startswith(package + "."):
                    found.add(node.module)
    return {m: {d for d in deps if d in graph and d != m} for m, deps in graph.items()}


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(m: str) -> list[str] | None:
        state[m] = 1
        stack.append(m)
        for d in sorted(graph[m]):
            if state.get(d) == 1:
                return stack[stack.index(d) :] + [d]
            if d not in state and (found := visit(d)):
                return found
        stack.pop()
        state[m] = 2
        return None

    for m in sorted(graph):
        if m not in state and (found := visit(m)):
            return found
    return None


PACKAGES = ["workers", "compiler", "store", "analysis", "orchestrator", "reports"]


def _floor_graph(modules: dict[str, set[str]], depth: int) -> dict[str, set[str]]:
    """The module graph collapsed to names of `depth` parts (1: top-level packages)."""
    floors: dict[str, set[str]] = {}
    for module, deps in modules.items():
        floor = ".".join(module.split(".")[:depth])
        edges = floors.setdefault(floor, set())
        edges.update(".".join(d.split(".")[:depth]) for d in deps)
    return {f: {d for d in deps if d != f and d in floors} for f, deps in floors.items()}


def _all_imports() -> dict[str, set[str]]:
    """module -> every module of the project's packages it imports, anywhere in its body."""
    graph: dict[str, set[str]] = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            name = ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
            found = graph.setdefault(name, set())
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Import):
                    found.update(a.name for a in node.names)
                elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                    found.add(node.module)
    return {m: {d for d in deps if d.split(".")[0] in PACKAGES} for m, deps in graph.items()}


def test_no_import_circle_between_top_level_packages():
    """The store is the floor below the driver and the reports: `reports` reads outputs through
    it and never imports the driver's package, which imports `reports` to print them. `analysis`
    (figures the driver and the reports both compute from rows) lies between: above `store`,
    below both."""
    floors = _floor_graph(_all_imports(), 1)
    assert _cycle(floors) is None, " -> ".join(_cycle(floors))
    assert "orchestrator" not in floors["reports"] and "orchestrator" not in floors["store"]
    assert {"reports", "orchestrator"}.isdisjoint(floors["analysis"]) and "analysis" not in floors["store"]


def test_no_import_circle_between_orchestrator_subpackages():
    """The floors: `spec`, `fleet`, `tune`, `workflows`, `commands`. The driver's (`spec`, `fleet`,
    `tune`) import no report: a run's reports are made by a workflow or a command."""
    inside = {m: d for m, d in _all_imports().items() if m.startswith("orchestrator.")}
    inside = {m: {d for d in deps if d.startswith("orchestrator.")} for m, deps in inside.items()}
    floors = _floor_graph(inside, 2)
    assert _cycle(floors) is None, " -> ".join(_cycle(floors))
    driver = ("orchestrator.spec", "orchestrator.fleet", "orchestrator.tune")
    reporting = sorted(
        f"{m} -> {d}"
        for m, deps in _all_imports().items()
        if ".".join(m.split(".")[:2]) in driver
        for d in deps
        if d.split(".")[0] == "reports"
    )
    assert reporting == []


def test_the_serving_api_imports_nothing_outside_compiler():
    """`compiler/serving/` is what a production process imports: none of its modules imports the
    floors above `compiler` (`workers`, `store`, `analysis`, `reports`, `orchestrator`) or Ray, anywhere in
    its body."""
    serving = {m: deps for m, deps in _all_imports().items() if m.split(".")[:2] == ["compiler", "serving"]}
    assert "compiler.serving" in serving and "compiler.serving.apply" in serving
    outside = {m: sorted(d for d in deps if d.split(".")[0] != "compiler") for m, deps in serving.items()}
    assert {m: deps for m, deps in outside.items() if deps} == {}
    ray = []
    for path in sorted((ROOT / "compiler" / "serving").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                ray += [f"{path.name}: {a.name}" for a in node.names if a.name.split(".")[0] == "ray"]
            elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "ray":
                ray.append(f"{path.name}: {node.module}")
    assert ray == []


TUNE_STAGES = ("rung0", "knobs", "rung1", "confirm", "decide", "deployed")
"""The tune's stages, each a module of `orchestrator/tune` that `search.py` runs in this order."""


def _tune_imports() -> dict[str, set[str]]:
    """module of `orchestrator/tune` -> the modules of it that it imports, anywhere in its body
    (`from orchestrator.tune import deployed` counting as importing `deployed`)."""
    folder = ROOT / "orchestrator" / "tune"
    names = {path.stem for path in folder.glob("*.py")} - {"__init__"}
    graph: dict[str, set[str]] = {}
    for name in sorted(names):
        found = graph.setdefault(name, set())
        for node in ast.walk(ast.parse((folder / f"{name}.py").read_text())):
            if isinstance(node, ast.Import):
                found.update(
                    a.name.split(".")[2] for a in node.names if a.name.startswith("orchestrator.tune.")
                )
            elif isinstance(node, ast.ImportFrom) and node.module == "orchestrator.tune":
                found.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("orchestrator.tune."):
                found.add(node.module.split(".")[2])
    return {m: {d for d in deps if d in names and d != m} for m, deps in graph.items()}


def test_the_tunes_stage_modules_import_no_other_stage_module():
    """A reader follows the tune top to bottom: `search.py` runs the stages in order, each stage a
    module owning its rules that imports no other stage, only what they all speak (the cell, the
    candidates, the limits, the accuracy judgement, the row figures), which imports no stage."""
    graph = _tune_imports()
    assert set(TUNE_STAGES) <= graph.keys()
    assert {m: sorted(graph[m] & set(TUNE_STAGES)) for m in TUNE_STAGES if graph[m] & set(TUNE_STAGES)} == {}
    below = {m: sorted(deps & set(TUNE_STAGES)) for m, deps in graph.items() if m not in TUNE_STAGES}
    assert {m: deps for m, deps in below.items() if deps and m != "search"} == {}
    assert set(TUNE_STAGES) <= graph["search"]
    assert _cycle(graph) is None, " -> ".join(_cycle(graph))


@pytest.mark.parametrize("package", PACKAGES)
def test_no_import_circle_inside_a_package(package):
    assert _cycle(_imports(package)) is None, " -> ".join(_cycle(_imports(package)))


def test_the_circle_finder_finds_one():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


MAX_FILE_LINES = 500
MAX_FUNCTION_LINES = 80
SIZED = [*PACKAGES, "benchmarks"]


def _sources():
    for folder in SIZED:
        for path in sorted((ROOT / folder).rglob("*.py")):
            yield path.relative_to(ROOT).as_posix(), path.read_text()


def test_no_module_over_500_lines_and_a_small_cli():
    sizes = {name: len(text.splitlines()) for name, text in _sources()}
    assert {p: n for p, n in sizes.items() if n > MAX_FILE_LINES} == {}
    assert sizes["orchestrator/cli.py"] < 300


def test_no_function_over_80_lines():
    """A flow longer than a screen and a half is split into named steps (a method counts alone;
    a function nested in another counts within it too)."""
    long = {}
    for name, text in _sources():
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                lines = node.end_lineno - node.lineno + 1
                if lines > MAX_FUNCTION_LINES:
                    long[f"{name}:{node.lineno} {node.name}"] = lines
    assert long == {}
