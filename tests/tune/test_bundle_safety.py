"""Bundles that cannot hurt a serving process: a compile-cache bundle whose bytes match the
manifest (as after someone rewrote it) but that torch's loader cannot take is refused before torch
reads it (`compiler.serving.bundle_check`) or, where torch's loader raises, refused all the same: a warning
and the preset compiled without it, `ExportError` under `strict`. The containers are made with
torch's own writer (`BytesWriter`, checksum included), as a rewritten export would hold them; the
fallback runs in a fresh process, timed and its memory measured."""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from torch.utils._appending_byte_serializer import AppendingByteSerializer, BytesWriter

from compiler import torch_private
from compiler.serving import ExportError, PresetFallbackWarning, compile_tuned
from compiler.serving.bundle_check import check_bundle
from tests.tune.test_export_apply import write_export
from workers import toy

ROOT = Path(__file__).resolve().parents[2]
KEY = "fbadc0ffee0ba5e0f0000000000000000000000000000000000000000000"
"""An artifact key of the form Inductor's are (a hash in base32): no compile of the toy mlp looks it up."""
LIMIT_S = 30.0
LIMIT_RSS = 1 << 30


def container(sections: list[tuple[str, list[tuple[str, bytes]]]], version: int = 1) -> bytes:
    """A bundle container as `torch.compiler.save_cache_artifacts` writes one: torch's own writer,
    its checksum over the rest."""
    writer = BytesWriter()
    writer.write_uint64(version)
    for kind, artifacts in sections:
        writer.write_str(kind)
        writer.write_uint64(len(artifacts))
        for key, content in artifacts:
            writer.write_str(key)
            writer.write_bytes(content)
    return writer.to_bytes()


def rechecksummed(body: bytes) -> bytes:
    """`body` (a container without its checksum) with a checksum that matches it."""
    import zlib

    return zlib.crc32(body).to_bytes(4, "big") + body


def written(*items) -> bytes:
    """A container of format 1 holding `items` as torch's writer writes them: each value after
    its kind (`int`: a count or length; `str`: text, base64 of UTF-8; `bytes`: a length, then them)."""
    writer = BytesWriter()
    writer.write_uint64(1)
    write = {int: writer.write_uint64, str: writer.write_str, bytes: writer.write_bytes}
    for kind, value in zip(items[::2], items[1::2], strict=True):
        write[kind](value)
    return writer.to_bytes()


GRAPH = pickle.dumps({"source": "x" * 50_000, "guards": list(range(2000))})
"""A pickle of the size and shape of a small compiled graph's entry."""
GENUINE = container(
    [
        ("inductor", [(KEY, GRAPH)]),
        ("aot_autograd", [(KEY[::-1], GRAPH)]),
        ("autotune", [("ab/c.best_config", b"{}")]),
    ]
)
NOT_PICKLES = container(
    [("inductor", [(KEY, b"these bytes are not a pickle")]), ("aot_autograd", [(KEY, b"nor")])]
)
CUT_SHORT = rechecksummed(GENUINE[4 : len(GENUINE) // 4])
"""The genuine container cut in the middle of its first artifact, its checksum made again."""


def test_the_bundle_format_is_what_torch_writes_on_this_torch():
    """BUNDLE_FORMAT (`compiler.torch_private`): the version and checksum of torch's own writer,
    and the artifact types its loader registers, every one of which the check knows how to read."""
    from compiler.serving.bundle_check import JSON, PICKLED

    version, checksum, types = torch_private.bundle_format()
    assert (version, checksum) == (1, 4) and container([])[checksum:] == version.to_bytes(8, "big")
    assert types == PICKLED | JSON


def test_a_container_as_torch_writes_it_passes():
    assert check_bundle(GENUINE, "b.bin").artifacts == {"inductor": 1, "aot_autograd": 1, "autotune": 1}
    assert check_bundle(container([]), "b.bin").artifacts == {}  # nothing in it: torch loads nothing


@pytest.mark.parametrize(
    "data, message",
    [
        (
            NOT_PICKLES,
            "inductor artifact fbad.* is not a pickle stream \\(ValueError: at position \\d+, opcode b. . unknown",
        ),
        (
            CUT_SHORT,
            "the content of inductor artifact fbad.* claims \\d+ bytes, \\d+ remain \\(the file is cut short\\)",
        ),
        (GENUINE[:-1], "the bundle's own checksum does not match its bytes"),
        (container([], version=2), "bundle format 2, this torch reads 1"),
        (container([("inductor", [(KEY, GRAPH + b"\0")])]), "1 bytes follow the pickle's STOP"),
        (container([("autotune", [("ab/c.best_config", b"[not json")])]), "autotune artifact .* is not JSON"),
        (container([("autotune", [("ab/c.best_config", b"[1]")])]), "is JSON but not an object"),
        (
            container([("macro", [(KEY, GRAPH)])]),
            "unknown artifact type 'macro' \\(this torch loads aot_autograd, ",
        ),
        (
            container([("inductor", [("../../../.bashrc", GRAPH)])]),
            "artifact key '../../../.bashrc' is not a relative",
        ),
        (
            container([("precompile", [("/etc/cron.d/x", GRAPH)])]),
            "artifact key '/etc/cron.d/x' is not a relative",
        ),
        (container([("inductor", [("a//b", GRAPH)])]), "artifact key 'a//b' is not a relative"),
        (rechecksummed(GENUINE[4:-1]), "autotune artifact ab/c.best_config claims 2 bytes, 1 remain"),
        (rechecksummed(GENUINE[4:] + b"\0" * 7), "the length of an artifact type needs 8 bytes, 7 remain"),
        (
            written(str, "inductor", int, 2**63),
            "9223372036854775808 inductor artifacts cannot fit in the 0 bytes",
        ),
        (written(bytes, b"@@@@"), "an artifact type is not base64"),
        (b"\0\0", "2 bytes is too short for a compile-cache bundle"),
    ],
    ids=[
        "not pickles",
        "cut short",
        "checksum",
        "version",
        "after STOP",
        "autotune not JSON",
        "autotune a list",
        "unknown type",
        "key climbs out",
        "absolute key",
        "empty name in key",
        "last artifact cut",
        "trailing bytes",
        "absurd count",
        "type not base64",
        "too short",
    ],
)
def test_a_container_torch_would_choke_on_is_refused_with_what_is_wrong(data, message):
    with pytest.raises(ExportError, match=f"^b.bin: .*{message}"):
        check_bundle(data, "b.bin")


def test_torchs_own_reader_never_ends_on_the_container_cut_short():
    """Why the check comes first: torch's reader, given CUT_SHORT, reads past its end and takes an
    empty section there again and again (stopped here after 1000 of the container's 3)."""
    from torch.compiler._cache import _deserialize_single_cache

    torch_private.bundle_format()  # the artifact types registered, as torch's loader does first
    calls = []

    def bounded(reader):
        calls.append(reader)
        if len(calls) == 1000:
            raise StopIteration
        return _deserialize_single_cache(reader)

    with pytest.raises(StopIteration):
        AppendingByteSerializer.to_list(CUT_SHORT, deserialize_fn=bounded)
    assert len(calls) == 1000


def test_whatever_torchs_loader_raises_is_a_refusal(tmp_path, monkeypatch):
    """A container that passes the check, whose Inductor artifact is a pickle of the wrong thing:
    torch's loader unpickles it at load and raises AttributeError; `compile_tuned` warns and
    compiles without the bundle (ExportError under strict)."""
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    dest = write_export(tmp_path / "exp", bundle=container([("inductor", [(KEY, pickle.dumps(42))])]))
    model, inputs = toy.mlp(4)
    with pytest.warns(
        PresetFallbackWarning, match="bundles/mlp.bin: torch's loader failed on it \\(AttributeError: "
    ):
        compiled, applied = compile_tuned(model, inputs, dest, model_name="mlp", run_example=False)
    assert applied.bundle == "refused" and applied.match == "exact" and compiled is not model
    with pytest.raises(ExportError, match="torch's loader failed on it"):
        compile_tuned(model, inputs, dest, model_name="mlp", run_example=False, strict=True)


def test_on_an_unchecked_torch_no_bundle_is_loaded(tmp_path, monkeypatch):
    """BUNDLE_FORMAT (`compiler.torch_private`) on a release nobody checked: the bundle is not
    loaded (torch's reader might loop on it), and the warning says why and what to do."""
    monkeypatch.delenv(torch_private.UNCHECKED_ENV, raising=False)
    monkeypatch.setattr(torch_private, "torch_version", lambda: "2.99.0")
    dest = write_export(tmp_path / "exp", bundle=GENUINE)
    model, inputs = toy.mlp(4)
    with pytest.warns(
        PresetFallbackWarning, match="cannot check the bundle on this torch, so it is not loaded: torch"
    ):
        _, applied = compile_tuned(model, inputs, dest, model_name="mlp", run_example=False)
    assert applied.bundle == "refused" and "checked on torch 2.11, 2.13" in applied.warnings[0]


SERVE_BOUNDED = """
import json, resource, sys, time, warnings, torch
from compiler.serving import ExportError, compile_tuned
from workers import toy
model, inputs = toy.mlp(4)
with torch.no_grad():
    expected = model(**inputs)
t0 = time.monotonic()
with warnings.catch_warnings(record=True) as seen:
    warnings.simplefilter("always")
    served, applied = compile_tuned(model, inputs, sys.argv[1], model_name="mlp")
with torch.no_grad():
    same = bool(torch.allclose(served(**inputs), expected, atol=1e-5))
fallback_s = time.monotonic() - t0
try:
    compile_tuned(model, inputs, sys.argv[1], model_name="mlp", strict=True)
    strict = None
except ExportError as exc:
    strict = str(exc)
print(json.dumps({"bundle": applied.bundle, "match": applied.match, "same": same, "strict": strict,
                  "warned": [str(w.message) for w in seen], "fallback_s": fallback_s,
                  "peak_rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}))
"""


def run_bounded(args: list[str], env: dict[str, str]) -> tuple[dict, float, int]:
    """Run `python -c SERVE_BOUNDED ARGS` in a fresh process, killed past LIMIT_S or once its
    resident memory passes LIMIT_RSS: (what it printed, its wall time, its peak resident memory in
    bytes, the larger of what psutil saw every 50 ms and what the process reports as its own peak)."""
    t0 = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, "-c", SERVE_BOUNDED, *args],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    peak = 0
    try:
        watched = psutil.Process(proc.pid)
        while proc.poll() is None:
            peak = max(peak, watched.memory_info().rss)
            assert peak <= LIMIT_RSS, f"{peak / 2**20:.0f} MiB resident: over the bound"
            assert time.monotonic() - t0 <= LIMIT_S, f"still running after {LIMIT_S} s"
            time.sleep(0.05)
    except psutil.NoSuchProcess:
        pass
    finally:
        if proc.poll() is None:
            proc.kill()
        out, err = proc.communicate()
    wall = time.monotonic() - t0
    assert proc.returncode == 0, err.decode()[-3000:]
    report = json.loads(out.decode().strip().splitlines()[-1])
    return report, wall, max(peak, report["peak_rss"])


@pytest.fixture(scope="module")
def inductor_cache(tmp_path_factory) -> Path:
    """An Inductor cache that holds the toy mlp's compile, made by serving an export without a
    bundle in a fresh process: the bounded runs below time the fallback, not a cold compile (which
    took 10-22 s on this 2-core machine, beside other tests). Nothing of a refused bundle is in it."""
    cache = tmp_path_factory.mktemp("inductor")
    plain = write_export(tmp_path_factory.mktemp("plain") / "exp")
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(cache)}
    done = subprocess.run(
        [sys.executable, "-c", SERVE_BOUNDED, str(plain)], cwd=ROOT, env=env, capture_output=True, timeout=300
    )
    assert done.returncode == 0, done.stderr.decode()[-3000:]
    assert json.loads(done.stdout.decode().strip().splitlines()[-1])["same"] is True
    return cache


@pytest.mark.integration
@pytest.mark.parametrize("bundle", [NOT_PICKLES, CUT_SHORT], ids=["not pickles", "cut short"])
def test_a_damaged_bundle_falls_back_in_bounded_time_and_memory(tmp_path, inductor_cache, bundle):
    """Each case in a fresh process, from the toy mlp's preset's bundle to the served model's
    first output: without the check the first raised UnpicklingError out of compile_tuned and the
    second looped in torch's reader, its memory growing ~90 MB/s."""
    dest = write_export(tmp_path / "exp", bundle=bundle)
    cache = inductor_cache
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(cache)}
    report, wall, peak = run_bounded([str(dest)], env)
    assert report["bundle"] == "refused" and report["match"] == "exact" and report["same"] is True, report
    (warned,) = [w for w in report["warned"] if "bundles/mlp.bin" in w]
    assert "not a compile-cache bundle torch wrote" in warned and "compiling without the bundle" in warned
    assert report["strict"] is not None and "not a compile-cache bundle torch wrote" in report["strict"]
    assert wall < LIMIT_S and peak < LIMIT_RSS
    assert not list(cache.rglob(f"*{KEY}*"))  # torch's loader never saw it: nothing of it in the caches
    print(f"fallback {report['fallback_s']:.1f} s; process {wall:.1f} s, peak RSS {peak / 2**20:.0f} MiB")
