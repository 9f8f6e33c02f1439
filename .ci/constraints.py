"""Write constraints.txt: the version of every distribution the test command's install brought
(the project's core, its `test` extra and all they require, transitively), as installed in this
environment. Run it where `bash .ci/run` just passed, from the repository root:

    python .ci/constraints.py > constraints.txt

To move to newer versions: install without the constraints (`pip install -U torch==X -e '.[test]'`),
pass `bash .ci/run`'s tests, then regenerate. Local version labels are dropped (torch 2.13.0+cpu
pins torch==2.13.0, which a CUDA build of the same release also satisfies)."""

from __future__ import annotations

import re
import sys
from importlib import metadata
from pathlib import Path

import tomllib
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[1]
PROJECT = "compile-orchestrator"
HEADER = """\
# The versions the CI run of this project installed and passed its tests with (`bash .ci/run`
# installs with `-c constraints.txt`; so does deploy/kuberay/Dockerfile): the core, the fleet and
# hf extras, the test tools, and everything they require. Extras CI does not install (timm,
# torchvision, gpu) are not pinned here.
# Regenerate where `bash .ci/run` just passed: python .ci/constraints.py > constraints.txt
# (to move to newer versions, see .ci/constraints.py). Python {python}, {platform}.
"""


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def roots(extra: str = "test") -> list[Requirement]:
    """The project's requirements with `extra`, its own extras (compile-orchestrator[fleet,hf])
    expanded."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    optional = project["optional-dependencies"]
    found, todo, seen = [Requirement(r) for r in project["dependencies"]], [extra], set()
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        for text in optional[name]:
            req = Requirement(text)
            if _canonical(req.name) == PROJECT:
                todo += sorted(req.extras)
            else:
                found.append(req)
    return found


def closure(requirements: list[Requirement]) -> dict[str, str]:
    """canonical name -> installed version of every distribution `requirements` need here."""
    pins: dict[str, str] = {}
    todo = [(r, frozenset(r.extras)) for r in requirements]
    done: set[tuple[str, frozenset[str]]] = set()
    while todo:
        req, extras = todo.pop()
        key = (_canonical(req.name), extras)
        if key in done:
            continue
        done.add(key)
        dist = metadata.distribution(req.name)
        pins[key[0]] = dist.version.split("+")[0]
        for text in dist.requires or ():
            sub = Requirement(text)
            wanted = [{"extra": e} for e in extras] or [{"extra": ""}]
            if sub.marker is None or any(sub.marker.evaluate(env) for env in wanted):
                todo.append((sub, frozenset(sub.extras)))
    return pins


def main() -> None:
    pins = closure(roots())
    print(HEADER.format(python=".".join(map(str, sys.version_info[:3])), platform=sys.platform), end="")
    for name in sorted(pins):
        print(f"{name}=={pins[name]}")


if __name__ == "__main__":
    main()
