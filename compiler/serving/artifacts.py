"""The compiled artifacts an exported preset names, in the process `compiler.serving.compile_tuned`
serves it in: its compile-cache bundle, installed into torch's local caches before the preset
compiles (`PresetArtifacts.install_bundle`), and its AOTInductor package (`compiler.aoti`),
loaded with the model's own weights and checked against eager (`PresetArtifacts.packaged`).

Each file is read through `ExportFiles.verified`: exactly the bytes the manifest's sha256 names
(bundles are unpickled on load: a file that does not match is refused, never loaded); a bundle's
container is then checked by `compiler.serving.bundle_check` before torch's loader reads it, and anything
that loader raises is a refusal too, never an exception out of `compile_tuned`. A refused
file raises `ExportError` under `strict`, else warns and the preset compiles without it; what
happened goes into `Applied` (`bundle`, `package` and their files).

This module imports neither Ray nor the orchestrator package."""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from compiler.serving.applied import Applied
from compiler.serving.files import ExportError, ExportFiles
from compiler.serving.packaged import PackagedModel
from compiler.serving.plan_packages import LoadedPlan


class PresetArtifacts:
    """The bundle and package of the preset `entry` of `export`, for one `compile_tuned` call:
    `warn` is that call's warning (`PresetFallbackWarning`, recorded in `applied`)."""

    def __init__(
        self,
        export: ExportFiles,
        entry: dict[str, Any],
        applied: Applied,
        *,
        strict: bool,
        warn: Callable[[str], None],
    ):
        self.export = export
        self.entry = entry
        self.applied = applied
        self.strict = strict
        self.warn = warn

    def refused(self, exc: ExportError, instead: str) -> None:
        """A file of the preset that cannot be used: raise under `strict`, else warn."""
        if self.strict:
            raise exc
        self.warn(f"compile_tuned: {exc}; {instead}")

    def file(self, rel: str, instead: str) -> bytes | None:
        """The verified bytes of the preset's file `rel`, or None (refused, with a warning)."""
        try:
            return self.export.verified(rel)
        except ExportError as exc:
            self.refused(exc, instead)
            return None

    def install_bundle(self) -> None:
        """Put the preset's bundle into torch's local caches, or refuse it (a warning, and the preset
        compiles without it; `ExportError` under `strict`): one whose bytes are not those the
        manifest names, one whose container `compiler.serving.bundle_check` refuses (torch's loader never
        sees it: it would loop on a container cut short, and write an artifact wherever its key
        points), and one on which torch's loader raises anything at all."""
        import torch

        from compiler.serving.bundle_check import check_bundle

        bundle = self.entry.get("bundle")
        if not bundle or self.applied.bundle != "none":
            return
        where = self.applied.bundle_file = self.export.where(bundle)
        instead = "compiling without the bundle"
        data = self.file(bundle, instead)
        if data is None:
            self.applied.bundle = "refused"
            return
        try:
            check_bundle(data, where)
            try:
                info = torch.compiler.load_cache_artifacts(data)
            except Exception as exc:  # whatever torch's loader raises: never out of compile_tuned
                raise ExportError(
                    f"{where}: torch's loader failed on it ({type(exc).__name__}: {exc})"
                ) from exc
            if info is None:  # torch could not read the bytes (it logged why: "checksum does not match")
                raise ExportError(
                    f"{where}: torch refused the compile-cache bundle (its warning above says why)"
                )
        except ExportError as exc:
            self.applied.bundle = "refused"
            self.refused(exc, instead)
            return
        self.applied.bundle = "loaded"
        self.applied.cache_artifacts = {k: len(v) for k, v in info.artifacts.items()}

    def packaged(
        self, model: Any, args: tuple[Any, ...], kwargs: dict[str, Any], compile_preset: Callable[[], Any]
    ) -> Any:
        """The preset's package loaded with the weights of `model` and checked against it on the
        example inputs (`args`, `kwargs`, in the preset's dtype), or None (with `applied.package`
        and a warning saying why) to compile instead. `compile_preset` compiles the preset for an
        input signature the package was not built for."""
        from compiler import aoti

        applied, entry = self.applied, self.entry
        if aoti.signature(args, kwargs) != entry.get("package_inputs"):
            applied.package = "skipped"
            return None
        applied.package_file = self.export.where(entry["package"])
        t0 = time.perf_counter()
        packaged, state = self.load_package(
            entry["package"],
            entry["package_inputs"],
            bool(entry.get("package_cudagraphs")),
            model,
            args,
            kwargs,
            compile_preset,
        )
        applied.package = state
        if packaged is not None:
            applied.compile_s = time.perf_counter() - t0
        return packaged

    def plan_packages(
        self, model: Any, args: tuple[Any, ...], kwargs: dict[str, Any], compile_preset: Callable[[], Any]
    ) -> LoadedPlan | None:
        """The packages of the preset's serving plan (`serving.packages`): every bucket's of a
        buckets plan, or the dynamic plan's one for its batch range, each loaded with the weights
        of `model`, captured and checked against eager on the example inputs resized
        (`compiler.serving.plan_packages`); None (with a warning where one failed) to prepare the
        plan from the bundle."""
        from compiler.serving.padding import rows_proven_independent
        from compiler.serving.plan_packages import DYNAMIC, PlanLoadError, load_buckets, load_dynamic
        from compiler.serving.served import cuda_device

        serving = self.entry.get("serving") or {}
        packages = serving.get("packages") or {}
        buckets = serving.get("buckets") or []
        plan = serving.get("plan")
        if plan == "buckets" and (not buckets or set(packages) != {str(b) for b in buckets}):
            return None
        if plan == "dynamic" and not (packages.get(DYNAMIC) or {}).get("batch"):
            return None
        if plan not in ("buckets", "dynamic"):
            return None
        on_cuda = cuda_device((args, kwargs)) is not None

        def load(key: int | str) -> Any:
            p = packages[str(key)]
            data = self.file(p["file"], "compiling the preset instead")
            if data is None:
                raise PlanLoadError(key, "refused", "")
            batch = tuple(p["batch"]) if p.get("batch") else None
            return _opened(
                data, p["inputs"], bool(p.get("cudagraphs")), on_cuda, model, compile_preset, batch
            )

        precision = self.applied.precision or "fp32"
        try:
            if plan == "buckets":
                independent = rows_proven_independent(serving.get("padding") or {})
                loaded = load_buckets(buckets, load, model, (args, kwargs), precision, independent)
            else:
                batch = tuple(packages[DYNAMIC]["batch"])
                loaded = load_dynamic(lambda: load(DYNAMIC), model, (args, kwargs), batch, precision)
        except PlanLoadError as exc:
            if exc.why:
                where = self.export.where(packages[str(exc.key)]["file"])
                self.warn(f"compile_tuned: {where}: {exc.why}; compiling the preset instead")
            self.applied.package = exc.state
            return None
        self.applied.package = "loaded"
        first = str(buckets[0]) if plan == "buckets" else DYNAMIC
        self.applied.package_file = self.export.where(packages[first]["file"])
        return loaded

    def load_package(
        self,
        rel: str,
        inputs: Any,
        cudagraphs: bool,
        model: Any,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        compile_preset: Callable[[], Any],
    ) -> tuple[Any, str]:
        """(the package `rel`, serving the input signature `inputs`, loaded with the weights of
        `model`, captured on `args`/`kwargs` and checked against eager on them, `loaded`), or
        (None, `refused` or `failed`) with a warning saying why."""
        import torch

        from compiler import aoti
        from compiler.measure import compare_outputs

        where = self.export.where(rel)
        with torch.no_grad():  # the reference the package must reproduce
            reference = model(*args, **kwargs)
        device = next((t.device for t in aoti.tensors(reference)), None)
        data = self.file(rel, "compiling the preset instead")
        if data is None:
            return None, "refused"
        try:
            on_cuda = device is not None and device.type == "cuda"
            packaged = _opened(data, inputs, cudagraphs, on_cuda, model, compile_preset)
            packaged.capture(args, kwargs)
            with torch.no_grad():
                out = packaged(*args, **kwargs)
            if device is not None and device.type == "cuda":
                torch.cuda.synchronize(device)
        except Exception as exc:  # a package that will not load here: the preset compiles instead
            self.warn(f"compile_tuned: {where}: {type(exc).__name__}: {exc}; compiling the preset instead")
            return None, "failed"
        cmp = compare_outputs(aoti.tensors(reference), aoti.tensors(out), self.applied.precision or "fp32")
        if not cmp.ok:
            self.warn(
                f"compile_tuned: {where}: its outputs differ from eager ({cmp.detail}); compiling "
                "the preset instead"
            )
            return None, "failed"
        return packaged, "loaded"


def _opened(
    data: bytes,
    inputs: Any,
    cudagraphs: bool,
    on_cuda: bool,
    model: Any,
    compile_preset: Callable[[], Any],
    batch: tuple[int, int] | None = None,
) -> PackagedModel:
    """The package whose verified bytes are `data`, loaded with `model`'s weights
    (`PackagedModel.load`) from a scratch file holding exactly those bytes. CUDA graphs only where
    the model runs on CUDA (`on_cuda`): an export written before build_package knew this marked
    CPU reduce-overhead packages for them too."""
    with tempfile.TemporaryDirectory(prefix="compile-package-") as scratch:
        path = Path(scratch) / "package.pt2"
        path.write_bytes(data)
        return PackagedModel.load(path, model, inputs, cudagraphs and on_cuda, compile_preset, batch)
