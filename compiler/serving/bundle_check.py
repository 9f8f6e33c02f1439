"""A compile-cache bundle's container, checked before torch's loader reads it: `check_bundle`.

`torch.compiler.load_cache_artifacts` trusts its input. Its reader takes every length in the
container at its word: in a container cut short (its checksum made again) it reads past the end,
where every read gives zero, and appends empty sections forever (about 90 MB/s of memory on
torch 2.13); an artifact that is not a pickle raises `UnpicklingError` from inside Inductor while
the artifacts before it are already in the local caches; and an artifact's key is the name of the
file torch writes it to, so a key such as `../../x` or an absolute path writes outside them. The
manifest's sha256 makes such bytes impossible by accident, not on purpose: whoever can rewrite
the manifest can ship them (docs/production.md, "Trust model").

`check_bundle` walks the container as torch's reader does (a crc32 of the rest, the format
version, then per artifact type: its name, a count, and per artifact a key and its content), but
with every count and length checked against the bytes that remain, the version and the types
those of this torch (`compiler.torch_private.bundle_format`), every key a relative path of plain
names, and each content in the form torch reads it: a pickle stream read opcode by opcode with
`pickletools.genops`, which parses and never executes or imports anything, ending exactly at its
STOP; autotune results as a JSON object. It reads each byte a bounded number of times and holds
at most one artifact's copy beside the bundle, so it finishes in time linear in the bundle's
size (about 0.2 microseconds a byte at worst on a 2-core CPU: a pickle of one-byte opcodes) and
torch's loader then only walks a container whose lengths are consistent.

What no check of the bytes can tell: a well-formed pickle runs whatever code it names when it is
unpickled, and a compiled graph holds code Inductor runs. Only a signed export
(`compiler.serving.signature`) says that the bundle is the one its exporter wrote.

This module imports only torch (lazily, through `compiler.torch_private`) and the standard
library; neither Ray nor the orchestrator package."""

from __future__ import annotations

import base64
import binascii
import json
import pickletools
import re
import zlib
from dataclasses import dataclass, field

from compiler.serving.files import ExportError
from compiler.torch_private import TorchPrivateError, bundle_format

PICKLED = frozenset({"inductor", "aot_autograd", "precompile", "pgo"})
"""Artifact types whose content torch unpickles (at load: Inductor's, to emit its Triton bundle;
the others when a compile looks them up)."""
JSON = frozenset({"autotune"})
"""Artifact types whose content torch reads as JSON (Inductor's autotuning results)."""
_NAME = re.compile(r"[A-Za-z0-9_.:=+,-]{1,255}")
"""One name of an artifact's key: torch's keys are hashes, with `.best_config` and a directory of
two characters for autotuning results, `:` in profile-guided ones."""
_MAX_KEY = 1024
_LENGTH = 8
"""Every count and length in the container: an unsigned 64-bit big-endian integer."""


@dataclass
class BundleContents:
    """What a bundle that passed the check holds: artifacts by type, and its size."""

    artifacts: dict[str, int] = field(default_factory=dict)
    size: int = 0


class _Reader:
    """torch's container reader, with every read checked against what remains."""

    def __init__(self, data: bytes, start: int, where: str):
        self.data, self.pos, self.where = data, start, where

    def remaining(self) -> int:
        return len(self.data) - self.pos

    def uint64(self, what: str) -> int:
        if self.remaining() < _LENGTH:
            raise self.error(
                f"{what} needs {_LENGTH} bytes, {self.remaining()} remain (the file is cut short)"
            )
        value = int.from_bytes(self.data[self.pos : self.pos + _LENGTH], "big")
        self.pos += _LENGTH
        return value

    def take(self, what: str) -> bytes:
        size = self.uint64(f"the length of {what}")
        if size > self.remaining():
            raise self.error(f"{what} claims {size} bytes, {self.remaining()} remain (the file is cut short)")
        value = self.data[self.pos : self.pos + size]
        self.pos += size
        return value

    def text(self, what: str) -> str:
        payload = self.take(what)
        try:
            return base64.b64decode(payload, validate=True).decode("utf-8")
        except (binascii.Error, UnicodeDecodeError) as exc:
            raise self.error(f"{what} is not base64 of UTF-8 text ({exc})") from None

    def error(self, message: str) -> ExportError:
        return ExportError(
            f"{self.where}: not a compile-cache bundle torch wrote: at byte {self.pos}, {message}"
        )


def check_bundle(data: bytes, where: str) -> BundleContents:
    """`data` as a compile-cache bundle torch's loader can read without harm (see the module's
    docstring): what it holds, or `ExportError` naming the first problem and the file (`where`)."""
    try:
        version, checksum, registered = bundle_format()
    except TorchPrivateError as exc:
        raise ExportError(
            f"{where}: cannot check the bundle on this torch, so it is not loaded: {exc}"
        ) from None
    redo = "re-export it, or copy the export again"
    if len(data) < checksum + _LENGTH:
        raise ExportError(f"{where}: {len(data)} bytes is too short for a compile-cache bundle; {redo}")
    if zlib.crc32(data[checksum:]).to_bytes(checksum, "big") != data[:checksum]:
        raise ExportError(f"{where}: the bundle's own checksum does not match its bytes (damaged); {redo}")
    reader = _Reader(data, checksum, where)
    found = reader.uint64("the format version")
    if found != version:
        raise ExportError(f"{where}: bundle format {found}, this torch reads {version}; export on this stack")
    contents = BundleContents(size=len(data))
    while reader.remaining():
        kind = reader.text("an artifact type")
        if kind not in registered or kind not in PICKLED | JSON:
            known = sorted(registered & (PICKLED | JSON))
            raise reader.error(f"unknown artifact type {kind[:80]!r} (this torch loads {', '.join(known)})")
        count = reader.uint64(f"the number of {kind} artifacts")
        # each artifact is at least a key and a content, each with its length
        if count > reader.remaining() // (2 * _LENGTH):
            raise reader.error(
                f"{count} {kind} artifacts cannot fit in the {reader.remaining()} bytes that remain"
            )
        for _ in range(count):
            key = reader.text(f"a {kind} key")
            _check_key(key, reader)
            _check_content(kind, key, reader.take(f"the content of {kind} artifact {key}"), reader)
        contents.artifacts[kind] = contents.artifacts.get(kind, 0) + count
    return contents


def _check_key(key: str, reader: _Reader) -> None:
    """A key torch turns into a path under its cache directory: relative, plain names only."""
    names = key.split("/")
    if len(key) > _MAX_KEY or not all(_NAME.fullmatch(n) and n not in (".", "..") for n in names):
        raise reader.error(
            f"artifact key {key[:80]!r} is not a relative path of plain names (torch writes the artifact "
            "to a file of that name under its cache directory)"
        )


def _check_content(kind: str, key: str, content: bytes, reader: _Reader) -> None:
    what = f"{kind} artifact {key}"
    if kind in JSON:
        try:
            parsed = json.loads(content)
        except (ValueError, RecursionError) as exc:  # UnicodeDecodeError is a ValueError
            raise reader.error(f"{what} is not JSON ({type(exc).__name__}: {str(exc)[:200]})") from None
        if not isinstance(parsed, dict):
            raise reader.error(f"{what} is JSON but not an object")
        return
    end = -1
    try:
        for opcode, _arg, pos in pickletools.genops(content):  # parses; runs and imports nothing
            end = pos + 1 if opcode.name == "STOP" else end
    except Exception as exc:  # genops raises ValueError for most damage; any failure is a refusal
        raise reader.error(
            f"{what} is not a pickle stream ({type(exc).__name__}: {str(exc)[:200]})"
        ) from None
    if end != len(content):
        raise reader.error(f"{what}: {len(content) - end} bytes follow the pickle's STOP")
