"""`export`: one hardware class's presets plus their compile-cache bundles and AOTInductor packages."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from orchestrator.commands.common import EXIT_BAD_INPUT, _whole
from orchestrator.store.location import arg as location_arg


def add_parsers(sub) -> None:
    p = sub.add_parser(
        "export",
        help="one hardware class's presets plus a compile-cache bundle per preset, for compiler.apply",
        description="Write DEST/presets.json (per model, batch size and dtype the fastest ok config of the "
        "class, and per dtype a class default for models never swept), DEST/bundles/*.bin (a cold compile of "
        "each preset in a fresh process, saved with torch.compiler.save_cache_artifacts) and DEST/manifest.json "
        "(the class, the software stack, the sha256 of every file), and DEST/packages/*.pt2: each preset compiled "
        "ahead of time for its batch size (AOTInductor, without weights), built in the same process and shipped "
        "only once a fresh process loaded it, which "
        "compiler.apply.compile_tuned loads with the serving model's weights instead of tracing and compiling. "
        "Runs on a node of that class with the stack the sweep ran on, and refuses anything else before "
        "compiling. Load it in production with compiler.apply.compile_tuned.",
    )
    p.add_argument(
        "out", type=location_arg, help="sweep output directory: a path or a URI such as s3://BUCKET/PREFIX"
    )
    p.add_argument("--hardware", required=True, help="the hardware class to export (e.g. H100, A100, cpu)")
    p.add_argument(
        "--dest",
        required=True,
        type=location_arg,
        help="a new (or empty) local directory to write (a local path, or file:///ABSOLUTE/PATH)",
    )
    p.add_argument(
        "--cpus",
        type=_whole(1),
        default=None,
        metavar="N",
        help="cores each bundle compile uses (default: all)",
    )
    p.add_argument(
        "--scratch", default=None, help="where the bundle compiles keep their caches (default: $TMPDIR)"
    )
    p.add_argument(
        "--resume",
        action="store_true",
        help="carry on an export into DEST that was interrupted (killed, timed out): the presets it finished "
        "are kept, the others built",
    )
    p.add_argument(
        "--no-packages",
        action="store_true",
        help="bundles only: skip the AOTInductor packages (each adds an export, an ahead-of-time compile and "
        "a load test in a fresh process to the preset's bundle job: 57-81 s on an H200, 16-24 s for the smoke "
        "models on a 2-core CPU); a stack whose loader crashes gets none anyway",
    )
    p.set_defaults(func=cmd_export)


def cmd_export(args) -> int:
    from orchestrator.store.storage import StorageError, checked
    from orchestrator.tune.export import ExportError, export

    try:
        source = checked(args.out)
        dest = _local_dest(args.dest)
        manifest = export(
            source,
            args.hardware,
            dest,
            threads=args.cpus,
            scratch_root=args.scratch,
            packages=not args.no_packages,
            resume=args.resume,
            log=lambda line: print(line, flush=True),
        )
    except (ExportError, StorageError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    bundles = sum(1 for f in manifest["files"] if f.startswith("bundles/"))
    packages = sum(1 for f in manifest["files"] if f.startswith("packages/"))
    print(
        f"wrote {args.dest}: presets.json, {bundles} bundles, {packages} packages, manifest.json "
        f"(stack: {manifest['stack']})"
    )
    return 0


def _local_dest(text: str) -> Path:
    """`--dest`, checked before any compile: a local directory (a path or file:///PATH) that
    exists or can be made, and that this process can write (ValueError naming the problem and
    the fix otherwise). Object stores are refused: the packages are built and verified in place."""
    from orchestrator.store.location import shown
    from orchestrator.store.storage import is_uri, resolve

    if is_uri(text) and not text.lower().startswith("file://"):
        raise ValueError(
            f"--dest {shown(text)}: an export is written to a local directory (a path or file:///PATH); "
            "writing it to an object store is not supported: export to a local directory, then copy it "
            "(e.g. `aws s3 cp --recursive DIR s3://BUCKET/PREFIX`); compile_tuned reads it from there"
        )
    dest = resolve(text).local_path
    try:
        if dest.exists() and not dest.is_dir():
            raise ValueError(
                f"--dest {shown(text)}: is a file, not a directory; give a new or empty directory"
            )
        dest.mkdir(parents=True, exist_ok=True)
        probe = dest / f".write-check-{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as exc:
        raise ValueError(f"--dest {shown(text)}: cannot write there: {exc.strerror or exc}") from None
    return dest
