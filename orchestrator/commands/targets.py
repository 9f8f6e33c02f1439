"""Checks of what a command writes outside an output directory: a report page (`report --md/--json
/--html`), an export's destination (`export --dest`) and nightly's history root. None of them may
land among a sweep's or a tune's own files (store.layout lists them), where a reader would name
them as strays or a later run would overwrite them."""

from __future__ import annotations

import sys
from pathlib import Path

from store.layout import SWEEP_DATA, SWEEP_MARKS, TUNE_DATA, TUNE_MARKS

PAGE_STARTS = {
    "--md": b"## Regression report",
    "--json": b'{\n "format": 1,\n "thresholds": {',
    "--html": b"<!DOCTYPE html><html><head><meta charset='utf-8'>",
}
"""How each page this tool writes begins (reports/regression/: markdown.py, html.py): an existing file
is replaced only when it begins so (a page of an earlier run), or is empty."""

PAGE_NAMES = {"--md": "a Markdown summary", "--json": "a JSON comparison", "--html": "an HTML page"}


def check_page_path(target: str | None, flag: str) -> None:
    """A report page's path, checked before the comparison runs: a file in a directory that
    exists, not in a sweep output's data, and not an existing file other than a page of this
    kind (ValueError naming the flag otherwise: it would be lost)."""
    if target is None:
        return
    if not target.strip():
        raise ValueError(f"{flag}: an empty file name; give a file, e.g. regression.{flag[2:]}")
    if target == "-":
        raise ValueError(f"{flag} -: pages are written to files, not to standard output; give a file name")
    path = Path(target)
    try:
        if path.is_dir():
            raise ValueError(f"{flag} {target}: is a directory; give a file name, e.g. {path / 'report'}")
        if not path.parent.is_dir():
            raise ValueError(f"{flag} {target}: the directory {path.parent} does not exist; create it first")
        if path.is_symlink() and not path.exists():  # a loop (resolve raises), or a missing target
            raise ValueError(
                f"{flag} {target}: a symbolic link to a missing target, or a loop; give another name"
            )
        check_not_output_data(path.resolve(), target, flag)
        if path.is_fifo() or path.is_socket():  # opening one waits for a reader: a hang
            raise ValueError(f"{flag} {target}: is a FIFO or a socket; give a regular file name")
        if path.is_file() and path.stat().st_size:
            with path.open("rb") as f:
                start = f.read(len(PAGE_STARTS[flag]))
            if start != PAGE_STARTS[flag]:
                raise ValueError(
                    f"{flag} {target}: exists and is not {PAGE_NAMES[flag]} this tool wrote; it is left as it "
                    "is: give a new file name (or remove that file first)"
                )
    except (OSError, RuntimeError) as exc:  # a name too long for the file system, a symlink loop
        raise ValueError(
            f"{flag} {target[:200]}: unusable path: {getattr(exc, 'strerror', None) or exc}"
        ) from None


def check_not_output_data(path: Path, target: str, flag: str, beside: str | None = None) -> None:
    """ValueError when `path` is a sweep or tune output's own file or lies in one of its folders
    (`beside`: what to write instead, e.g. a file name next to the output)."""
    for folder in outputs_among(path.parents, (*SWEEP_MARKS, *TUNE_MARKS)):
        first = path.relative_to(folder).parts[0]
        if first in SWEEP_DATA or first in TUNE_DATA:
            what = "tune" if any((folder / mark).exists() for mark in TUNE_MARKS) else "sweep"
            instead = beside or f"write the page beside it, e.g. {folder / ('regression.' + flag[2:])}"
            raise ValueError(
                f"{flag} {target}: is the {what} output {folder}'s own data "
                f"(its {first}{'/' if folder != path.parent else ''}); {instead}"
            )


def outputs_among(folders, marks: tuple[str, ...]):
    """The folders, in order, that hold one of `marks`: sweep outputs."""
    return (folder for folder in folders if any((folder / mark).exists() for mark in marks))


def write_pages(pages: list[tuple[str | None, str, str]]) -> int | None:
    """Write each (file, text, flag) given a file; EXIT_BAD_INPUT with a line naming the flag where
    one cannot be written, else None."""
    from orchestrator.commands.common import EXIT_BAD_INPUT

    for target, text, flag in pages:
        if target:
            try:
                Path(target).write_text(text)
            except OSError as exc:
                print(f"error: {flag} {target}: cannot write it: {exc.strerror or exc}", file=sys.stderr)
                return EXIT_BAD_INPUT
    return None
