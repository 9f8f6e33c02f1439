"""`export`: one hardware class's presets plus their compile-cache bundles and AOTInductor packages."""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from orchestrator.commands.common import EXIT_BAD_INPUT, scratch_problem, whole
from store.location_forms import arg as location_arg

if TYPE_CHECKING:
    from store.storage import Location


def add_parsers(sub) -> None:
    p = sub.add_parser(
        "export",
        help="one hardware class's presets plus a compile-cache bundle per preset, for compiler.serving",
        description="Write DEST/serving.json (the export's presets: per model, batch size and dtype the fastest ok config of the "
        "class, and per dtype a class default for models never swept), DEST/bundles/*.bin (a cold compile of "
        "each preset in a fresh process, saved with torch.compiler.save_cache_artifacts) and DEST/manifest.json "
        "(the class, the software stack, the sha256 of every file), and DEST/packages/*.pt2: each preset compiled "
        "ahead of time for its batch size (AOTInductor, without weights), built in the same process and shipped "
        "only once a fresh process loaded it, which "
        "compiler.serving.compile_tuned loads with the serving model's weights instead of tracing and compiling. "
        "Runs on a node of that class with the stack the sweep ran on, and refuses anything else before "
        "compiling. Load it in production with compiler.serving.compile_tuned.",
    )
    p.add_argument(
        "out", type=location_arg, help="sweep output directory: a path or a URI such as s3://BUCKET/PREFIX"
    )
    p.add_argument("--hardware", required=True, help="the hardware class to export (e.g. H100, A100, cpu)")
    p.add_argument(
        "--budget",
        metavar="NAME",
        help="the accuracy budget whose presets to export (stock, bf16, ...), for a tune, or a sweep with "
        "`accuracy:`, that decided under several: an export serves one (default: their only budget; a "
        "sweep's presets are decided under its own budgets, each cell in the precision its budget chose)",
    )
    p.add_argument(
        "--dest",
        required=True,
        type=location_arg,
        help="where to write the export: a new (or empty) local directory (a path or file:///ABSOLUTE/PATH), or "
        "a new prefix on an object store (s3://BUCKET/PREFIX, gs://BUCKET/PREFIX), where it is built and "
        "load-tested in a local staging directory (under --scratch) first, then uploaded, manifest last",
    )
    p.add_argument(
        "--cpus",
        type=whole(1),
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
    p.add_argument(
        "--sign-key-file",
        metavar="FILE",
        default=None,
        help="sign the manifest with the key in FILE (HMAC-SHA256, written to DEST/manifest.sig; the key itself is "
        "written nowhere), so that a serving process that names the same key (compile_tuned's trusted_key_file, "
        "or $ORCHESTRATE_EXPORT_KEY_FILE) refuses any manifest not signed with it (default: the file "
        "$ORCHESTRATE_EXPORT_KEY_FILE names, if set; make a key with "
        "python -c 'import secrets; print(secrets.token_hex(32))' > FILE)",
    )
    p.set_defaults(func=cmd_export)


def cmd_export(args) -> int:
    from compiler.serving.signature import key_id, named_key
    from orchestrator.tune.export import ExportError, export
    from store.storage import StorageError, checked

    def log(line: str) -> None:
        print(line, flush=True)

    if problem := scratch_problem(args.scratch):
        print(f"error: {problem}", file=sys.stderr)
        return EXIT_BAD_INPUT
    new_dest = _new_local_dir(args.dest)
    try:
        sign_key = named_key(key_file=args.sign_key_file)  # read before anything is compiled
        source = checked(args.out)
        with _remote_lock(args.dest):  # a local DEST: export() holds its lock
            dest, remote = _dest(args.dest, args.scratch, args.resume)
            manifest = export(
                source,
                args.hardware,
                dest,
                threads=args.cpus,
                scratch_root=args.scratch,
                packages=not args.no_packages,
                resume=args.resume,
                log=log,
                budget=args.budget,
                sign_key=sign_key,
            )
            if remote is not None:
                publish(dest, remote, log)
    except (ExportError, StorageError, ValueError) as exc:
        if new_dest is not None:  # refused: a --dest this command made (to check it) goes again, if empty
            with contextlib.suppress(OSError):
                new_dest.rmdir()
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    bundles = sum(1 for f in manifest["files"] if f.startswith("bundles/"))
    packages = sum(1 for f in manifest["files"] if f.startswith("packages/"))
    signed = f", manifest.sig (key {key_id(sign_key)})" if sign_key is not None else ""
    print(
        f"wrote {remote or dest}: serving.json, {bundles} bundles, {packages} packages, manifest.json{signed} "
        f"(stack: {manifest['stack']})"
    )
    return 0


def _remote_lock(text: str):
    """An object-store `--dest`'s lock, held from before it is checked until the last upload
    (`export` itself locks a local DEST, and the staging directory of a remote one)."""
    from store.lock import holding
    from store.storage import checked, is_uri

    if not is_uri(text) or text.lower().startswith("file://"):
        return contextlib.nullcontext()
    return holding(checked(text), again="Wait for it to finish, or pass another --dest.")


def _dest(text: str, scratch: str | None, resume: bool) -> tuple[Path, Location | None]:
    """`--dest`, parsed once and checked before any compile: (the local directory the export is
    built in, None) for a path or file:///PATH; for an object store (s3://, gs://, ...), (a local
    staging directory, the destination), the destination checked reachable, writable and new."""
    import pyarrow.fs as pafs
    from pyarrow.lib import ArrowException

    from compiler.serving import MANIFEST
    from store.lock import LOCK_FILE
    from store.storage import StorageError, check_writable, checked, is_uri

    if not is_uri(text) or text.lower().startswith("file://"):
        return _local_dest(text), None
    remote = checked(text)
    try:
        finished = remote.join(MANIFEST).exists()
        held = [
            info
            for info in remote.fs.get_file_info(
                pafs.FileSelector(remote.path, recursive=False, allow_not_found=True)
            )
            if info.base_name != LOCK_FILE  # ours, taken before this check
        ]
    except (OSError, ArrowException) as exc:
        raise StorageError(f"--dest {remote}: cannot list it ({' '.join(str(exc).split())[:300]})") from None
    if finished:
        raise ValueError(
            f"--dest {remote}: holds a finished export; export into a new prefix (nothing was changed)"
        )
    if not resume and held:
        raise ValueError(
            f"--dest {remote}: is not empty; export into a new prefix, or add --resume if an export into it "
            "was interrupted (nothing was changed)"
        )
    check_writable(remote)
    return _local_dest(str(staging_dir(remote, scratch))), remote


def staging_dir(remote: Location, scratch: str | None) -> Path:
    """Where an export to `remote` is built and load-tested before it is uploaded: one directory
    per destination, so that `--resume` finds what an interrupted export finished."""
    key = hashlib.sha256(str(remote.uri).encode()).hexdigest()[:16]
    return Path(scratch or tempfile.gettempdir()) / f"orchestrate-export-{key}"


def publish(staging: Path, remote: Location, log) -> None:
    """Upload the finished export in `staging` to `remote`, each file one PUT and the manifest
    last (a reader that finds it finds every file it lists), then remove `staging`."""
    from pyarrow.lib import ArrowException

    from compiler.serving import MANIFEST
    from orchestrator.tune.export import PROGRESS
    from store.storage import StorageError, format_size

    files = [p for p in sorted(staging.rglob("*")) if p.is_file() and p.name not in (MANIFEST, PROGRESS)]
    size = 0
    for path in [*files, staging / MANIFEST]:
        target = remote.join(path.relative_to(staging).as_posix())
        try:
            with open(path, "rb") as src, target.fs.open_output_stream(target.path) as out:
                shutil.copyfileobj(src, out, 1 << 20)
        except (OSError, ArrowException) as exc:
            raise StorageError(
                f"uploading {target} failed ({' '.join(str(exc).split())[:300]}); the export is complete in "
                f"{staging}: run the same command again to upload it (or copy that directory there yourself)"
            ) from None
        size += path.stat().st_size
    log(f"uploaded {len(files) + 1} files ({format_size(size)}) to {remote}")
    shutil.rmtree(staging, ignore_errors=True)


def _new_local_dir(text: str) -> Path | None:
    """`--dest`'s local directory where it does not exist yet (so that a refused export can remove
    the one it made), else None (it exists, or it is an object store, or not a valid location)."""
    from store.storage import is_uri, resolve

    if is_uri(text) and not text.lower().startswith("file://"):
        return None
    try:
        dest = resolve(text).local_path
        return None if dest.exists() or dest.is_symlink() else dest
    except (OSError, ValueError):
        return None


def _local_dest(text: str) -> Path:
    """`--dest`, checked before any compile: a local directory (a path or file:///PATH) that
    exists or can be made, and that this process can write (ValueError naming the problem and
    the fix otherwise). Object stores are refused: the packages are built and verified in place."""
    from orchestrator.commands.targets import check_not_output_data
    from store.location_forms import shown
    from store.storage import resolve

    dest = resolve(text).local_path
    # realpath, not resolve(): a symbolic link loop is refused below, with what mkdir says
    check_not_output_data(
        Path(os.path.realpath(dest)), shown(text), "--dest", "export into a directory of its own"
    )
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
