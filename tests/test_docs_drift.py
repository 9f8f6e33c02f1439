"""Docs that cannot drift (docs/testing.md, "The documentation is tested"): the README and the pages
of `docs/` (not `docs/results/`, the record of measured runs) against the code.

- docs/cli.md and docs/columns.md are what `orchestrator.docs_gen` makes of the parser and of the
  column lists; `python -m orchestrator.docs_gen --write` regenerates them.
- Every output block (a fenced block marked `console` or `text`, or with no language) is produced
  here by running its command and comparing, or follows `<!-- excerpt: docs/results/PAGE.md -->`
  and shows lines of that page. A `console` block's `$ orchestrate ...` lines are run as written
  (only commands that compile nothing); the blocks in `SAMPLES` have a producer of their own. The
  comparison normalises only job ids (content hashes of the job and the software stack, so they
  change with torch, Python or transformers) and reads a line `...` as one or more lines left out.
- Every `orchestrate` command of a `bash` block parses with today's flags; every relative link and
  anchor resolves; the versions the docs name are the code's; the README stays within 200 lines
  and installs as `.ci/run` does; docs/testing.md names `.ci/run`'s tiers and pyproject's markers,
  and logs no run."""

from __future__ import annotations

import contextlib
import difflib
import io
import json
import os
import re
import shlex
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from orchestrator import docs_gen
from orchestrator.cli import build_parser, main

ROOT = Path(__file__).resolve().parents[1]
README_MAX_LINES = 200
GENERATED = {"docs/cli.md", "docs/columns.md"}
OUTPUT_LANGS = ("", "text", "console")
"""The info strings of a block that shows what a command printed (`bash`, `python`, `yaml` and
`json` blocks show what a reader types or a file's format)."""
EXCERPT = re.compile(r"^<!-- excerpt: (\S+) -->$")
JOB_ID = re.compile(r"\b[0-9a-f]{20}\b")
CHEAP = {"validate", "plan", "--version"}
"""The commands a `console` block may run here: they read a sweep file and compile nothing (and
`--help` of any command)."""


def _pages() -> list[str]:
    return ["README.md", *(f"docs/{p.name}" for p in sorted((ROOT / "docs").glob("*.md")))]


@dataclass
class Block:
    page: str
    line: int  # of the opening fence, from 1
    lang: str
    lines: list[str]  # without the fence's indentation
    before: str  # the nearest line above the fence that is not blank

    @property
    def where(self) -> str:
        return f"{self.page}:{self.line}"


def _blocks(page: str) -> list[Block]:
    lines = (ROOT / page).read_text().splitlines()
    found, i = [], 0
    while i < len(lines):
        opening = re.match(r"^(\s*)```([\w+-]*)\s*$", lines[i])
        if not opening:
            i += 1
            continue
        indent, end = len(opening[1]), i + 1
        while not re.match(r"^\s*```\s*$", lines[end]):
            end += 1
        before = next((x.strip() for x in reversed(lines[:i]) if x.strip()), "")
        body = [x[indent:] if x[:indent].strip() == "" else x for x in lines[i + 1 : end]]
        found.append(Block(page, i + 1, opening[2], body, before))
        i = end + 1
    return found


def _output_blocks() -> list[Block]:
    return [b for p in _pages() if p not in GENERATED for b in _blocks(p) if b.lang in OUTPUT_LANGS]


# --- running a command as a block shows it --------------------------------------------------------


@contextlib.contextmanager
def _in(cwd: Path, **env: str) -> Iterator[None]:
    before, old_env = Path.cwd(), {k: os.environ.get(k) for k in env}
    os.chdir(cwd)
    os.environ.update(env)
    try:
        yield
    finally:
        os.chdir(before)
        for k, v in old_env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _orchestrate(argv: list[str], cwd: Path) -> tuple[int, str]:
    """`orchestrate ARGV` in this process from `cwd`: its exit status and what it printed, stdout
    and stderr as a terminal interleaves them (at a fixed width, for `--help`)."""
    printed = io.StringIO()
    with _in(cwd, COLUMNS="100"), contextlib.redirect_stdout(printed), contextlib.redirect_stderr(printed):
        code = main(argv)
    return code, printed.getvalue()


def _console(lines: list[str], cwd: Path) -> list[str]:
    """A `console` block as its `$ orchestrate ...` lines make it today: each command, then what it
    printed."""
    shown = []
    for line in lines:
        if not line.startswith("$ "):
            continue
        argv = shlex.split(line[2:])
        assert argv[0] == "orchestrate", f"{line!r}: a console block here runs `orchestrate` only"
        args = argv[1:]
        cheap = args[:1] and (args[0] in CHEAP or "--help" in args or "-h" in args)
        assert cheap, f"{line!r} is not run by this test: show an excerpt of a results page instead"
        if args[0] == "plan" and "--hardware" not in args:
            torch = pytest.importorskip("torch")
            if torch.cuda.is_available():
                pytest.skip("`plan` on this machine plans for its GPU, the doc shows a CPU machine's")
        shown += [line, *_orchestrate(args, cwd)[1].splitlines()]
    return shown


def _mixed_plan(block: Block, tmp: Path) -> list[str]:
    """docs/commands.md: the plan of tests/test_capabilities.py's sweep over A100, V100 and T4."""
    from tests.test_capabilities import SWEEP

    (tmp / "mixed.yaml").write_text(SWEEP)
    return _console(block.lines, tmp)


def _lock_refusal(block: Block, tmp: Path) -> list[str]:
    """docs/fleet.md: a sweep into an output another host's live driver holds (its lock, as that
    driver wrote it), refused before Ray starts."""
    from store.layout import LOCK_FILE

    out = tmp / "runs" / "x"
    out.mkdir(parents=True)
    (tmp / "sweeps").symlink_to(ROOT / "sweeps")
    command = "orchestrate sweep sweeps/smoke.yaml --out runs/x"
    holder = {"token": "t", "pid": 4242, "pid_started": None, "host": "node-3"}
    holder.update(started_at="2026-11-25T16:16:31Z", heartbeat=time.time(), command=command)
    (out / LOCK_FILE).write_text(json.dumps(holder))
    code, printed = _orchestrate(shlex.split(command)[1:], tmp)
    assert code == 2 and not (out / "run.json").exists(), printed
    return printed.splitlines()


def _missing_extras(block: Block, tmp: Path) -> list[str]:
    """docs/offline-install.md: a sweep without Ray, a validate of hf: models without transformers."""
    from tests.test_extras import _orchestrate_without

    sweep = _orchestrate_without("ray", "sweep", "sweeps/smoke.yaml", "--out", str(tmp / "out"))
    validate = _orchestrate_without("transformers", "validate", "sweeps/smoke.yaml")
    return [*sweep.stderr.splitlines(), *validate.stderr.splitlines()]


def _spec_error_of_a_dict(block: Block, tmp: Path) -> list[str]:
    """docs/python-api.md: the page's `SpecError` block, run as written."""
    from orchestrator import load_spec

    (code,) = [
        b for b in _blocks(block.page) if b.lang == "python" and "except SpecError" in "\n".join(b.lines)
    ]
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec("\n".join(code.lines), {"load_spec": load_spec})
    return printed.getvalue().splitlines()


SAMPLES: dict[tuple[str, str], Callable[[Block, Path], list[str]]] = {
    ("docs/commands.md", "$ orchestrate plan mixed.yaml"): _mixed_plan,
    ("docs/fleet.md", "error: runs/x is in use by another orchestrate driver"): _lock_refusal,
    ("docs/offline-install.md", "error: `orchestrate sweep` needs the fleet extra"): _missing_extras,
    ("docs/python-api.md", "2 problem(s) in the sweep:"): _spec_error_of_a_dict,
}
"""Output blocks with a producer of their own: (page, the start of the block's first line) -> what
makes the block's lines today."""


def _producer(block: Block) -> Callable[[Block, Path], list[str]] | None:
    first = block.lines[0] if block.lines else ""
    for (page, start), make in SAMPLES.items():
        if page == block.page and first.startswith(start):
            return make
    if block.lang == "console":
        return lambda b, tmp: _console(b.lines, ROOT)
    return None


def _fits(shown: list[str], printed: list[str]) -> bool:
    """Whether the doc's lines are the printed ones, where a doc line `...` stands for one or more
    printed lines; trailing white space aside, job ids as placeholders."""
    doc = [JOB_ID.sub("<job_id>", x.rstrip()) for x in shown]
    out = [JOB_ID.sub("<job_id>", x.rstrip()) for x in printed]
    memo: dict[tuple[int, int], bool] = {}

    def fits(i: int, j: int) -> bool:
        if (i, j) not in memo:
            if i == len(doc):
                memo[i, j] = j == len(out)
            elif doc[i].strip() == "...":
                memo[i, j] = any(fits(i + 1, k) for k in range(j + 1, len(out) + 1))
            else:
                memo[i, j] = j < len(out) and doc[i] == out[j] and fits(i + 1, j + 1)
        return memo[i, j]

    return fits(0, 0)


def test_a_doc_line_of_dots_stands_for_lines_left_out_and_only_job_ids_may_differ():
    assert _fits(["a", "...", "d"], ["a", "b", "c", "d"]) and _fits(["a", "  ...", "d"], ["a", "b", "d"])
    assert not _fits(["a", "...", "d"], ["a", "d"]) and not _fits(["a", "d"], ["a", "b", "d"])
    assert _fits(["1  cpu/mlp  3834b12d1a95355bcfba  300s"], ["1  cpu/mlp  d9a7ba8f3b98131ec3c2  300s"])
    assert not _fits(["1  cpu/mlp  300s"], ["1  cpu/mlp  301s"])


def test_every_output_block_is_produced_by_a_test_or_an_excerpt_of_a_results_page():
    loose = [
        f"{b.where}: {(b.lines or [''])[0][:70]!r}"
        for b in _output_blocks()
        if not EXCERPT.match(b.before) and _producer(b) is None
    ]
    assert loose == [], (
        "output blocks no test produces: show the command's output in a ```console block with its "
        "`$ orchestrate ...` line (a command that compiles nothing), give the block a producer in "
        "tests/test_docs_drift.py's SAMPLES, or put `<!-- excerpt: docs/results/PAGE.md -->` above it"
    )


def test_each_producer_of_samples_finds_its_block():
    blocks = _output_blocks()
    for page, start in SAMPLES:
        found = [b for b in blocks if b.page == page and (b.lines or [""])[0].startswith(start)]
        assert len(found) == 1, f"{page}: {len(found)} output blocks start with {start!r}, not one"


PRODUCED = [b for b in _output_blocks() if not EXCERPT.match(b.before) and _producer(b) is not None]


@pytest.mark.parametrize("block", PRODUCED, ids=[b.where for b in PRODUCED])
def test_each_sample_is_what_its_command_prints(block, tmp_path):
    printed = _producer(block)(block, tmp_path)
    diff = "\n".join(difflib.unified_diff(block.lines, printed, "the doc", "printed now", lineterm=""))
    assert _fits(block.lines, printed), f"{block.where} differs from what its command prints:\n{diff}"


def _excerpts() -> Iterator[tuple[str, int, str, list[str]]]:
    """(page, line, the results page named, the lines shown): each excerpt marker and the block or
    paragraph below it."""
    for page in _pages():
        lines = (ROOT / page).read_text().splitlines()
        for i, line in enumerate(lines):
            marker = EXCERPT.match(line.strip())
            if not marker:
                continue
            rest = lines[i + 1 :]
            if rest and rest[0].strip().startswith("```"):
                end = next(k for k in range(1, len(rest)) if rest[k].strip().startswith("```"))
                shown = rest[1:end]
            else:
                shown = []
                for x in rest:
                    if not x.strip():
                        break
                    shown.append(x)
            yield page, i + 1, marker[1], shown


def test_every_excerpt_names_a_results_page_that_holds_its_lines():
    excerpts = list(_excerpts())
    assert excerpts, "the README shows at least one excerpt of a results page"
    for page, line, source, shown in excerpts:
        assert source.startswith("docs/results/") and (ROOT / source).is_file(), (
            f"{page}:{line}: an excerpt names {source}, which is no page of docs/results/"
        )
        held = (ROOT / source).read_text()
        missing = [x.strip() for x in shown if x.strip() not in ("", "...") and x.strip() not in held]
        assert shown and missing == [], f"{page}:{line}: lines {source} does not hold: {missing}"


# --- the generated pages ----------------------------------------------------------------------------


def test_the_cli_and_column_references_are_what_the_code_gives():
    stale = docs_gen.stale()
    assert stale == [], f"{', '.join(stale)} differ from the code: run `{docs_gen.REGENERATE}`"
    assert docs_gen.main(["--check"]) == 0


def test_the_check_finds_a_page_that_differs(tmp_path, capsys):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "cli.md").write_text(docs_gen.cli_page())
    (tmp_path / "docs" / "columns.md").write_text(
        docs_gen.columns_page().replace("| `job_id` |", "| `jobid` |")
    )
    assert docs_gen.stale(tmp_path) == ["docs/columns.md"]


def test_the_cli_reference_names_every_command_and_flag_and_every_column():
    from store.fields import RESULT_FIELDS
    from store.preset_fields import PRESET_FIELDS

    cli = (ROOT / "docs" / "cli.md").read_text()
    sub = next(a for a in build_parser()._actions if a.__class__.__name__ == "_SubParsersAction")
    for name, parser in sub.choices.items():
        assert f"## `orchestrate {name}`" in cli
        section = cli.split(f"## `orchestrate {name}`")[1].split("\n## ")[0]
        for action in parser._actions:
            for flag in action.option_strings:
                assert flag in ("-h", "--help") or f"`{flag}" in section, f"{name} {flag}"
    columns = (ROOT / "docs" / "columns.md").read_text()
    assert all(f"| `{n}` | `{t}` |" in columns for n, t, _ in [*RESULT_FIELDS, *PRESET_FIELDS])


# --- commands, links and versions in the prose --------------------------------------------------------


def _orchestrate_commands() -> Iterator[tuple[str, list[str]]]:
    """(where, argv) of every `orchestrate` (or `python -m orchestrator`) command in a bash block."""
    for page in _pages():
        for block in _blocks(page):
            if block.lang not in ("bash", "sh", "shell"):
                continue
            text = "\n".join(block.lines).replace("\\\n", " ")
            for line in text.splitlines():
                words = shlex.split(re.sub(r"<[^<>\n]*>", "X", line), comments=True)  # <job id>: a value
                command: list[str] = []
                for i, word in enumerate([*words, ";"]):
                    if word in ("&&", "||", ";", "|") or re.match(r"^\d*[<>]", word):
                        if command:
                            yield block.where, command
                        command = []
                    elif command or word == "orchestrate":
                        command.append(word)
                    elif word == "orchestrator" and i and words[i - 1] == "-m":
                        command.append("orchestrate")


def test_every_orchestrate_command_in_the_docs_parses_with_todays_flags():
    commands = list(_orchestrate_commands())
    assert len(commands) > 20
    refused = []
    for where, argv in commands:
        said = io.StringIO()
        try:
            with contextlib.redirect_stderr(said), contextlib.redirect_stdout(io.StringIO()):
                build_parser().parse_args(argv[1:])
        except SystemExit as exc:
            if exc.code:
                refused.append(f"{where}: {shlex.join(argv)}: {said.getvalue().strip()}")
    assert refused == []


def _slug(heading: str) -> str:
    """The anchor GitHub gives a heading."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    found: set[str] = set()
    fenced = False
    for line in path.read_text().splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
        heading = None if fenced else re.match(r"^#{1,6}\s+(.*?)\s*$", line)
        if heading:
            slug, n = _slug(heading[1]), 0
            while (slug if n == 0 else f"{slug}-{n}") in found:
                n += 1
            found.add(slug if n == 0 else f"{slug}-{n}")
    return found


def test_every_relative_link_and_anchor_resolves():
    broken = []
    for page in _pages():
        text = re.sub(r"^[ \t]*```.*?^[ \t]*```", "", (ROOT / page).read_text(), flags=re.S | re.M)
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"^[a-z][a-z0-9+.-]*:", target):
                continue
            path, _, anchor = target.partition("#")
            dest = (ROOT / page).parent / path if path else ROOT / page
            if not dest.exists():
                broken.append(f"{page}: {target}: no such file")
            elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
                broken.append(f"{page}: {target}: no such heading")
    assert broken == []


def _claims_text() -> dict[str, str]:
    """Each page's text less its excerpts of results pages (what a past run printed, with the
    versions of its day)."""
    texts = {}
    for page in _pages():
        text = (ROOT / page).read_text()
        for _, _, _, shown in _excerpts():
            for line in shown:
                text = text.replace(line, "")
        texts[page] = text
    return texts


def test_the_versions_the_docs_name_are_the_codes():
    from compiler.known_gpus import TABLE_VERSION
    from orchestrator.tune.presets import PRESET_FORMAT
    from store.schema import SCHEMA_VERSION

    thresholds = json.loads((ROOT / "compiler" / "statistics" / "thresholds.json").read_text())["version"]
    wrong = []
    for page, text in _claims_text().items():
        text = " ".join(text.split())
        for pattern, version in (
            (r"thresholds v(\d+)", thresholds),
            (r"thresholds\.json`? \(?(?:version |v)(\d+)", thresholds),
            (r"capability table v(\d+)", TABLE_VERSION),
            (r"presets\.json`? \(format (\d+)\)", PRESET_FORMAT),
            (r"current schema(?: version)?(?: is)? \**(\d+)", SCHEMA_VERSION),
        ):
            wrong += [
                f"{page}: {m[0]!r}, the code: {version}"
                for m in re.finditer(pattern, text)
                if int(m[1]) != version
            ]
        for m in re.finditer(r"\bschema(?: version)? (\d+)\b", text):
            if int(m[1]) > SCHEMA_VERSION:
                wrong.append(f"{page}: {m[0]!r}, beyond the code's schema version {SCHEMA_VERSION}")
    assert wrong == []


def _flags(command: str) -> set[str]:
    sub = next(a for a in build_parser()._actions if a.__class__.__name__ == "_SubParsersAction")
    return {f for a in sub.choices[command]._actions for f in a.option_strings if f != "--help"} - {"-h"}


def test_commands_md_names_the_flags_each_command_shares_with_sweep_as_the_parser_has_them():
    text = " ".join((ROOT / "docs" / "commands.md").read_text().split())
    flags = r"((?:`--[\w-]+`(?:, and |, | and ))*`--[\w-]+`)"
    lacking = dict(re.findall(rf"`(\w+)` takes every flag of `sweep` except {flags}", text))
    assert set(lacking) == {"submit", "tune"}
    for command, named in lacking.items():
        assert set(re.findall(r"`(--[\w-]+)`", named)) == _flags("sweep") - _flags(command), command
    (nightly,) = re.findall(r"`nightly` takes, of `sweep`'s flags, only [^.]*\.", text)
    assert set(re.findall(r"`(--[\w-]+)`", nightly)) == _flags("nightly")


def test_commands_md_gives_the_history_folders_names_as_nightly_makes_them():
    from orchestrator.workflows.nightly import RUN_NAME, run_name

    text = (ROOT / "docs" / "commands.md").read_text()
    (form,) = set(re.findall(r"`(Y{4}-M{2}-D{2}T[HMS]{6}Z)`", text))
    assert re.sub(r"\d", "9", run_name(0)) == re.sub(r"[YMDHS]", "9", form)
    examples = set(re.findall(r"DIR/([\dT-]+Z)/", text))
    assert examples and all(RUN_NAME.match(e) for e in examples)


# --- the README and the testing page ---------------------------------------------------------------


def _ci() -> str:
    return (ROOT / ".ci" / "run").read_text()


def test_the_readme_is_the_front_door_and_installs_as_ci_does():
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= README_MAX_LINES, f"README.md is over {README_MAX_LINES} lines"
    quick = readme.split("## Quick start")[1].split("\n## ")[0]
    (commands,) = [b for b in re.findall(r"```bash\n(.*?)```", quick, flags=re.S)]
    installs = [line for line in commands.splitlines() if "pip install" in line]
    assert installs and all("-c constraints.txt" in line for line in installs), installs
    spec = re.search(r"pip install(?: --[\w-]+)* (torch==\S+ -e '\.\[test\]' -c constraints\.txt)", _ci())
    assert spec and f"python3 -m pip install {spec[1]}" in commands
    tests = re.findall(r"^python3 -m pytest .*$", _ci(), flags=re.M)
    assert tests[0] in commands, "the README's test command is .ci/run's first test tier"
    assert "orchestrate sweep sweeps/smoke.yaml" in commands


def test_the_testing_page_says_how_to_test_and_logs_no_run():
    tomllib = pytest.importorskip("tomllib")
    page = (ROOT / "docs" / "testing.md").read_text()
    for command in re.findall(r"^python3 -m pytest .*$", _ci(), flags=re.M):
        assert command in page, f"docs/testing.md does not name .ci/run's tier {command!r}"
    markers = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]["markers"]
    for marker in (m.split(":")[0] for m in markers):
        assert f"`{marker}`" in page, f"docs/testing.md does not name the marker {marker}"
    runs = re.findall(r"\b20\d\d-\d\d-\d\d\b|\b\d+m\d+s\b|\b\d+(?:\.\d+)? s\b", page)  # dates, durations
    assert runs == [], f"docs/testing.md says how to test, not how past runs went: {runs}"
