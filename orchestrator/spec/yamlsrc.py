"""YAML loading that remembers where every value came from and refuses duplicate keys.

PyYAML silently keeps the last of two equal keys; a sweep file with `mode:` twice would run
something other than what its author reads. Here duplicates are errors with both line numbers.

Whatever the bytes, the result is data or a list of `file:line: message` errors, never an
exception: a directory, an empty or oversized file, binary or non-UTF-8 bytes, non-printable
characters, YAML that aliases itself or expands exponentially (an "alias bomb"), nesting deeper
than Python's stack, and scalars PyYAML cannot construct (a timestamp such as 2024-13-45).
"""

from __future__ import annotations

import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

PathKey = tuple[Any, ...]

MAX_BYTES = 1 << 20
"""A sweep file is a page of text; anything larger is the wrong file."""
MAX_VALUES = 100_000
"""Values after expanding aliases and merge keys; far beyond a real sweep, far below a bomb."""
MAX_MESSAGE_CHARS = 2000
"""An error line is cut here: a message quoting a megabyte value must still be one readable line."""


@dataclass
class SourceError:
    """One problem in a source file, at a line (1-based; 0 when unknown); or, in data given as
    Python objects (`spec.datasrc`: no lines), at a key path such as `['configs']['ro']['mode']`."""

    file: str
    line: int
    message: str
    key: str = ""
    """The key path, where the data has no lines (`key_path`)."""

    def __str__(self) -> str:
        where = f"{self.file}:{self.line}" if self.line else self.file + self.key
        message = " ".join(str(self.message).split())  # one line, whatever the message quoted
        if len(message) > MAX_MESSAGE_CHARS:
            message = message[: MAX_MESSAGE_CHARS - 5] + " ..."
        return f"{where}: {message}"


@dataclass
class LocatedYaml:
    """Plain Python data from a YAML file, with the line of every mapping key and list item."""

    file: str
    data: Any
    lines: dict[PathKey, int] = field(default_factory=dict)
    errors: list[SourceError] = field(default_factory=list)
    keyed: bool = False
    """Data given as Python objects (`spec.datasrc`), not read from a file: errors name the key
    path, as there is no line to name."""

    def line(self, path: PathKey) -> int:
        """Line of `path`, or of its nearest ancestor that has one."""
        path = tuple(path)
        while path:
            if path in self.lines:
                return self.lines[path]
            path = path[:-1]
        return self.lines.get((), 0)

    def error(self, path: PathKey, message: str) -> None:
        if self.keyed:
            self.errors.append(SourceError(self.file, 0, message, key_path(path)))
        else:
            self.errors.append(SourceError(self.file, self.line(path), message))


def key_path(path: PathKey) -> str:
    """`('configs', 'ro', 'mode')` as Python writes the lookup: `['configs']['ro']['mode']` (a key
    over 60 characters cut short)."""
    keys = (repr(k) for k in path)
    return "".join(f"[{k if len(k) <= 60 else k[:56] + ' ...'}]" for k in keys)


def load_yaml(file: str | Path) -> LocatedYaml:
    file = str(file)
    path = Path(file)

    def fail(message: str) -> LocatedYaml:
        return LocatedYaml(file, None, errors=[SourceError(file, 0, message)])

    try:
        info = path.stat()
        mode = info.st_mode
        if stat.S_ISDIR(mode):
            return fail("is a directory, not a sweep file; give a YAML file such as sweeps/smoke.yaml")
        if not stat.S_ISREG(mode):  # a device, FIFO or socket: reading it could block or never end
            return fail(
                "is not a regular file (a device, pipe or socket); give a YAML file such as sweeps/smoke.yaml"
            )
        size = info.st_size
        if size > MAX_BYTES:
            return fail(
                f"{size} bytes is far larger than a sweep file (at most {MAX_BYTES} bytes); is it the right file?"
            )
        with path.open("rb") as f:
            data = f.read(MAX_BYTES + 1)  # bounded, should the file grow after the check
        if len(data) > MAX_BYTES:
            return fail(f"grew beyond {MAX_BYTES} bytes while being read; is it the right file?")
    except OSError as exc:
        return fail(f"cannot read: {exc.strerror or exc}")
    return parse_yaml(data, file)


def _line_col(data: bytes | str, index: int) -> tuple[int, int]:
    newline = b"\n" if isinstance(data, bytes) else "\n"
    line_start = data.rfind(newline, 0, index) + 1
    return data.count(newline, 0, index) + 1, index - line_start + 1


def _printable(ch: str) -> bool:
    """YAML 1.1's printable set (what PyYAML's reader accepts)."""
    c = ord(ch)
    return (
        ch in "\t\n\r"
        or 0x20 <= c <= 0x7E
        or c == 0x85
        or 0xA0 <= c <= 0xD7FF
        or 0xE000 <= c <= 0xFFFD
        or 0x10000 <= c <= 0x10FFFF
    ) and c != 0xFEFF


def decode(data: bytes | str, file: str) -> tuple[str | None, SourceError | None]:
    """The text of a sweep file, or the first reason it is not YAML text (with its line)."""
    if isinstance(data, bytes):
        nul = data.find(b"\x00")
        if nul >= 0:
            line, col = _line_col(data, nul)
            return None, SourceError(
                file, line, f"a NUL byte at column {col}: this is a binary file, not a YAML sweep file"
            )
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            line, col = _line_col(data, exc.start)
            return None, SourceError(
                file,
                line,
                f"byte 0x{data[exc.start]:02x} at column {col} is not UTF-8; save the file as UTF-8 text",
            )
    else:
        text = data
    text = text.removeprefix("\ufeff")  # a byte-order mark, as some editors write
    if not text.strip():
        return None, SourceError(
            file, 1, "the file is empty; a sweep needs name, models, batch_sizes, configs"
        )
    for i, ch in enumerate(text):
        if not _printable(ch):
            line, col = _line_col(text, i)
            what = "a NUL byte" if ch == "\x00" else f"non-printable character U+{ord(ch):04X}"
            return None, SourceError(file, line, f"{what} at column {col}; remove it (YAML allows only text)")
    return text, None


class _Refused(Exception):
    """A structure that must not be converted (cyclic or too large), with its line."""

    def __init__(self, line: int, message: str):
        super().__init__(message)
        self.line = line
        self.message = message


def _expanded_values(root: yaml.Node) -> int:
    """How many values `root` stands for once every alias and merge key is expanded (counted on
    the shared node graph, so a bomb is measured without being built); `_Refused` on a cycle."""
    sizes: dict[int, int] = {}
    active: set[int] = set()

    def size(node: yaml.Node) -> int:
        key = id(node)
        if key in sizes:
            return sizes[key]
        if key in active:
            raise _Refused(node.start_mark.line + 1, "an alias refers to a value that contains it (a cycle)")
        active.add(key)
        total = 1
        if isinstance(node, yaml.SequenceNode):
            total += sum(size(item) for item in node.value)
        elif isinstance(node, yaml.MappingNode):
            total += sum(size(k) + size(v) for k, v in node.value)
        active.discard(key)
        sizes[key] = min(total, MAX_VALUES + 1)
        return sizes[key]

    return size(root)


def parse_yaml(data: bytes | str, file: str = "<string>") -> LocatedYaml:
    out = LocatedYaml(file, None)
    text, problem = decode(data, file)
    if problem is not None:
        out.errors.append(problem)
        return out
    try:
        loader = yaml.SafeLoader(text)
    except yaml.YAMLError as exc:  # the reader's own checks, should `decode` let something by
        out.errors.append(_yaml_error(file, exc))
        return out
    try:
        node = loader.get_single_node()
        if node is None:
            out.errors.append(SourceError(file, 1, "the file is empty"))
            return out
        out.lines[()] = node.start_mark.line + 1
        if _expanded_values(node) > MAX_VALUES:
            raise _Refused(
                node.start_mark.line + 1,
                f"more than {MAX_VALUES} values once its aliases are expanded (an alias bomb?); "
                "a sweep file needs a few hundred",
            )
        out.data = _convert(node, (), loader, out)
    except yaml.YAMLError as exc:
        out.errors.append(_yaml_error(file, exc))
    except _Refused as exc:
        out.errors.append(SourceError(file, exc.line, exc.message))
    except RecursionError:
        out.errors.append(SourceError(file, 1, "nested too deeply to read (thousands of levels)"))
    finally:
        loader.dispose()
    return out


def _yaml_error(file: str, exc: yaml.YAMLError) -> SourceError:
    mark = getattr(exc, "problem_mark", None)
    problem = getattr(exc, "problem", None) or str(exc)
    return SourceError(file, mark.line + 1 if mark else 0, f"invalid YAML: {problem}")


_KINDS = {"date": "date", "datetime": "timestamp", "bytes": "binary value", "set": "set"}


def _construct(node: yaml.Node, loader: yaml.SafeLoader) -> Any:
    """A scalar's value; `_Refused` where PyYAML's constructor fails with a non-YAML error (a
    timestamp such as 2024-13-45 raises ValueError inside it)."""
    try:
        value = loader.construct_object(node, deep=True)
    except yaml.YAMLError:
        raise
    except Exception as exc:  # PyYAML's constructors raise what they meet: !!bool maybe is a KeyError
        raise _Refused(
            node.start_mark.line + 1,
            f"cannot read the value {node.value!r:.60} (tag {node.tag}): {type(exc).__name__}: {exc!s:.100}",
        ) from None
    if value is not None and not isinstance(value, (str, int, float, bool)):
        raise _Refused(
            node.start_mark.line + 1,
            f"the value {node.value!r:.60} reads as a {_KINDS.get(type(value).__name__, type(value).__name__)}; "
            "a sweep file holds names, "
            "numbers, true/false, lists and mappings: quote it to make it a string",
        )
    return value


_PLAIN_TAGS = ("tag:yaml.org,2002:map", "tag:yaml.org,2002:seq")


def _convert(node: yaml.Node, path: PathKey, loader: yaml.SafeLoader, out: LocatedYaml) -> Any:
    if isinstance(node, yaml.CollectionNode) and node.tag not in _PLAIN_TAGS:
        # `!!python/object/apply:os.system [...]` read as a plain list (never run, but not refused)
        tag = node.tag.replace("tag:yaml.org,2002:", "!!")
        out.errors.append(
            SourceError(
                out.file,
                node.start_mark.line + 1,
                f"the tag {tag!r:.60} on a list or mapping; a sweep file holds plain ones",
            )
        )
        return None
    if isinstance(node, yaml.MappingNode):
        loader.flatten_mapping(node)
        result: dict[Any, Any] = {}
        first_line: dict[Any, int] = {}
        for key_node, value_node in node.value:
            # a list or mapping as a key is refused below, without building it
            key = _construct(key_node, loader) if isinstance(key_node, yaml.ScalarNode) else None
            line = key_node.start_mark.line + 1
            if not isinstance(key, (str, int, float, bool)):
                shown = (
                    "a list or mapping"
                    if key is None and not isinstance(key_node, yaml.ScalarNode)
                    else repr(key)
                )
                out.errors.append(
                    SourceError(out.file, line, f"a mapping key must be a name or number, got {shown:.60}")
                )
                continue
            if key in result:
                out.errors.append(
                    SourceError(
                        out.file, line, f"duplicate key {key!r} (first defined on line {first_line[key]})"
                    )
                )
                continue
            first_line[key] = line
            out.lines[path + (key,)] = line
            result[key] = _convert(value_node, path + (key,), loader, out)
        return result
    if isinstance(node, yaml.SequenceNode):
        items = []
        for i, item in enumerate(node.value):
            out.lines[path + (i,)] = item.start_mark.line + 1
            items.append(_convert(item, path + (i,), loader, out))
        return items
    return _construct(node, loader)
