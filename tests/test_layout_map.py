"""docs/layout.md's map against the tree: every package on disk has its row and every row names a
package, and no module imports a project package its row does not list. The shared vocabulary
lives below every floor that speaks it, and each name of one thing is defined once."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from tests.test_layout import PACKAGES, _all_imports

ROOT = Path(__file__).resolve().parents[1]
MAP = ROOT / "docs" / "layout.md"


def _packages_on_disk() -> set[str]:
    """Every package of the project (a folder with `__init__.py` under a top-level package)."""
    return {
        ".".join(init.parent.relative_to(ROOT).parts)
        for top in PACKAGES
        for init in (ROOT / top).rglob("__init__.py")
    }


def _map() -> dict[str, set[str]]:
    """package -> the packages it may import, from the map's table (`a/b/` is package `a.b`)."""
    rows: dict[str, set[str]] = {}
    text = MAP.read_text()
    table = text[text.index("| package | holds | may import |") :].split("\n\n")[0]
    for line in table.splitlines()[2:]:
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        assert len(cells) == 3, f"docs/layout.md: a map row is not package | holds | may import: {line}"
        name = re.fullmatch(r"`([\w/]+)/`", cells[0])
        assert name, f"docs/layout.md: the map's first column names a package as `a/b/`: {cells[0]}"
        package = name[1].replace("/", ".")
        assert package not in rows, f"docs/layout.md: {package} has two rows"
        rows[package] = {m.replace("/", ".") for m in re.findall(r"`([\w/]+)/`", cells[2])}
    return rows


def _owner(module: str, packages: set[str]) -> str:
    """The most specific package that holds `module` (a module or a package)."""
    parts = module.split(".")
    for n in range(len(parts), 0, -1):
        if ".".join(parts[:n]) in packages:
            return ".".join(parts[:n])
    raise AssertionError(f"{module} lies in no package")


def test_every_package_has_its_row_and_every_row_a_package():
    rows, disk = _map(), _packages_on_disk()
    assert sorted(set(rows) - disk) == [], "docs/layout.md names packages that do not exist"
    assert sorted(disk - set(rows)) == [], "packages docs/layout.md does not name"
    for package, allowed in rows.items():
        assert allowed <= disk, f"{package}'s row lets it import packages that do not exist: {allowed - disk}"


def _unlisted(rows: dict[str, set[str]], imports: dict[str, set[str]]) -> list[str]:
    """Every import of a project package that the importing module's row does not list."""
    packages = set(rows)
    found = []
    for module, deps in sorted(imports.items()):
        mine = _owner(module, packages)
        for dep in sorted(deps):
            theirs = _owner(dep, packages)
            if theirs != mine and theirs not in rows[mine]:
                found.append(f"{module} imports {dep}: {theirs} is not in {mine}'s row of docs/layout.md")
    return found


def test_no_module_imports_a_package_its_row_does_not_list():
    assert _unlisted(_map(), _all_imports()) == []


def test_the_map_check_finds_an_import_its_row_does_not_list():
    rows = _map()
    rows["workers"] = rows["workers"] - {"compiler"}  # a row that forgot a floor its modules use
    unlisted = _unlisted(rows, _all_imports())
    assert unlisted and all(": compiler is not in workers's row" in u for u in unlisted), unlisted[:3]


def test_the_shared_vocabulary_lives_below_every_floor_that_speaks_it():
    assert (ROOT / "compiler" / "job.py").is_file() and not (ROOT / "workers" / "job.py").exists()
    users = [m for m, deps in _all_imports().items() if "compiler.job" in deps]
    assert {m.split(".")[0] for m in users} >= {"workers", "store", "orchestrator"}
    assert not [m for m, deps in _all_imports().items() if "workers.job" in deps]


ONE_THING_ONE_NAME = {
    "Limits": "a candidate's compile-time and memory limits",
    "AccuracyBudget": "an accuracy budget",
    "CellAccuracy": "a cell's accuracy judgement per budget",
    "StockUser": "a cell's stock PyTorch user",
    "SERVING_FILE": "an export's serving.json",
    "PRESETS_FILE": "a tune's presets.json",
    "TuneOptions": "a tune's options",
}
RETIRED = ("Budgets", "Budget", "CellBudgets", "PRESETS")
"""Names that meant two things; `PRESETS` stays importable from `compiler.serving` as a
deprecated alias (its module `__getattr__`), never defined."""


def _definitions() -> dict[str, list[str]]:
    """Top-level class and constant names -> the modules that define them."""
    found: dict[str, list[str]] = {}
    for top in PACKAGES:
        for path in sorted((ROOT / top).rglob("*.py")):
            for node in ast.parse(path.read_text()).body:
                if isinstance(node, ast.ClassDef):
                    names = [node.name]
                elif isinstance(node, (ast.Assign, ast.AnnAssign)):
                    targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                    names = [t.id for t in targets if isinstance(t, ast.Name)]
                else:
                    continue
                for name in names:
                    found.setdefault(name, []).append(path.relative_to(ROOT).as_posix())
    return found


def test_each_thing_has_one_name_defined_once():
    found = _definitions()
    for name in ONE_THING_ONE_NAME:
        assert len(found.get(name, [])) == 1, f"{name} is defined in {found.get(name)}"
    for name in RETIRED:
        assert name not in found, f"{name} is defined in {found[name]}"
