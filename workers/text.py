"""Text for rows and messages: without a terminal's colour codes (`plain`), and sizes for a
person (`format_size`).

Every error text that goes into a row passes through `plain`: Ray's exception strings colour the
task's name (`\\x1b[36mray::execute_job()\\x1b[39m`), and a job process's output may hold a
compiler's or a logger's colours; in a Parquet cell, a report or a CI log they are noise.
"""

from __future__ import annotations

import re

_ESCAPES = re.compile(
    r"""
    \x1b\[[0-?]*[ -/]*[@-~]                 # CSI: colours, cursor moves, erases (ESC [ ... m)
    | \x1b\][^\x07\x1b]*(?:\x07|\x1b\\)?    # OSC: window titles, hyperlinks (ESC ] ... BEL)
    | \x1b[ -/]*[0-~]                       # the other escapes: ESC ( B, ESC =, ESC 7, ...
    | \x9b[0-?]*[ -/]*[@-~]                 # CSI as its one 8-bit character
    """,
    re.VERBOSE,
)


def plain(text: str) -> str:
    """`text` without ANSI escape sequences (colours, cursor moves, hyperlinks)."""
    return _ESCAPES.sub("", text) if ("\x1b" in text or "\x9b" in text) else text


def format_size(n: int) -> str:
    """`n` bytes for a person: 0 B, 900 B, 9.5 KiB, 40 KiB, 3.2 MiB."""
    units = ("B", "KiB", "MiB", "GiB", "TiB")
    size, i = float(n), 0
    while size >= 1024 and i < len(units) - 1:
        size /= 1024
        i += 1
    return f"{size:.0f} {units[i]}" if i == 0 or size >= 10 else f"{size:.1f} {units[i]}"
