"""Unreadable and invalid sweep files: one `file:line: message` per problem, exit 2, never a
traceback or a hang, whatever the bytes.

The hand-made cases are the rows of the sweep-file table in docs/bad-input.md (a test checks the
table shows the message each case gives today); the fuzz test mutates the shipped sweeps."""

from __future__ import annotations

import os
import random
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from orchestrator.cli import main
from orchestrator.spec.sweep import SpecError, SweepSpec, load_spec

REPO = Path(__file__).resolve().parents[2]
SHIPPED = sorted((REPO / "sweeps").glob("*.yaml"))
SMOKE = (REPO / "sweeps" / "smoke.yaml").read_text()
DOC = REPO / "docs" / "bad-input.md"

BOMB = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{n}: &{n} [{', '.join([f'*{p}'] * 9)}]\n" for p, n in zip("abcdefghi", "bcdefghij", strict=True)
)


def _smoke_with(old: str, new: str) -> bytes:
    assert old in SMOKE, old
    return SMOKE.replace(old, new, 1).encode()


# name -> what goes at the path: bytes for a file, None for a directory
CASES: dict[str, Callable[[], bytes | None]] = {
    "a NUL byte": lambda: _smoke_with("name: smoke", "name: sm\x00oke"),
    "not UTF-8 (Latin-1)": lambda: SMOKE.replace("reduced", "r\xe9duced", 1).encode("latin-1"),
    "a binary file (ELF)": lambda: Path(sys.executable).resolve().read_bytes()[:4096],
    "a directory": lambda: None,
    "an empty file": lambda: b"",
    "whitespace only": lambda: b"\n   \n\t\n",
    "a control character": lambda: _smoke_with("name: smoke", "name: smo\x1bke"),
    "over 1 MiB": lambda: b"# padding\n" * 120_000 + SMOKE.encode(),
    "an alias bomb": lambda: BOMB.encode(),
    "a recursive alias": lambda: b"name: x\nmodels: &m [*m]\n",
    "a recursive merge key": lambda: b"name: x\nconfigs: &c {<<: *c}\n",
    "10,000 nested lists": lambda: b"name: x\nmodels: " + b"[" * 10_000 + b"]" * 10_000 + b"\n",
    "an impossible date": lambda: _smoke_with("name: smoke", "name: 2024-13-45"),
    "a list as a key": lambda: _smoke_with("name: smoke", "? [a, b]\n: 1\nname: smoke"),
    "a top-level list": lambda: b"- name: smoke\n",
    "a tab for indentation": lambda: _smoke_with("  warmup: 3", "\twarmup: 3"),
    "batch size 2^40": lambda: _smoke_with("batch_sizes: [1, 4]", "batch_sizes: [1, 1099511627776]"),
    "iterations 10^9": lambda: _smoke_with("iterations: 20", "iterations: 1000000000"),
    "10^8 timed calls": lambda: _smoke_with("iterations: 20", "iterations: 100000\n  rounds: 1000"),
    "timeout_s .inf": lambda: _smoke_with("timeout_s: 300", "timeout_s: .inf"),
    "timeout_s .nan": lambda: _smoke_with("timeout_s: 300", "timeout_s: .nan"),
    "timeout_s a year": lambda: _smoke_with("timeout_s: 300", "timeout_s: 31536000"),
    "timeout_s 10^400": lambda: _smoke_with("timeout_s: 300", "timeout_s: 1" + "0" * 400),
    "input_size 10^6": lambda: _smoke_with("input_size: 64", "input_size: 1000000"),
    "a 500-character name": lambda: _smoke_with("name: smoke", "name: " + "s" * 500),
    "a megabyte-long value": lambda: _smoke_with("dtypes: [fp32]", "dtypes: [" + "x" * 900_000 + "]"),
    "a tag that cannot be read (!!timestamp)": lambda: _smoke_with("name: smoke", "name: !!timestamp nope"),
    "a tag that cannot be read (!!bool)": lambda: _smoke_with("name: smoke", "name: !!bool maybe"),
    "a python tag on a list": lambda: _smoke_with(  # was read as the plain list [1, 4] (never run)
        "batch_sizes: [1, 4]", "batch_sizes: !!python/object/apply:os.system [1, 4]"
    ),
    "a date as an option value": lambda: _smoke_with(
        "  default: {}", "  default: {options: {max_autotune: 2024-01-01}}"
    ),
    "bytes as an option value": lambda: _smoke_with(
        "  default: {}", "  default: {options: {max_autotune: !!binary aGk=}}"
    ),
    "a number as an option name": lambda: _smoke_with("  default: {}", "  default: {options: {1: true}}"),
    "overrides with mixed key types": lambda: _smoke_with(
        "overrides: {embedding_size: 16,", "overrides: {x: {1: 2, a: 3}, embedding_size: 16,"
    ),
    "a 40,000-character python: module path": lambda: _smoke_with(
        "python:workers.toy:mlp", "python:" + "a." * 20_000 + "b:f"
    ),
    "a python: package that raises on import": lambda: _smoke_with(
        "python:workers.toy:mlp", "python:co_fuzz_raises.sub:f"
    ),
    "a python: package whose import never returns": lambda: _smoke_with(
        "python:workers.toy:mlp", "python:co_fuzz_hangs.sub:f"
    ),
    "a python: package that calls sys.exit on import": lambda: _smoke_with(
        "python:workers.toy:mlp", "python:co_fuzz_exits.sub:f"
    ),
    "a python: package that calls os._exit on import": lambda: _smoke_with(
        "python:workers.toy:mlp", "python:co_fuzz_os_exit.sub:f"
    ),
    "one model twice under two names": lambda: _smoke_with(
        "  - id: python:workers.toy:mlp\n    name: mlp\n",
        "  - id: python:workers.toy:mlp\n    name: mlp\n  - id: python:workers.toy:mlp\n    name: mlp2\n",
    ),
    "a python: factory its module lacks": lambda: _smoke_with(
        "python:workers.toy:mlp", "python:workers.toy:no_such_factory"
    ),
    "an option value of the wrong type": lambda: _smoke_with(
        "  default: {}", "  default: {options: {max_autotune: [1]}}"
    ),
    "an unknown autotune backend": lambda: _smoke_with(
        "  default: {}", "  default: {options: {max_autotune_gemm_backends: NOPE}}"
    ),
    "a name ending in a newline": lambda: _smoke_with("name: smoke", 'name: "smoke\\n"'),
    "a python: package that kills its interpreter": lambda: _smoke_with(
        "python:workers.toy:mlp", "python:co_fuzz_segfault.sub:f"
    ),
    "a python: package that prints bytes that are not UTF-8, then raises": lambda: _smoke_with(
        "python:workers.toy:mlp", "python:co_fuzz_binary.sub:f"
    ),
}
"""Each gives exit 2 and one line per problem; the table in docs/bad-input.md shows the message."""

ACCEPTED = {
    "CRLF line endings": lambda: SMOKE.replace("\n", "\r\n").encode(),
    "a UTF-8 byte-order mark": lambda: b"\xef\xbb\xbf" + SMOKE.encode(),
    "a UTF-8 description": lambda: _smoke_with("reduced", "r\xe9duit \u2014 reduced").decode().encode(),
}
"""Files an editor may write that are fine: they must still validate."""

PACKAGES = {
    "co_fuzz_raises": "raise RuntimeError('this package fails on import')\n",
    "co_fuzz_hangs": "import time\nwhile True:\n    time.sleep(1)\n",
    "co_fuzz_exits": "import sys\nsys.exit(0)\n",
    "co_fuzz_os_exit": "import os\nos._exit(0)\n",
    "co_fuzz_segfault": "import os, signal\nos.kill(os.getpid(), signal.SIGSEGV)\n",
    # decoding the check's output raised UnicodeDecodeError, a traceback
    "co_fuzz_binary": "import sys\nsys.stdout.buffer.write(b'\\xff\\xfe garbage')\nsys.stdout.flush()\nraise ValueError('no')\n",
    # each held the check until its time limit (10 s), though the module was found
    "co_fuzz_daemon": "import os, time\npid = os.fork()\nif pid == 0:\n    time.sleep(60)\n    os._exit(0)\n"
    "open(os.environ['CO_FUZZ_PID'], 'w').write(str(pid))\n",
    "co_fuzz_thread": "import threading, time\nthreading.Thread(target=time.sleep, args=(60,)).start()\n",
}
"""Packages a python: model id may name, each misbehaving in its __init__ (the check that the
module exists imports the package, in a child interpreter)."""


@pytest.fixture(autouse=True)
def misbehaving_packages(tmp_path_factory, monkeypatch):
    root = tmp_path_factory.getbasetemp() / "packages"
    for name, init in PACKAGES.items():
        (root / name).mkdir(parents=True, exist_ok=True)
        (root / name / "__init__.py").write_text(init)
        (root / name / "sub.py").write_text("def f():\n    pass\n")
    monkeypatch.syspath_prepend(str(root))
    monkeypatch.setattr("orchestrator.spec.imports.TIMEOUT_S", 3.0)


ERROR_LINE = re.compile(r"^\S.*?(:\d+)?: \S")


def _materialize(tmp_path: Path, name: str, make: Callable[[], bytes | None]) -> Path:
    path = tmp_path / (re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-") + ".yaml")
    content = make()
    if content is None:
        path.mkdir()
    else:
        path.write_bytes(content)
    return path


class _Hang(Exception):
    pass


def _validate_quickly(path: Path, limit_s: int = 10) -> SweepSpec | SpecError:
    """`load_spec(path)`: the spec or its SpecError; any other exception fails the test, and so
    does taking longer than `limit_s` (SIGALRM interrupts the parser)."""

    def on_alarm(signum, frame):
        raise _Hang(f"{path.name}: validation took over {limit_s} s")

    previous = signal.signal(signal.SIGALRM, on_alarm)
    signal.alarm(limit_s)
    try:
        return load_spec(path)
    except SpecError as exc:
        return exc
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def _check_error(exc: SpecError, path: Path) -> None:
    assert exc.errors, "a SpecError must list its problems"
    for error in exc.errors:
        text = str(error)
        assert "\n" not in text and len(text) < 2100, text[:300]
        assert text.startswith(f"{path}:") or text.startswith(f"{path}: "), text[:300]
        assert ERROR_LINE.match(text), text[:300]


@pytest.mark.parametrize("name", list(CASES))
def test_bad_file_is_one_line_per_problem_and_exit_2(name, tmp_path, capsys):
    path = _materialize(tmp_path, name, CASES[name])
    result = _validate_quickly(path)
    assert isinstance(result, SpecError), f"{name}: accepted"
    _check_error(result, path)
    assert main(["validate", str(path)]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    if len(result.errors) == 1:
        assert len(lines) == 1 and lines[0].startswith(f"error: {path}"), err[:500]


@pytest.mark.parametrize("package", ["co_fuzz_daemon", "co_fuzz_thread"])
def test_a_python_package_that_leaves_a_process_or_thread_is_checked_at_once(package, tmp_path, monkeypatch):
    """The module is found: its import returned. A process it forked (holding the check's output
    pipe) or a thread it started kept the check waiting for its whole time limit; the forked
    process is killed with the check's session."""
    import psutil

    monkeypatch.setattr("orchestrator.spec.imports.TIMEOUT_S", 20.0)  # what it waited: the whole of it
    monkeypatch.setenv("CO_FUZZ_PID", str(tmp_path / "pid"))
    path = tmp_path / "s.yaml"
    path.write_bytes(_smoke_with("python:workers.toy:mlp", f"python:{package}.sub:f"))
    started = time.monotonic()
    assert isinstance(_validate_quickly(path), SweepSpec)
    assert time.monotonic() - started < 10.0
    if package == "co_fuzz_daemon":
        pid = int((tmp_path / "pid").read_text())
        deadline = time.monotonic() + 3
        while psutil.pid_exists(pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not psutil.pid_exists(pid), "the process the module forked outlived the check"


@pytest.mark.parametrize("name", list(ACCEPTED))
def test_what_editors_write_is_accepted(name, tmp_path):
    result = _validate_quickly(_materialize(tmp_path, name, ACCEPTED[name]))
    assert isinstance(result, SweepSpec), str(result)
    assert result.name == "smoke" and len(result.models) == 3


def test_the_cli_prints_no_traceback_for_a_nul_byte_or_a_bomb(tmp_path):
    """Through the real entry point, in a fresh interpreter (the reported bug was a traceback)."""
    for name in ("a NUL byte", "an alias bomb"):
        path = _materialize(tmp_path, name, CASES[name])
        proc = subprocess.run(
            [sys.executable, "-m", "orchestrator", "validate", str(path)],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert proc.returncode == 2, proc.stderr
        assert "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr


# --- fuzzing -----------------------------------------------------------------------------------

_INSERTS = [
    b"\x00",
    b"\xff\xfe",
    b"\x1b[31m",
    b"\t",
    b":",
    b": ",
    b"- ",
    b"{",
    b"]",
    b"&a ",
    b"*a",
    b"*nope",
    b"<<: *a\n",
    b"!!python/object:os.system ",
    b"!!binary zz",
    b"? ",
    b"%YAML 9.9\n",
    b"---\n",
    b"...\n",
    b"'",
    b'"',
    b"\\",
    b"\r",
    b"\xe2\x80\xa8",
    "\u00e9".encode(),
]
_VALUES = [
    b"1099511627776",
    b"-1",
    b"0",
    b".nan",
    b".inf",
    b"-.inf",
    b"1e999",
    b"2024-13-45",
    b"~",
    b"[]",
    b"{}",
    b"yes",
    b"0x7fffffffffffffff",
    b"9" * 400,
    b"1_000_000_000",
]


def mutate(data: bytes, rng: random.Random) -> bytes:
    """One to three random edits of a sweep file's bytes."""
    for _ in range(rng.randint(1, 3)):
        lines = data.split(b"\n")
        op = rng.randrange(9)
        if op == 0 and data:  # flip a byte
            i = rng.randrange(len(data))
            data = data[:i] + bytes([rng.randrange(256)]) + data[i + 1 :]
        elif op == 1:  # delete a line
            del lines[rng.randrange(len(lines))]
            data = b"\n".join(lines)
        elif op == 2:  # duplicate a line
            i = rng.randrange(len(lines))
            lines.insert(i, lines[i])
            data = b"\n".join(lines)
        elif op == 3 and len(lines) > 1:  # swap two lines
            i, j = rng.sample(range(len(lines)), 2)
            lines[i], lines[j] = lines[j], lines[i]
            data = b"\n".join(lines)
        elif op == 4:  # insert a token
            i = rng.randrange(len(data) + 1)
            data = data[:i] + rng.choice(_INSERTS) + data[i:]
        elif op == 5:  # truncate
            data = data[: rng.randrange(len(data) + 1)]
        elif op == 6:  # a number becomes something absurd
            numbers = list(re.finditer(rb"\b\d+(\.\d+)?\b", data))
            if numbers:
                m = rng.choice(numbers)
                data = data[: m.start()] + rng.choice(_VALUES) + data[m.end() :]
        elif op == 7:  # re-indent a line
            i = rng.randrange(len(lines))
            lines[i] = b" " * rng.randrange(6) + lines[i].lstrip()
            data = b"\n".join(lines)
        else:  # a value becomes a YAML oddity
            values = list(re.finditer(rb": (\S+)", data))
            if values:
                m = rng.choice(values)
                data = (
                    data[: m.start(1)]
                    + rng.choice(_VALUES + [b"&a x", b"*a", b"!!set {a}"])
                    + data[m.end(1) :]
                )
    return data


FUZZ_SEEDS = range(120)


def test_fuzzed_sweep_files_give_errors_not_tracebacks(tmp_path):
    """120 seeded mutations of the shipped sweeps: each is a SweepSpec or a SpecError whose every
    line is `file:line: message`, within 10 s; nothing else escapes."""
    assert len(SHIPPED) >= 5
    outcomes = {"accepted": 0, "refused": 0}
    for seed in FUZZ_SEEDS:
        rng = random.Random(seed)
        source = SHIPPED[seed % len(SHIPPED)]
        path = tmp_path / f"fuzz-{seed}-{source.name}"
        path.write_bytes(mutate(source.read_bytes(), rng))
        try:
            result = _validate_quickly(path)
        except Exception as exc:  # the assertion names the seed, so a failure can be replayed
            raise AssertionError(f"seed {seed} ({source.name}): {type(exc).__name__}: {exc}") from exc
        if isinstance(result, SpecError):
            _check_error(result, path)
            outcomes["refused"] += 1
        else:
            outcomes["accepted"] += 1
    # the mutations must mostly break the files, or the test proves little
    assert outcomes["refused"] >= 60, outcomes


def test_sweep_file_table_in_the_docs_matches_the_messages(tmp_path):
    """docs/bad-input.md lists every hand-made case with the message it gives (the temp path shown
    as FILE); a changed message or a new case must change the table too."""
    doc = DOC.read_text()
    for name, make in CASES.items():
        path = _materialize(tmp_path, name, make)
        result = _validate_quickly(path)
        first = str(result.errors[0]).replace(str(path), "FILE")
        row = f"| {name} | `{_doc_cell(first)}` |"
        assert row in doc, f"docs/bad-input.md lacks the row:\n{row}"


def _doc_cell(text: str) -> str:
    text = text if len(text) <= 160 else text[:156] + " ..."
    return text.replace("|", "\\|").replace("`", "'")


def sweep_file_table(tmp_dir: Path) -> str:
    """The Markdown rows of the sweep-file table (run this to update the doc)."""
    rows = []
    for name, make in CASES.items():
        path = _materialize(tmp_dir, name, make)
        result = _validate_quickly(path)
        first = str(result.errors[0]).replace(str(path), "FILE")
        rows.append(f"| {name} | `{_doc_cell(first)}` |")
    return "\n".join(rows)


if __name__ == "__main__":  # python -m tests.spec.test_bad_files: print the table's rows
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        print(sweep_file_table(Path(tmp)))
    os._exit(0)
