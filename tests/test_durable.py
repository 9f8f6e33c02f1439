"""`compiler.durable`: the one durable atomic write (tmp beside the target, fsync, rename, fsync of
the directory), and the house rule that every writer of results, presets, manifests, packages
and bundles uses it instead of a tmp + rename of its own."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pyarrow.fs as pafs
import pytest

from compiler import durable
from tests.counting_fs import counting

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def synced(monkeypatch) -> list[str]:
    """What os.fsync was called on, by path (the real fsync still runs)."""
    seen: list[str] = []
    real = os.fsync

    def fsync(fd: int) -> None:
        seen.append(os.readlink(f"/proc/self/fd/{fd}"))
        real(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    return seen


def test_a_write_is_fsynced_renamed_and_its_directory_fsynced(tmp_path, synced):
    target = tmp_path / "sub" / "presets.json"
    durable.write_text(target, "first")
    durable.write_bytes(target, b"second")
    assert target.read_bytes() == b"second" and os.listdir(target.parent) == ["presets.json"]
    # each write: its temporary file (gone now), then the directory that holds the new name
    assert len(synced) == 4 and synced[1] == synced[3] == str(target.parent)
    assert re.fullmatch(
        rf"{re.escape(str(target.parent))}/\.presets\.json\.\d+-[0-9a-f]+\.tmp( \(deleted\))?", synced[0]
    )
    assert oct(target.stat().st_mode & 0o777) == oct(0o666 & ~_umask())  # as a plain open() would make it


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def test_a_write_that_fails_keeps_the_old_file_and_leaves_no_temporary_one(tmp_path):
    target = tmp_path / "manifest.json"
    target.write_text("old")
    with pytest.raises(TypeError):
        durable.write_bytes(target, "not bytes")  # type: ignore[arg-type]
    with pytest.raises(RuntimeError), durable.atomic_path(target, suffix=".pt2") as tmp:
        tmp.write_text("half a package")
        raise RuntimeError("the package did not load")
    assert target.read_text() == "old" and os.listdir(tmp_path) == ["manifest.json"]


def test_a_file_written_by_someone_else_is_committed_whole(tmp_path, synced):
    target = tmp_path / "mlp.pt2"
    with durable.atomic_path(target, suffix=".pt2") as tmp:
        assert tmp.name.endswith(".pt2") and tmp.parent == tmp_path
        tmp.write_bytes(b"package")  # as torch's package writer writes to the name it is given
    assert target.read_bytes() == b"package" and synced[-1] == str(tmp_path)


def test_on_a_store_that_is_not_local_it_is_one_output_stream(tmp_path):
    fs, _ = counting(pafs.LocalFileSystem())  # a filesystem pyarrow does not know as local
    durable.write_bytes(str(tmp_path / "tune.json"), b"{}", filesystem=fs)
    assert (tmp_path / "tune.json").read_bytes() == b"{}"
    durable.write_bytes(str(tmp_path / "local.json"), b"{}", filesystem=pafs.LocalFileSystem())
    assert (tmp_path / "local.json").read_bytes() == b"{}"


# Renames that are not a writer's tmp + rename of a whole file, or are not yet moved here.
ALLOWED = {
    "compiler/durable.py": "the helper itself",
    "store/lock.py": "takes a stale lock over by renaming it aside, not a write",
    "compiler/isa_probe.py": "moves a whole folder of kept probe libraries into place (a cache: a lost one is rebuilt)",
    "store/sink.py": "the result sink: its own fsync'd rename of a Parquet part (its ledger work is elsewhere)",
    "workers/lanes.py": "puts a job's queue ticket, an empty lock file locked first, where others see it; not a write",
}


def test_every_writer_goes_through_the_durable_write():
    found = []
    for package in ("compiler", "orchestrator", "workers", "reports"):
        for path in sorted((ROOT / package).rglob("*.py")):
            rel = str(path.relative_to(ROOT))
            for n, line in enumerate(path.read_text().splitlines(), 1):
                if re.search(r"\bos\.(replace|rename)\(|\.rename\(", line) and rel not in ALLOWED:
                    found.append(f"{rel}:{n}: {line.strip()}")
    assert found == [], "write whole files with compiler.durable:\n" + "\n".join(found)
