"""`compile_tuned` on exports it must not trust or must not fetch twice: manifests and presets of
the wrong shape fall back (or raise ExportError under strict), never AttributeError or
TypeError; paths stay inside the export; an export at a URI (file://, and S3 over HTTP through a
moto server) is fetched once into the content-addressed cache, counted where the bytes cross
(`tests.counting_fs`, a real pyarrow filesystem), in this process and in a fresh one."""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
import tempfile
import warnings
from pathlib import Path

import pyarrow.fs as pafs
import pytest

from compiler.serving import (
    CACHE_ENV,
    MANIFEST,
    SERVING_FILE,
    ExportCacheWarning,
    ExportError,
    PresetFallbackWarning,
    cache_root,
    compile_tuned,
    sha256_file,
)
from tests.counting_fs import counting
from tests.tune.test_export_apply import valid_bundle, write_export
from workers import toy

ROOT = Path(__file__).resolve().parents[2]
SERVED = [MANIFEST, SERVING_FILE, "bundles/mlp.bin", "packages/mlp.pt2"]
"""The files of the export that serving the toy mlp bs4 may read: never the other model's."""


def rehash(dest: Path) -> None:
    """Rewrite the manifest's sha256 of every file, as an export (or someone with write access) would."""
    manifest = json.loads((dest / MANIFEST).read_text())
    manifest["files"] = {
        str(p.relative_to(dest)): sha256_file(p)
        for p in sorted(dest.rglob("*"))
        if p.is_file() and p.name != MANIFEST
    }
    (dest / MANIFEST).write_text(json.dumps(manifest))


def two_model_export(dest: Path) -> Path:
    """The toy mlp's export (`write_export`, with a bundle and a package) plus a second model's
    preset whose files are ten times larger."""
    write_export(dest, bundle=valid_bundle(), package=b"mlp package " * 1000)
    presets = json.loads((dest / SERVING_FILE).read_text())
    presets["presets"].append(
        {
            **presets["presets"][0],
            "model": "other",
            "bundle": "bundles/other.bin",
            "package": "packages/other.pt2",
        }
    )
    (dest / SERVING_FILE).write_text(json.dumps(presets))
    (dest / "bundles" / "other.bin").write_bytes(os.urandom(100_000))
    (dest / "packages" / "other.pt2").write_bytes(os.urandom(100_000))
    rehash(dest)
    return dest


def serve(source, category=PresetFallbackWarning, model_name="mlp", **kwargs):
    """compile_tuned for the toy mlp bs4, without running it (the package is not a real one: it is
    fetched and verified, fails to load, and the preset compiles from the bundle)."""
    model, inputs = toy.mlp(4)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        _, applied = compile_tuned(model, inputs, source, model_name=model_name, run_example=False, **kwargs)
    return applied, [str(w.message) for w in seen if issubclass(w.category, category)]


def _fallback(dest: Path, match: str) -> None:
    applied, warned = serve(dest)
    assert len(warned) == 1 and re.search(match, warned[0]), warned
    assert applied.match == "fallback" and applied.config is None
    model, inputs = toy.mlp(4)
    with pytest.raises(ExportError, match=match):
        compile_tuned(model, inputs, dest, model_name="mlp", run_example=False, strict=True)


def _valid_manifest(dest: Path) -> dict:
    return json.loads((dest / MANIFEST).read_text())


MANIFESTS = {
    "null": (lambda m: None, "a manifest is a JSON object, this is null"),
    "a list": (lambda m: [], "this is a JSON list"),
    "files as a list": (lambda m: {**m, "files": list(m["files"])}, "`files` must map each file"),
    "no files": (lambda m: {k: v for k, v in m.items() if k != "files"}, "`files` must map"),
    "a digest that is no sha256": (lambda m: {**m, "files": {SERVING_FILE: "abc"}}, "`files` must map"),
    "no hardware": (lambda m: {k: v for k, v in m.items() if k != "hardware"}, "`hardware`"),
    "the stack as a string": (lambda m: {**m, "stack": "torch"}, "`stack`"),
    "another format": (lambda m: {**m, "format": 3}, "format 3, this code reads 1 and 2"),
    "a path that climbs out": (
        lambda m: {**m, "files": {**m["files"], "../x": "0" * 64}},
        "'../x' is not inside",
    ),
    "an absolute path": (
        lambda m: {**m, "files": {**m["files"], "/etc/hostname": "0" * 64}},
        "is not inside",
    ),
    "a path through ..": (
        lambda m: {**m, "files": {**m["files"], "bundles/../x": "0" * 64}},
        "is not inside",
    ),
}


@pytest.mark.parametrize("case", list(MANIFESTS))
def test_a_manifest_it_cannot_use_falls_back_or_raises_export_error(tmp_path, case):
    change, match = MANIFESTS[case]
    dest = write_export(tmp_path / "exp")
    (dest / MANIFEST).write_text(json.dumps(change(_valid_manifest(dest))))
    _fallback(dest, match)


def _entry(p: dict) -> dict:
    return p["presets"][0]


PRESET_FILES = {
    "null": (lambda p: None, "presets are a JSON object, this is null"),
    "a list": (lambda p: [], "this is a JSON list"),
    "presets as an object": (lambda p: {**p, "presets": {}}, "`presets` must be a list"),
    "an entry that is a string": (lambda p: {**p, "presets": ["mlp"]}, r"presets\[0\]: the entry itself"),
    "no compile": (
        lambda p: {**p, "presets": [{k: v for k, v in _entry(p).items() if k != "compile"}]},
        "compile",
    ),
    "compile as a list": (lambda p: {**p, "presets": [{**_entry(p), "compile": []}]}, "compile missing or"),
    "a bundle that is a number": (
        lambda p: {**p, "presets": [{**_entry(p), "bundle": 5}]},
        "bundle missing or",
    ),
    "a class default without compile": (
        lambda p: {**p, "defaults": {"fp32": {"dtype": "fp32"}}},
        "defaults.fp32: compile missing or",
    ),
    "a compile field it does not know": (
        lambda p: {**p, "presets": [{**_entry(p), "compile": {**_entry(p)["compile"], "turbo": True}}]},
        r"compile fields unknown \(turbo\)",
    ),
    "options as a list": (
        lambda p: {**p, "presets": [{**_entry(p), "compile": {**_entry(p)["compile"], "options": []}}]},
        r"of the wrong type \(options\)",
    ),
    "an unknown runtime setting": (
        lambda p: {**p, "presets": [{**_entry(p), "compile": {**_entry(p)["compile"], "runtime": {"x": 1}}}]},
        "unknown runtime setting 'x'",
    ),
    "an unknown precision": (
        lambda p: {**p, "presets": [{**_entry(p), "precision": "fp8"}]},
        "unknown precision 'fp8'",
    ),
}


@pytest.mark.parametrize("case", list(PRESET_FILES))
def test_presets_it_cannot_use_fall_back_or_raise_export_error(tmp_path, case):
    change, match = PRESET_FILES[case]
    dest = write_export(tmp_path / "exp")
    (dest / SERVING_FILE).write_text(json.dumps(change(json.loads((dest / SERVING_FILE).read_text()))))
    rehash(dest)  # hashed as an export would: the shape, not the digest, is what is wrong
    _fallback(dest, match)


def test_a_class_default_as_the_export_writes_it_serves_a_model_never_swept(tmp_path):
    dest = write_export(tmp_path / "exp")
    presets = json.loads((dest / SERVING_FILE).read_text())
    compile_args = presets["defaults"]["fp32"]["compile"]
    # as orchestrator.tune.presets.class_defaults writes it: no model, batch size or files
    presets["defaults"]["fp32"] = {"dtype": "fp32", "config": "cdt", "compile": compile_args, "cells": 2}
    (dest / SERVING_FILE).write_text(json.dumps(presets))
    rehash(dest)
    applied, warned = serve(dest, model_name="never-swept")
    assert applied.match == "class_default" and applied.config["name"] == "cdt" and warned == []


def test_a_preset_file_outside_the_export_is_never_read(tmp_path):
    dest = write_export(tmp_path / "exp", bundle=b"inside")
    secret = tmp_path / "secret.bin"
    secret.write_bytes(b"outside the export")
    presets = json.loads((dest / SERVING_FILE).read_text())
    presets["presets"][0]["bundle"] = "../secret.bin"  # not listed in the manifest
    (dest / SERVING_FILE).write_text(json.dumps(presets))
    rehash(dest)
    applied, warned = serve(dest)
    assert applied.bundle == "refused" and any(
        "'../secret.bin' is not inside the export" in w for w in warned
    )
    # listed with its true digest: the whole manifest is refused
    manifest = _valid_manifest(dest)
    manifest["files"]["../secret.bin"] = sha256_file(secret)
    (dest / MANIFEST).write_text(json.dumps(manifest))
    _fallback(dest, "'../secret.bin' is not inside the export")
    # a link inside the export that leads out of it, with the digest of what it leads to
    (dest / "bundles" / "mlp.bin").unlink()
    (dest / "bundles" / "mlp.bin").symlink_to(secret)
    manifest["files"] = {**manifest["files"], "bundles/mlp.bin": sha256_file(secret)}
    del manifest["files"]["../secret.bin"]
    (dest / MANIFEST).write_text(json.dumps(manifest))
    presets["presets"][0]["bundle"] = "bundles/mlp.bin"
    (dest / SERVING_FILE).write_text(json.dumps(presets))
    manifest["files"][SERVING_FILE] = sha256_file(dest / SERVING_FILE)
    (dest / MANIFEST).write_text(json.dumps(manifest))
    applied, warned = serve(dest)
    assert applied.bundle == "refused" and any("a link out of the export" in w for w in warned)


def test_a_bundle_torch_refuses_is_reported_refused_not_loaded(tmp_path):
    """A bundle replaced and its new sha256 written into the manifest passes the export's checks;
    torch then refused it ("checksum does not match", logged) and `Applied` said `loaded`. Its
    container's own checksum is checked now before torch reads it (`compiler.serving.bundle_check`)."""
    dest = write_export(tmp_path / "exp", bundle=valid_bundle())
    assert serve(dest)[0].bundle == "loaded"
    damaged = bytearray(valid_bundle())
    damaged[-1] ^= 0xFF  # the last byte of the payload: torch's checksum no longer matches
    (dest / "bundles" / "mlp.bin").write_bytes(bytes(damaged))
    rehash(dest)
    applied, warned = serve(dest)
    assert applied.bundle == "refused" and applied.cache_artifacts == {}
    assert any(
        "the bundle's own checksum does not match its bytes" in w and "compiling without the bundle" in w
        for w in warned
    )
    model, inputs = toy.mlp(4)
    with pytest.raises(ExportError, match="bundles/mlp.bin: the bundle's own checksum does not match"):
        compile_tuned(model, inputs, dest, model_name="mlp", run_example=False, strict=True)


def test_the_cache_directory_follows_xdg_and_the_environment_variable(monkeypatch, tmp_path):
    monkeypatch.delenv(CACHE_ENV, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_root() == tmp_path / "xdg" / "compile-orchestrator"
    monkeypatch.setenv("XDG_CACHE_HOME", "relative")  # the spec says to ignore a relative one
    assert cache_root() == Path.home() / ".cache" / "compile-orchestrator"
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "moved"))
    assert cache_root() == tmp_path / "moved"


# --- from a URI, through the cache --------------------------------------------------------------


@pytest.fixture
def isolated(tmp_path, monkeypatch):
    """The export cache and the temporary directory of this process, both empty and watched.
    Inductor's own cache directory is named apart: by default it lies in the temporary directory
    (and a fresh process inherits this one's), which the test watches for the export's leftovers."""
    cache, scratch = tmp_path / "cache", tmp_path / "scratch"
    scratch.mkdir()
    monkeypatch.setenv(CACHE_ENV, str(cache))
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    return cache, scratch


@pytest.fixture(params=["file", "s3"])
def remote(request, tmp_path):
    """(inner filesystem, path of the export in it, its URI, how to build the filesystem in a
    fresh process) for the two-model export, on the local filesystem or on a moto S3 server."""
    dest = two_model_export(tmp_path / "exp")
    if request.param == "file":
        return pafs.LocalFileSystem(), str(dest), f"file://{dest}", "pafs.LocalFileSystem()"
    bucket = request.getfixturevalue("s3_bucket")
    build = (
        "pafs.S3FileSystem(access_key='testing', secret_key='testing', region='us-east-1', "
        f"endpoint_override={bucket.endpoint!r}, scheme='http')"
    )
    s3 = eval(build)  # the same construction as the fresh process's
    pafs.copy_files(str(dest), f"{bucket.name}/exp", destination_filesystem=s3)
    return s3, f"{bucket.name}/exp", bucket.uri("exp"), build


def _sizes(fs: pafs.FileSystem, root: str, rels: list[str]) -> int:
    return sum(fs.get_file_info(f"{root}/{rel}").size for rel in rels)


FRESH = """
import json, sys, warnings
import pyarrow.fs as pafs
from compiler.serving import compile_tuned
from tests.counting_fs import counting
from workers import toy
fs, counter = counting({build})
model, inputs = toy.mlp(4)
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    _, applied = compile_tuned(model, inputs, sys.argv[1], model_name="mlp", run_example=False, filesystem=fs)
print(json.dumps({{"bytes": counter.bytes_read, "match": applied.match, "bundle": applied.bundle}}))
"""


def _fresh_process(build: str, path: str, cache: Path, scratch: Path) -> dict:
    env = {**os.environ, CACHE_ENV: str(cache), "TMPDIR": str(scratch), "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        [sys.executable, "-c", FRESH.format(build=build), path],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _no_leftovers(cache: Path, scratch: Path) -> None:
    assert list(scratch.iterdir()) == []  # no temporary directory, no temporary file
    assert [p.name for p in cache.rglob(".*")] == []  # no half-written cache entry


def test_an_export_at_a_uri_is_fetched_once_then_served_from_the_cache(remote, isolated):
    inner, root, _, build = remote
    cache, scratch = isolated
    fs, counter = counting(inner)
    applied, _ = serve(root, filesystem=fs)
    assert applied.match == "exact" and applied.bundle == "loaded" and applied.package == "failed"
    # the manifest and presets.json, then only the mlp's bundle and package
    assert sorted(counter.opened) == sorted(f"{root}/{rel}" for rel in SERVED)
    assert counter.bytes_read == _sizes(inner, root, SERVED)
    _no_leftovers(cache, scratch)

    before = counter.bytes_read
    applied, _ = serve(root, filesystem=fs)  # a second call in this process: nothing transferred
    assert counter.bytes_read == before and applied.bundle == "loaded"
    fresh = _fresh_process(build, root, cache, scratch)  # a new process: nothing transferred either
    assert fresh == {"bytes": 0, "match": "exact", "bundle": "loaded"}
    _no_leftovers(cache, scratch)


def test_a_damaged_cache_entry_is_fetched_again_not_trusted(remote, isolated):
    inner, root, _, _ = remote
    cache, _ = isolated
    fs, counter = counting(inner)
    serve(root, filesystem=fs)
    bundle_sha = json.loads(inner.open_input_stream(f"{root}/{MANIFEST}").read())["files"]["bundles/mlp.bin"]
    entry = cache / "exports" / "sha256" / bundle_sha[:2] / bundle_sha
    assert hashlib.sha256(entry.read_bytes()).hexdigest() == bundle_sha
    entry.write_bytes(b"flipped on disk")
    before = counter.bytes_read
    applied, warned = serve(root, filesystem=fs)
    assert applied.bundle == "loaded" and not [w for w in warned if "sha256" in w]
    assert counter.bytes_read - before == _sizes(inner, root, ["bundles/mlp.bin"])  # that file only
    assert hashlib.sha256(entry.read_bytes()).hexdigest() == bundle_sha  # and the entry is whole again


def test_a_uri_string_is_served_from_the_cache_once_fetched(remote, isolated):
    """The URI as a server passes it (no filesystem given): once cached, the export's files other
    than its manifest can vanish from the store and a fresh process still serves the preset."""
    inner, root, uri, _ = remote
    cache, scratch = isolated
    applied, _ = serve(uri)
    assert applied.match == "exact" and applied.bundle == "loaded"
    for rel in SERVED[1:]:
        inner.delete_file(f"{root}/{rel}")
    applied, warned = serve(uri)
    assert (
        applied.match == "exact" and applied.bundle == "loaded" and not [w for w in warned if "cannot" in w]
    )
    env = {**os.environ, CACHE_ENV: str(cache), "TMPDIR": str(scratch), "PYTHONPATH": str(ROOT)}
    code = (
        "import sys, warnings; warnings.simplefilter('ignore')\n"
        "from compiler.serving import compile_tuned\nfrom workers import toy\n"
        "m, x = toy.mlp(4)\n_, a = compile_tuned(m, x, sys.argv[1], model_name='mlp', run_example=False)\n"
        "print(a.match, a.bundle)\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code, uri], cwd=ROOT, env=env, capture_output=True, text=True
    )
    assert proc.returncode == 0 and proc.stdout.split() == ["exact", "loaded"], proc.stderr[-3000:]
    _no_leftovers(cache, scratch)


def test_a_rewritten_manifest_is_fetched_again(tmp_path, isolated):
    dest = two_model_export(tmp_path / "exp")
    fs, counter = counting(pafs.LocalFileSystem())
    serve(str(dest), filesystem=fs)
    manifest = _valid_manifest(dest)
    manifest["note"] = "exported again"
    (dest / MANIFEST).write_text(json.dumps(manifest))
    before = counter.bytes_read
    applied, _ = serve(str(dest), filesystem=fs)
    assert applied.bundle == "loaded" and counter.bytes_read - before == (dest / MANIFEST).stat().st_size


def test_a_cache_that_cannot_be_written_warns_and_serves_from_memory(tmp_path, monkeypatch):
    dest = two_model_export(tmp_path / "exp")
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    monkeypatch.setenv(CACHE_ENV, str(blocker / "cache"))
    applied, warned = serve(f"file://{dest}", ExportCacheWarning)
    assert warned and all(re.search(f"cannot write the export cache .*set {CACHE_ENV}", w) for w in warned)
    assert applied.match == "exact" and applied.bundle == "loaded"
