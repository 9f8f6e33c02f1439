"""YAML loading that remembers where every value came from and refuses duplicate keys.

PyYAML silently keeps the last of two equal keys; a sweep file with `mode:` twice would run
something other than what its author reads. Here duplicates are errors with both line numbers.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

PathKey = tuple[Any, ...]


@dataclass
class SourceError:
    """One problem in a source file, at a line (1-based; 0 when unknown)."""

    file: str
    line: int
    message: str

    def __str__(self) -> str:
        where = f"{self.file}:{self.line}" if self.line else self.file
        return f"{where}: {self.message}"


@dataclass
class LocatedYaml:
    """Plain Python data from a YAML file, with the line of every mapping key and list item."""

    file: str
    data: Any
    lines: dict[PathKey, int] = field(default_factory=dict)
    errors: list[SourceError] = field(default_factory=list)

    def line(self, path: PathKey) -> int:
        """Line of `path`, or of its nearest ancestor that has one."""
        path = tuple(path)
        while path:
            if path in self.lines:
                return self.lines[path]
            path = path[:-1]
        return self.lines.get((), 0)

    def error(self, path: PathKey, message: str) -> None:
        self.errors.append(SourceError(self.file, self.line(path), message))


def load_yaml(file: str | Path) -> LocatedYaml:
    file = str(file)
    try:
        text = Path(file).read_text()
    except OSError as exc:
        return LocatedYaml(file, None, errors=[SourceError(file, 0, f"cannot read: {exc.strerror or exc}")])
    return parse_yaml(text, file)


def parse_yaml(text: str, file: str = "<string>") -> LocatedYaml:
    out = LocatedYaml(file, None)
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            out.errors.append(SourceError(file, 1, "the file is empty"))
            return out
        out.lines[()] = node.start_mark.line + 1
        out.data = _convert(node, (), loader, out)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        problem = getattr(exc, "problem", None) or str(exc)
        out.errors.append(SourceError(file, mark.line + 1 if mark else 0, f"invalid YAML: {problem}"))
    finally:
        loader.dispose()
    return out


def _convert(node: yaml.Node, path: PathKey, loader: yaml.SafeLoader, out: LocatedYaml) -> Any:
    if isinstance(node, yaml.MappingNode):
        loader.flatten_mapping(node)
        result: dict[Any, Any] = {}
        first_line: dict[Any, int] = {}
        for key_node, value_node in node.value:
            key = loader.construct_object(key_node, deep=True)
            line = key_node.start_mark.line + 1
            if not isinstance(key, (str, int, float, bool)):
                out.errors.append(SourceError(out.file, line, f"mapping key must be a scalar, got {key!r}"))
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
    return loader.construct_object(node, deep=True)
