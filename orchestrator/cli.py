"""`orchestrate`: validate, plan and run torch.compile sweeps; derive presets and reports.

The top-level parser, `main` and its warning hook; each command group lives in its own module of
`orchestrator.commands`, which registers its subparsers and runs them."""

from __future__ import annotations

import argparse
import atexit
import contextlib
import errno
import faulthandler
import os
import signal
import sys
import warnings

from orchestrator.commands import export, jobs, kernels, nightly, presets, report, spec, sweep, tune
from orchestrator.commands.common import EXIT_BAD_INPUT, EXIT_INTERRUPTED

DESCRIPTION = """\
Find the fastest torch.compile settings for your models on every hardware class of a Ray cluster.

  orchestrate validate sweeps/smoke.yaml      check a sweep file, report every problem with its line
  orchestrate plan sweeps/smoke.yaml          show the jobs a sweep would run; runs nothing
  orchestrate sweep sweeps/smoke.yaml         run it (private local Ray unless --address is given)
  orchestrate report runs/smoke               speedup table per hardware class -> runs/smoke/report.md
  orchestrate presets runs/smoke              fastest ok config per cell -> runs/smoke/presets.json
  orchestrate tune sweeps/smoke.yaml          search beyond the stock modes -> runs/smoke-tune/presets.json
  orchestrate export runs/smoke-tune --hardware cpu --dest DIR   presets + compile-cache bundles
"""


class _Parser(argparse.ArgumentParser):
    """argparse with its errors on one line (the usage block it prints first hides the message)."""

    def error(self, message: str):
        self.exit(EXIT_BAD_INPUT, f"error: {message.removeprefix('argument ')} (see `{self.prog} --help`)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="orchestrate", description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    import orchestrator

    parser.add_argument(
        "--version",
        action="version",
        version=f"%(prog)s {orchestrator.__version__}",
        help="print the version and exit",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    # in this order: `orchestrate --help` lists the commands as they are added
    for group in (spec, sweep, report, nightly, presets, tune, export, kernels, jobs):
        group.add_parsers(sub)
    return parser


def _print_warning(message, category, filename, lineno, file=None, line=None) -> None:
    """Warnings of ours (a stray file ignored) as one `warning:` line; others as Python shows them."""
    from store.integrity import OutputWarning

    if issubclass(category, OutputWarning):
        if str(message) not in _warned:  # once per command, however often the table is read
            _warned.add(str(message))
            print(f"{getattr(category, 'prefix', 'warning')}: {message}", file=sys.stderr)
    else:
        _show_warning(message, category, filename, lineno, file, line)


_show_warning = warnings.showwarning
_warned: set[str] = set()


def run() -> None:
    """The `orchestrate` command and `python -m orchestrator`: `main`, then exit with its code.

    After Ctrl-C, CPython ends the process by SIGINT (a subprocess sees -2, not 130) although `main`
    caught the KeyboardInterrupt, whenever the interrupt landed in code that exec() ran from a
    string: dataclasses build their methods so, while a module such as transformers is imported (3.11
    to 3.13, in 2 to 4 of 5 tries of a loop of dataclasses). So an interrupted command leaves here,
    after the exit functions a normal exit runs (Ray's shutdown, temporary folders), with 130."""
    code = main()
    if code == EXIT_INTERRUPTED:
        atexit._run_exitfuncs()
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os._exit(code)
    sys.exit(code)


def main(argv: list[str] | None = None) -> int:
    for name in ("stdout", "stderr"):  # a stream closed before we started (`>&-`): Python gives None
        if getattr(sys, name) is None:
            setattr(sys, name, _Closed(name))
    try:
        return _main(argv)
    except KeyboardInterrupt:  # Ctrl-C before a sweep's job loop (which says how to resume) or after it
        with contextlib.suppress(OSError, ValueError):
            print("\ninterrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except Exception as exc:
        from orchestrator.extras import missing_extra

        # a role's package not installed (Ray for a sweep, transformers for hf: models): the extra
        reason = missing_extra(exc) or _environment_failure(exc)
        if reason is None:
            raise
        with contextlib.suppress(OSError, ValueError):
            print(f"error: {reason}", file=sys.stderr)
        return EXIT_BAD_INPUT


def _environment_failure(exc: Exception) -> str | None:
    """What failed, as one line, where `exc` was raised while importing a module from outside this
    project (a package broken by an environment variable, a module on PYTHONPATH that shadows one
    we need) or is an ImportError: the Python environment, not the command, needs fixing. None for
    anything else (a bug of ours keeps its traceback)."""
    import traceback

    frames = traceback.extract_tb(exc.__traceback__)  # from `main` down
    importing = any(f.name == "<module>" for f in frames[1:])  # module-level code: an import
    if not frames or not (importing or isinstance(exc, ImportError)):
        return None
    where = next((f.filename for f in reversed(frames) if not f.filename.startswith("<")), "?")
    ours = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    if not isinstance(exc, ImportError) and os.path.abspath(where).startswith(ours + os.sep):
        return None
    text = " ".join(str(exc).split())[:300]
    return (
        f"importing a module failed in {where}: {type(exc).__name__}: {text}. The Python environment needs "
        "fixing (PYTHONPATH, or an environment variable of that package), not the command"
    )


def _main(argv: list[str] | None) -> int:
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as exc:  # --help (0), or a bad flag (2, already explained on one line)
        return exc.code if isinstance(exc.code, int) else EXIT_BAD_INPUT
    from orchestrator.extras import command_needs

    lacking = command_needs(args.command)  # Ray for a sweep: said before anything is written
    if lacking:
        print(f"error: {lacking}", file=sys.stderr)
        return EXIT_BAD_INPUT
    args.argv = list(sys.argv[1:] if argv is None else argv)  # for the command that resumes this one
    # `kill -USR1 PID`: every thread's stack on stderr, to see where it waits (not where stderr is
    # no file, as under a test's capture)
    with contextlib.suppress(AttributeError, OSError, ValueError):
        faulthandler.register(signal.SIGUSR1, all_threads=True)
    from orchestrator.fleet.address import AddressError
    from orchestrator.fleet.cache import CacheAddressError
    from store.storage import StorageError

    _always_show_output_warnings()
    warnings.showwarning = _print_warning
    _warned.clear()
    stdout, stderr = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = watched = _Watched(stdout), _Watched(stderr)
    try:
        code = args.func(args)
        sys.stdout.flush()  # a full disk under stdout shows here, not as a traceback at exit
        return code
    except (StorageError, AddressError, CacheAddressError) as exc:  # a locked output, a dead --address, ...
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except BrokenPipeError:  # output piped into `head` or a pager that quit: not an error of ours
        _quiet_stdout()
        return 0
    except OSError as exc:  # ENOSPC, EIO, ... on stdout (/dev/full); any other OSError is not ours to hide
        if not any(exc is w.failed for w in watched):
            raise
        sys.stdout, sys.stderr = stdout, stderr
        _quiet_stdout()
        name = "output" if exc is watched[0].failed else "error"
        with contextlib.suppress(OSError, ValueError):
            print(f"error: cannot write to standard {name}: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    finally:
        sys.stdout, sys.stderr = stdout, stderr
        warnings.showwarning = _show_warning


class _Closed:
    """A standard stream that was closed before the command started: writing to it fails as
    writing to a closed descriptor does (EBADF), which `main` turns into one line, exit 2."""

    def __init__(self, name: str) -> None:
        self.name = name

    def write(self, text):
        raise OSError(errno.EBADF, f"standard {self.name.removeprefix('std')} is closed")

    def flush(self):  # nothing was written: nothing to flush (also at interpreter exit)
        pass

    def fileno(self):
        raise OSError(errno.EBADF, "closed")


class _Watched:
    """A standard stream that remembers the OSError its last write or flush raised (ENOSPC, EIO),
    so `main` tells it from the other OSErrors of a command."""

    def __init__(self, stream) -> None:
        self._stream = stream
        self.failed: OSError | None = None

    def write(self, text):
        try:
            return self._stream.write(text)
        except OSError as exc:
            self.failed = exc
            raise

    def flush(self):
        try:
            return self._stream.flush()
        except OSError as exc:
            self.failed = exc
            raise

    def __getattr__(self, name):
        return getattr(self._stream, name)


def _quiet_stdout() -> None:
    """Point stdout at /dev/null, so the flush at interpreter exit prints no second traceback."""
    with contextlib.suppress(OSError, ValueError, AttributeError):
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


def _always_show_output_warnings() -> None:
    """Python shows a warning once per code location; ours name files, so each command shows its
    own (deduplicated by `_print_warning`), not only the first command of a process."""
    from store.integrity import OutputWarning

    warnings.filterwarnings("always", category=OutputWarning)
