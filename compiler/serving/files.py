"""The files of an export (`orchestrate export`), read for `compiler.serving.compile_tuned`.

`open_export(source)` reads `manifest.json` and `serving.json` (the export's presets) and checks their shape: anything
it cannot use raises `ExportError`, never `AttributeError` or `TypeError`. Every other file is
read only when asked for (`ExportFiles.verified`), only if the manifest lists it, only from
inside the export (a path in the manifest that is absolute or climbs out with `..` makes the
whole manifest unusable), and only as the exact bytes the manifest's sha256 names.

A directory is read in place. A URI (`s3://`, `gs://`, `file://`, ... whatever
`pyarrow.fs.FileSystem.from_uri` serves) goes through a content-addressed cache in the user's
cache directory (`cache_root`: `$COMPILE_ORCHESTRATOR_CACHE`, else
`$XDG_CACHE_HOME/compile-orchestrator`, else `~/.cache/compile-orchestrator`), under
`exports/sha256/`: a file is fetched only when no entry with its sha256 is there, and an entry is
checked against its name on every read (one that does not match is fetched again). The manifest
has no digest to look it up by: the cache remembers, per source, the size and modification time
the store reported for it (`get_file_info`, no bytes transferred) and the sha256 of the bytes it
fetched then; while both are unchanged the cached manifest is used. So a server that starts
again transfers nothing, and a new export at the same URI is fetched as soon as its manifest is
rewritten (a rewrite with the same size within the store's timestamp resolution, one second on
S3, would go unseen).

This module imports neither Ray nor the orchestrator package.
"""

from __future__ import annotations

import hashlib
import json
import os
import posixpath
import re
import sys
import warnings
from collections.abc import Callable
from pathlib import Path, PurePosixPath
from typing import Any

from compiler import durable
from compiler.config import EAGER, CompileConfig, is_eager_preset
from compiler.runtime import setting_problems

MANIFEST = "manifest.json"
SERVING_FILE = "serving.json"
"""The export's presets: what a serving process reads (a tune's output holds another document,
presets.json, the tune's decisions, from which `orchestrate export` writes this one)."""
SERVING_FILE_BEFORE = "presets.json"
"""The same document's name in exports written before it had a name of its own: read where the
manifest lists it."""
EXPORT_FORMAT = 2
"""2: `fp32` is the stock policy (torch's float32 defaults, `compiler.precision`); presets may carry
`budget` (the accuracy budget they were chosen under) and their figures against a stock PyTorch
user. A format-1 export is read on, its `fp32` as what it meant then, `fp32-strict`."""
READS_FORMATS = (1, 2)
CACHE_ENV = "COMPILE_ORCHESTRATOR_CACHE"
"""Environment variable: the cache directory (`cache_root`)."""
_SHA256 = re.compile(r"[0-9a-f]{64}")
_DEFAULT_TYPES: dict[str, Any] = {
    "dtype": str,
    "compile": dict,
    "bundle": (str, type(None)),
    "package": (str, type(None)),
}
"""What a class default (`defaults` of serving.json) must hold, and what it may."""
_ENTRY_TYPES: dict[str, Any] = {"model": str, "batch_size": int, **_DEFAULT_TYPES}
"""What a preset of a cell must hold."""
_NONE = type(None)
_EAGER_TYPES: dict[str, Any] = {**_ENTRY_TYPES, "compile": _NONE, "runtime": dict}
"""What an eager preset of a cell (`compiler.config.is_eager_preset`) holds instead: no `compile`,
its runtime settings beside it."""
_CONFIG_TYPES: dict[str, Any] = {
    "name": str,
    "mode": (str, _NONE),
    "fullgraph": bool,
    "dynamic": (bool, _NONE),
    "backend": str,
    "options": dict,
    "freezing": bool,
    "channels_last": bool,
    "runtime": dict,
    "timeout_s": (int, float, _NONE),
}
"""The fields of `CompileConfig`, with the types a preset's `compile` may give them."""
_PACKAGE = Path(__file__).resolve().parent


class ExportError(RuntimeError):
    """An export that cannot be made (`orchestrate export`) or used (`compile_tuned` with
    `strict=True`); the message names the file and what to do."""


class ExportCacheWarning(UserWarning):
    """The cache directory could not be written: the export's files were used from memory and
    will be fetched again by the next process."""


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def cache_root() -> Path:
    """The user's cache directory for this project (see the module's docstring)."""
    moved = os.environ.get(CACHE_ENV)
    if moved:
        return Path(moved).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg) if xdg and os.path.isabs(xdg) else Path.home() / ".cache"
    return base / "compile-orchestrator"


def confined(rel: Any, where: str) -> str:
    """`rel` if it names a file inside the export (a relative path that never climbs out);
    else ExportError."""
    if not isinstance(rel, str) or not rel or "\\" in rel or "\0" in rel:
        raise ExportError(f"{where}: {rel!r} is not a file name inside the export; refusing it")
    parts = PurePosixPath(rel).parts
    if rel.startswith("/") or ".." in parts or posixpath.normpath(rel) != rel:
        raise ExportError(
            f"{where}: {rel!r} is not inside the export (absolute, or climbs out with ..); refusing it"
        )
    return rel


def check_manifest(data: Any, where: str) -> dict[str, Any]:
    """`data` if it is a manifest this code can use; else ExportError naming what is wrong."""
    redo = "re-export, or copy the export again"
    if not isinstance(data, dict):
        raise ExportError(f"{where}: a manifest is a JSON object, this is {_kind(data)}; {redo}")
    if data.get("format") not in READS_FORMATS:
        raise ExportError(
            f"{where}: format {data.get('format')!r}, this code reads {' and '.join(map(str, READS_FORMATS))}"
        )
    files = data.get("files")
    if not isinstance(files, dict) or not all(
        isinstance(v, str) and _SHA256.fullmatch(v) for v in files.values()
    ):
        raise ExportError(f"{where}: `files` must map each file of the export to its sha256; {redo}")
    for rel in files:
        confined(rel, where)
    if not isinstance(data.get("hardware"), str) or not isinstance(data.get("stack"), dict):
        raise ExportError(f"{where}: `hardware` (a class name) and `stack` (an object) are required; {redo}")
    return data


def check_presets(data: Any, where: str) -> dict[str, Any]:
    """`data` if it is a serving.json this code can use; else ExportError."""
    if not isinstance(data, dict):
        raise ExportError(f"{where}: presets are a JSON object, this is {_kind(data)}")
    entries, defaults = data.get("presets", []), data.get("defaults") or {}
    if not isinstance(entries, list) or not isinstance(defaults, dict):
        raise ExportError(f"{where}: `presets` must be a list and `defaults` an object")
    cells = [
        (f"presets[{i}]", e, _EAGER_TYPES if is_eager_preset(e) else _ENTRY_TYPES)
        for i, e in enumerate(entries)
    ]
    for name, entry, types in [*cells, *((f"defaults.{k}", e, _DEFAULT_TYPES) for k, e in defaults.items())]:
        if not isinstance(entry, dict):
            wrong = ["the entry itself"]
        else:
            wrong = [k for k, t in types.items() if not isinstance(entry.get(k), t)]
        if wrong:
            raise ExportError(f"{where}: preset {name}: {', '.join(wrong)} missing or of the wrong type")
    return data


def upgrade_format_1(presets: dict[str, Any]) -> None:
    """A format-1 export's presets as this code names them: its `fp32` turned TF32 off for
    convolutions, which is `fp32-strict` now (in place)."""
    from compiler.precision import STRICT

    entries = [*presets.get("presets", []), *(presets.get("defaults") or {}).values()]
    for entry in entries:
        for key in ("dtype", "precision"):
            if entry.get(key) == "fp32":
                entry[key] = STRICT
    defaults = presets.get("defaults") or {}
    if "fp32" in defaults:
        defaults[STRICT] = defaults.pop("fp32")


def preset_config(entry: dict[str, Any], where: str) -> CompileConfig:
    """The CompileConfig of a preset entry (checked by `check_presets`), its fields' types and its
    runtime settings and precision checked; else ExportError. For an eager preset, a config named
    `eager` that holds only its runtime settings: what to set, never something to compile."""
    from compiler.precision import PRECISIONS

    if is_eager_preset(entry):
        fields = {"name": EAGER, "runtime": entry["runtime"]}
    else:
        fields = {"name": entry.get("config", "preset"), **entry["compile"]}
    what = f"{where}: preset {fields['name']!r}"
    unknown = sorted(str(k) for k in fields if k not in _CONFIG_TYPES)
    wrong = [k for k, t in _CONFIG_TYPES.items() if k in fields and not isinstance(fields[k], t)]
    if unknown or wrong:
        raise ExportError(
            f"{what}: compile fields unknown ({', '.join(unknown) or 'none'}) or of the wrong type "
            f"({', '.join(wrong) or 'none'}); this code cannot apply it"
        )
    problems = setting_problems(fields.get("runtime", {}))
    if problems:
        raise ExportError(f"{what}: {problems[0][1]}")
    policy = entry.get("precision") or entry.get("dtype")
    if policy not in PRECISIONS:
        raise ExportError(f"{what}: unknown precision {policy!r} (known: {', '.join(PRECISIONS)})")
    return CompileConfig.from_dict(fields)


def warn_caller(message: str, category: type[Warning]) -> None:
    """warnings.warn, attributed to the first caller outside the `compiler` package."""
    level, frame = 1, sys._getframe(0)
    while frame.f_back is not None and Path(frame.f_code.co_filename).resolve().parent == _PACKAGE:
        frame = frame.f_back
        level += 1
    warnings.warn(message, category, stacklevel=level)


class ExportFiles:
    """An opened export: its checked manifest and presets, and its other files on demand."""

    def __init__(self, shown: str):
        self.shown = shown
        self.manifest: dict[str, Any] = {}
        self.presets: dict[str, Any] = {}
        self.serving_file = SERVING_FILE
        self.before_use: Callable[[ExportFiles, bytes], Any] | None = None
        """Called with the manifest's bytes before anything is read from them (a signature check,
        `compiler.serving.signature.verify`): what it raises, `open_export` raises."""

    def where(self, rel: str) -> str:
        """How to name the file `rel` of this export in a message."""
        return f"{self.shown.rstrip('/')}/{rel}"

    def verified(self, rel: Any) -> bytes:
        """The bytes of the file `rel`, exactly those the manifest's sha256 names (ExportError
        otherwise), read once, so what is loaded is what was checked."""
        rel = confined(rel, self.where(MANIFEST))
        expected = self.manifest.get("files", {}).get(rel)
        if expected is None:
            raise ExportError(f"{self.where(rel)}: not listed in {self.where(MANIFEST)}; refusing to load it")
        data = self._read(rel, expected)
        actual = hashlib.sha256(data).hexdigest()
        if actual != expected:
            raise ExportError(
                f"{self.where(rel)}: sha256 {actual[:16]}... does not match the manifest's {expected[:16]}...; the "
                "file was changed after export: refusing to load it (re-export, or copy the directory again)"
            )
        return data

    def _read(self, rel: str, expected: str) -> bytes:
        raise NotImplementedError

    def unlisted(self, name: str, limit: int) -> bytes | None:
        """The file `name` beside the manifest, which the manifest cannot list (its signature), or
        None where there is none; ExportError for one over `limit` bytes or that cannot be read."""
        raise NotImplementedError

    def _open(self, manifest: bytes) -> ExportFiles:
        if self.before_use is not None:
            self.before_use(self, manifest)
        self.manifest = check_manifest(_json(manifest, self.where(MANIFEST)), self.where(MANIFEST))
        files = self.manifest.get("files", {})
        if SERVING_FILE not in files and SERVING_FILE_BEFORE in files:
            self.serving_file = SERVING_FILE_BEFORE
        where = self.where(self.serving_file)
        self.presets = check_presets(_json(self.verified(self.serving_file), where), where)
        if self.manifest["format"] == 1:
            upgrade_format_1(self.presets)
        return self


class LocalExport(ExportFiles):
    """An export directory, read in place."""

    def __init__(self, root: Path):
        super().__init__(str(root))
        self.root = root

    def _read(self, rel: str, expected: str) -> bytes:
        path = self.root / rel
        try:
            inside = path.resolve().is_relative_to(self.root.resolve())
            if not inside:
                raise ExportError(f"{path}: a link out of the export; refusing it")
            return path.read_bytes()
        except OSError as exc:
            raise ExportError(f"{path}: cannot read it ({exc})") from exc

    def unlisted(self, name: str, limit: int) -> bytes | None:
        path = self.root / name
        if not path.exists() and not path.is_symlink():
            return None
        data = self._read(name, "")
        if len(data) > limit:
            raise ExportError(f"{path}: {len(data)} bytes, far larger than that file is (at most {limit})")
        return data


class RemoteExport(ExportFiles):
    """An export at a URI or in a given `pyarrow.fs` filesystem, read through `ContentCache`."""

    def __init__(self, shown: str, fs: Any, root: str, cache: ContentCache):
        super().__init__(shown)
        self.fs, self.root, self.cache = fs, root.rstrip("/"), cache
        self.transferred = 0
        """Bytes fetched from the filesystem by this object."""

    def _fetch(self, rel: str) -> bytes:
        try:
            with self.fs.open_input_stream(f"{self.root}/{rel}") as f:
                data = f.read()
        except Exception as exc:  # pyarrow raises OSError, ArrowInvalid, ArrowNotImplementedError, ...
            raise ExportError(f"{self.where(rel)}: cannot read it ({type(exc).__name__}: {exc})") from exc
        self.transferred += len(data)
        return data

    def unlisted(self, name: str, limit: int) -> bytes | None:
        import pyarrow.fs as pafs

        try:
            info = self.fs.get_file_info(f"{self.root}/{name}")
        except Exception as exc:  # pyarrow's own errors, as in _fetch
            raise ExportError(f"{self.where(name)}: cannot read it ({type(exc).__name__}: {exc})") from exc
        if info.type != pafs.FileType.File:
            return None
        if info.size is not None and info.size > limit:
            raise ExportError(
                f"{self.where(name)}: {info.size} bytes, far larger than that file is (at most {limit})"
            )
        return self._fetch(name)

    def _read(self, rel: str, expected: str) -> bytes:
        data = self.cache.get(expected)
        if data is None:
            data = self._fetch(rel)
            if hashlib.sha256(data).hexdigest() == expected:
                self.cache.put(expected, data)
        return data

    def open_manifest(self, key: str) -> ExportFiles:
        """Read the manifest (from the cache while the store reports it unchanged), then the
        presets."""
        import pyarrow.fs as pafs

        try:
            info = self.fs.get_file_info(f"{self.root}/{MANIFEST}")
        except Exception as exc:
            raise ExportError(
                f"{self.where(MANIFEST)}: cannot read it ({type(exc).__name__}: {exc})"
            ) from exc
        if info.type != pafs.FileType.File:
            raise ExportError(f"{self.where(MANIFEST)}: no such file; is {self.shown} an export?")
        stamp = [info.size, info.mtime_ns] if info.mtime_ns is not None else None
        data = self.cache.recalled(key, stamp)
        if data is None:
            data = self._fetch(MANIFEST)
            self.cache.remember(key, stamp, data)
        return self._open(data)


class ContentCache:
    """Files by sha256 under `root/sha256/`, checked on every read; and per source, the stamp and
    digest of the manifest last fetched, under `root/sources/`."""

    def __init__(self, root: Path):
        self.root = root

    def path(self, sha: str) -> Path:
        return self.root / "sha256" / sha[:2] / sha

    def get(self, sha: str) -> bytes | None:
        """The cached bytes whose sha256 is `sha`, or None (absent or damaged: fetch them)."""
        try:
            data = self.path(sha).read_bytes()
        except OSError:
            return None
        return data if hashlib.sha256(data).hexdigest() == sha else None

    def put(self, sha: str, data: bytes) -> None:
        self._write(self.path(sha), data)

    def recalled(self, key: str, stamp: list[int] | None) -> bytes | None:
        """The manifest fetched last from source `key`, if the store's stamp for it is the same."""
        if stamp is None:
            return None
        try:
            saved = json.loads(self._source(key).read_text())
        except (OSError, ValueError):
            return None
        if (
            not isinstance(saved, dict)
            or saved.get("stamp") != stamp
            or not isinstance(saved.get("sha256"), str)
        ):
            return None
        return self.get(saved["sha256"])

    def remember(self, key: str, stamp: list[int] | None, data: bytes) -> None:
        sha = hashlib.sha256(data).hexdigest()
        self.put(sha, data)
        if stamp is not None:
            self._write(self._source(key), json.dumps({"stamp": stamp, "sha256": sha}).encode())

    def _source(self, key: str) -> Path:
        return self.root / "sources" / f"{hashlib.sha256(key.encode()).hexdigest()}.json"

    def _write(self, path: Path, data: bytes) -> None:
        try:
            durable.write_bytes(path, data)
        except OSError as exc:
            warn_caller(
                f"compile_tuned: cannot write the export cache {self.root} ({exc}); set {CACHE_ENV} to a "
                "writable directory, or every process fetches the export's files again",
                ExportCacheWarning,
            )


def open_export(
    source: str | os.PathLike[str],
    filesystem: Any = None,
    before_use: Callable[[ExportFiles, bytes], Any] | None = None,
) -> ExportFiles:
    """The export at `source`: a directory, a URI, or with `filesystem` (a `pyarrow.fs`
    filesystem) a path in it. ExportError if it cannot be used. `before_use(export, manifest)`
    sees the manifest's bytes before anything else is read (`ExportFiles.before_use`)."""
    text = str(source)
    if filesystem is None and "://" not in text:
        root = Path(text)
        try:
            manifest = (root / MANIFEST).read_bytes()
        except OSError as exc:
            raise ExportError(f"{root / MANIFEST}: cannot read it ({exc})") from exc
        local = LocalExport(root)
        local.before_use = before_use
        return local._open(manifest)
    if filesystem is None:
        import pyarrow.fs as pafs

        try:
            filesystem, root = pafs.FileSystem.from_uri(text)
        except Exception as exc:  # ArrowInvalid, or a filesystem's own error on its options
            raise ExportError(
                f"{text}: not a URI this process can read ({type(exc).__name__}: {exc})"
            ) from exc
        key = text
    else:
        root, key = text, f"{filesystem.type_name}:{text}"
    export = RemoteExport(text, filesystem, root, ContentCache(cache_root() / "exports"))
    export.before_use = before_use
    return export.open_manifest(key)


def _json(data: bytes, where: str) -> Any:
    try:
        return json.loads(data)
    except ValueError as exc:  # UnicodeDecodeError included
        raise ExportError(f"{where}: not valid JSON ({exc})") from exc


def _kind(value: Any) -> str:
    return "null" if value is None else f"a JSON {type(value).__name__.replace('dict', 'object')}"
