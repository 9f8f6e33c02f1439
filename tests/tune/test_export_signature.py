"""Signed exports (`compiler.serving.signature`): `orchestrate export --sign-key-file` writes
`manifest.sig`, and a serving process that names the key serves only an export whose manifest
verifies with it. An unsigned export, one signed with another key, and a rewritten manifest whose
sha256 list is right for the files it lists but whose signature is not are refused with
`SignatureError`, whatever `strict` says; the key is written nowhere and said nowhere."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest

from compiler.serving import (
    KEY_ENV,
    MANIFEST,
    SIGNATURE,
    ExportError,
    PresetFallbackWarning,
    SignatureError,
    compile_tuned,
)
from compiler.serving.signature import key_id, write_signature
from orchestrator.cli import main
from tests.tune.test_apply_sources import rehash
from tests.tune.test_export_apply import results_dir, valid_bundle, write_export  # noqa: F401 (a fixture)
from workers import toy

KEY = b"4f1c9a7e0b2d8c6f5a3e1d9b7c5a3f1e"
OTHER = b"0123456789abcdef0123456789abcdef"


def signed(dest: Path, key: bytes = KEY) -> Path:
    """Sign the export at `dest` as `orchestrate export --sign-key-file` would."""
    write_signature(dest, (dest / MANIFEST).read_bytes(), key)
    return dest


def serve(source, **kwargs):
    """compile_tuned for the toy mlp bs4 without running it: (applied, the warnings' messages)."""
    model, inputs = toy.mlp(4)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        compiled, applied = compile_tuned(
            model, inputs, source, model_name="mlp", run_example=False, **kwargs
        )
    assert compiled is not model
    return applied, [str(w.message) for w in seen if issubclass(w.category, PresetFallbackWarning)]


def key_file(tmp_path: Path, key: bytes = KEY) -> Path:
    path = tmp_path / "export.key"
    path.write_bytes(key + b"\n")  # as `print(secrets.token_hex(32)) > FILE` writes it
    return path


def test_a_signed_export_is_served_with_the_key_named_every_way(tmp_path, monkeypatch):
    dest = signed(write_export(tmp_path / "exp", bundle=valid_bundle()))
    sig = json.loads((dest / SIGNATURE).read_text())
    assert sig["algorithm"] == "hmac-sha256" and sig["key_id"] == key_id(KEY) and len(sig["signature"]) == 64
    monkeypatch.delenv(KEY_ENV, raising=False)
    monkeypatch.setenv("COMPILE_ORCHESTRATOR_CACHE", str(tmp_path / "cache"))
    applied, warned = serve(dest, trusted_key=KEY)
    assert applied.signed_by == key_id(KEY) and applied.match == "exact" and applied.bundle == "loaded"
    assert warned == []
    assert serve(dest, trusted_key_file=key_file(tmp_path))[0].signed_by == key_id(KEY)
    monkeypatch.setenv(KEY_ENV, str(key_file(tmp_path)))
    assert serve(dest)[0].signed_by == key_id(KEY)
    assert serve(f"file://{dest}")[0].signed_by == key_id(KEY)  # at a URI: the signature fetched beside it


def test_without_a_key_the_sha256_manifest_is_all_that_is_checked(tmp_path, monkeypatch):
    monkeypatch.delenv(KEY_ENV, raising=False)
    dest = write_export(tmp_path / "exp", bundle=valid_bundle())
    applied, warned = serve(dest)
    assert applied.signed_by is None and applied.match == "exact" and warned == []
    assert serve(signed(dest))[0].signed_by is None  # a signature nobody asks for is not read


@pytest.mark.parametrize("uri", [False, True], ids=["directory", "file URI"])
def test_an_unsigned_export_is_refused_when_the_serving_side_names_a_key(tmp_path, monkeypatch, uri):
    monkeypatch.setenv("COMPILE_ORCHESTRATOR_CACHE", str(tmp_path / "cache"))
    dest = write_export(tmp_path / "exp", bundle=valid_bundle())
    source = f"file://{dest}" if uri else dest
    for strict in (False, True):  # never a fallback: nothing of the export is trusted
        with pytest.raises(
            SignatureError, match=f"{SIGNATURE}: missing: the export is not signed, and this "
        ):
            serve(source, trusted_key=KEY, strict=strict)


def test_an_export_signed_with_another_key_is_refused(tmp_path):
    dest = signed(write_export(tmp_path / "exp"), OTHER)
    with pytest.raises(
        SignatureError, match=f"signed with key {key_id(OTHER)}, this process trusts key {key_id(KEY)}"
    ):
        serve(dest, trusted_key=KEY)


def test_a_rewritten_manifest_with_a_right_sha256_list_is_refused(tmp_path):
    """What the sha256 manifest alone cannot stop: someone who can write the export replaces the
    bundle and writes its sha256 into the manifest. Every file matches the manifest; the
    manifest no longer matches its signature, whose key they do not have."""
    dest = signed(write_export(tmp_path / "exp", bundle=valid_bundle()))
    assert serve(dest, trusted_key=KEY)[0].bundle == "loaded"
    (dest / "bundles" / "mlp.bin").write_bytes(b"their own bundle")
    rehash(dest)
    assert serve(dest)[0].match == "exact"  # without a key: the manifest is believed
    with pytest.raises(
        SignatureError, match="the signature does not match .*manifest.json: the manifest was"
    ):
        serve(dest, trusted_key=KEY)
    # nor does a signature file they write themselves, with the right key's id and a made-up MAC
    sig = json.loads((dest / SIGNATURE).read_text())
    (dest / SIGNATURE).write_text(json.dumps({**sig, "signature": "0" * 64}))
    with pytest.raises(SignatureError, match="the signature does not match"):
        serve(dest, trusted_key=KEY)
    (dest / SIGNATURE).write_text("not JSON")
    with pytest.raises(SignatureError, match="not a signature this code reads"):
        serve(dest, trusted_key=KEY)


def test_a_key_named_but_unusable_is_an_error_not_an_unchecked_export(tmp_path, monkeypatch):
    dest = signed(write_export(tmp_path / "exp"))
    monkeypatch.setenv(KEY_ENV, str(tmp_path / "missing.key"))
    with pytest.raises(ExportError, match="missing.key: cannot read the export key \\(No such file"):
        serve(dest)
    with pytest.raises(ExportError, match="short.key: 5 bytes is not an export key \\(at least 16"):
        serve(dest, trusted_key_file=key_file(tmp_path, b"short").rename(tmp_path / "short.key"))
    with pytest.raises(TypeError, match="the export key is bytes, not str"):
        serve(dest, trusted_key=KEY.decode())


def test_the_key_is_said_nowhere(tmp_path):
    dest = signed(write_export(tmp_path / "exp", bundle=valid_bundle()))
    applied, _ = serve(dest, trusted_key=KEY)
    said = [json.dumps(applied.to_dict())]
    for key in (OTHER, b"x" * 16):
        with pytest.raises(SignatureError) as caught:
            serve(dest, trusted_key=key)
        said.append(str(caught.value))
    (dest / "serving.json").write_text("{}")
    with pytest.raises(ExportError) as caught:
        serve(dest, trusted_key=KEY, strict=True)
    said.append(str(caught.value))
    files = b"".join(p.read_bytes() for p in dest.rglob("*") if p.is_file())
    for key in (KEY, OTHER):
        assert key not in files and all(key.decode() not in text for text in said)


def test_orchestrate_export_signs_with_the_key_file_and_refuses_an_unusable_one(
    results_dir,  # noqa: F811 (the fixture imported above)
    tmp_path,
    capsys,
    monkeypatch,
):
    """The export of two finished presets (as an interrupted export left them: nothing to compile)
    signed through the CLI, the key's file read before anything else; then served with that key."""
    from orchestrator.tune.export import PROGRESS, plan_export

    monkeypatch.delenv(KEY_ENV, raising=False)
    dest = tmp_path / "dest"
    args = ["export", str(results_dir), "--hardware", "cpu", "--dest", str(dest)]
    assert main([*args, "--sign-key-file", str(tmp_path / "none.key")]) == 2
    assert "none.key: cannot read the export key" in capsys.readouterr().err and not dest.exists()
    (dest / "bundles").mkdir(parents=True)
    finished = []
    for entry in plan_export(results_dir, "cpu")[0]:
        name = f"bundles/{entry['model']}.bin"
        (dest / name).write_bytes(valid_bundle())
        finished.append({**entry, "bundle": name, "package": None})
    key = {"source": str(results_dir), "hardware": "cpu", "packages": True}
    (dest / PROGRESS).write_text(json.dumps({"key": key, "entries": finished}))
    assert main([*args, "--resume", "--sign-key-file", str(key_file(tmp_path))]) == 0
    out = capsys.readouterr().out
    assert f"manifest.json, manifest.sig (key {key_id(KEY)})" in out and KEY.decode() not in out
    assert SIGNATURE not in json.loads((dest / MANIFEST).read_text())["files"]
    applied, _ = serve(dest, trusted_key=KEY)
    assert applied.signed_by == key_id(KEY) and applied.bundle == "loaded"
