"""A loaded AOTInductor package serving the caller's model (`PackagedModel`): the package
(`compiler.aoti`, built by the export) filled with the caller's own weights (`fill_constants`),
replayed from CUDA graphs captured at load where the preset runs under CUDA graphs.

A package built for one input signature serves it from one graph. A package built for a batch
range (`compiler.aoti.build_package(batch=...)`, a serving plan's dynamic graph) serves every
batch size in it: under CUDA graphs, from a graph per size captured at load (`capture` once per
size, all into one memory pool), as `mode="reduce-overhead"` captures a graph per size of a
dynamic graph. A call's outputs are overwritten by the next call of the same size.

This module imports neither Ray nor the orchestrator package."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

from compiler.aoti import PackageError, describe, fits, load_runner, tensors


def fill_constants(runner: Any, model: Any, path: Path) -> dict[str, Any]:
    """Fill the loaded package `runner` (from `path`) with `model`'s parameters and buffers by
    name, and return them; raises PackageError when they do not match by name, shape and dtype.

    The package uses the model's own tensors where this torch can (`user_managed`: the loader
    keeps their pointers, no copy), so the packages of a plan's buckets share one set of weights
    instead of holding a copy each; what it folds from them at load (`_FOLDED_CONST_*`, e.g. a
    transposed weight) is still its own. The caller keeps the returned tensors alive."""
    named = {  # every name of a tied weight: the package may ask for any of them
        **dict(model.named_parameters(remove_duplicate=False)),
        **dict(model.named_buffers(remove_duplicate=False)),
    }
    wanted = runner.get_constant_fqns()
    # constants the package folds from them at load (runtime constant folding) are named
    # _FOLDED_CONST_*: not the caller's
    missing = [n for n in wanted if n not in named and not n.startswith("_FOLDED_CONST_")]
    if missing:
        raise PackageError(
            f"{path}: the package needs {len(missing)} weights this model does not have "
            f"(e.g. {', '.join(missing[:3])}): it was built for another architecture"
        )
    constants = {n: named[n] for n in wanted if n in named}
    try:
        try:
            runner.load_constants(constants, check_full_update=True, user_managed=True)
        except TypeError:  # a torch whose loader copies every constant
            runner.load_constants(constants, check_full_update=True)
    except RuntimeError as exc:
        raise PackageError(f"{path}: this model's weights do not fit the package: {exc}") from exc
    return constants


def no_fallback(name: str) -> Callable[[], Callable[..., Any]]:
    """A `PackagedModel` fallback for a package that only ever serves its own signature (a plan's
    package being timed): calling it with another raises, naming the package (`name`)."""

    def refuse() -> Callable[..., Any]:
        raise RuntimeError(f"{name} was called with another input signature")

    return refuse


class PackagedModel:
    """The caller's model compiled ahead of time: calls with the package's input signature (any
    batch size within `batch`, for a package built for a range) run the package, replaying the
    CUDA graph captured for their shape where there is one; any other signature goes to
    `fallback()` (built once, on first need, with a warning)."""

    def __init__(
        self,
        runner: Any,
        inputs: list[list[Any]],
        cudagraphs: bool,
        fallback: Callable[[], Callable[..., Any]],
        batch: tuple[int, int] | None = None,
    ):
        self.runner = runner
        self.inputs = inputs
        self.cudagraphs = cudagraphs
        self.batch = tuple(batch) if batch is not None else None
        self._fallback_factory = fallback
        self._fallback: Callable[..., Any] | None = None
        self.graphs: dict[str, tuple[Any, list[Any], Any]] = {}
        """Per captured shape (`describe` of its tensors, as text): the graph, its static inputs
        and its static outputs."""
        self.constants: dict[str, Any] = {}
        self.pool: Any = None

    @classmethod
    def load(
        cls,
        path: Path,
        model: Any,
        inputs: list[list[Any]],
        cudagraphs: bool,
        fallback: Callable[[], Callable[..., Any]],
        batch: tuple[int, int] | None = None,
    ) -> PackagedModel:
        """Load the package at `path` (its bytes already verified) and fill its constants with
        `model`'s parameters and buffers (`fill_constants`)."""
        runner = load_runner(path, single_threaded=cudagraphs)
        packaged = cls(runner, inputs, cudagraphs, fallback, batch)
        packaged.constants = fill_constants(runner, model, path)  # the package runs on these
        return packaged

    def capture(self, args: tuple, kwargs: dict, pool: Any = None) -> dict[str, float]:
        """Warm the package up on these inputs (the first run folds the weights) and, for a CUDA
        graph preset, capture a graph of it for their shape with static copies of them, into the
        memory pool `pool` where given (another graph's `pool`: `compiler.serving.plan_packages`
        captures a plan's graphs largest first into one pool, so its intermediates are held once,
        not once per graph; each graph's outputs stay its own while it lives). `pool` then names
        the pool.

        The runner of a CUDA graph preset is loaded single-threaded: the default one keeps a pool
        of models guarded by CUDA events and, before each run, queries or waits on the event of
        the last (`cudaEventQuery`, `cudaEventSynchronize` in `model_container.h`), which
        invalidates a stream capture ("operation failed due to a previous error during
        capture", ResNet-50 on an H200). Neither that runner nor the graph's static inputs are
        for calls from several threads at once.

        Returns `first_run_s`: the seconds of the package's first run at these inputs, its GPU
        work finished (where the weights are folded, its kernels loaded and the libraries it
        calls meet the shape for the first time), apart from the warm-ups and the capture."""
        import time

        import torch
        import torch.utils._pytree as pytree

        t = time.perf_counter()
        with torch.no_grad():
            self.runner(*args, **kwargs)
        if any(v.is_cuda for v in tensors((args, kwargs))):
            torch.cuda.synchronize()
        timed = {"first_run_s": time.perf_counter() - t}
        if not self.cudagraphs:
            return timed
        static_args, static_kwargs = pytree.tree_map(
            lambda v: v.clone() if isinstance(v, torch.Tensor) else v, (args, kwargs)
        )
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream), torch.no_grad():
            for _ in range(2):
                self.runner(*static_args, **static_kwargs)
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=pool if pool is not None else self.pool), torch.no_grad():
            static_out = self.runner(*static_args, **static_kwargs)
        self.pool = graph.pool()
        static_inputs = tensors((static_args, static_kwargs))
        self.graphs[str(describe(static_inputs))] = (graph, static_inputs, static_out)
        return timed

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        import torch

        flat = tensors((args, kwargs))
        captured = self.graphs.get(str(describe(flat))) if self.graphs else None
        if captured is None:
            if not fits(self.inputs, flat, self.batch):
                return self._fall_back()(*args, **kwargs)
            with torch.no_grad():
                return self.runner(*args, **kwargs)
        graph, static_inputs, static_out = captured
        for static, value in zip(static_inputs, flat, strict=True):
            static.copy_(value)
        graph.replay()
        return static_out

    def _fall_back(self) -> Callable[..., Any]:
        if self._fallback is None:
            warnings.warn(
                f"compile_tuned: the package serves inputs {self.inputs}"
                + (f" for batch sizes {self.batch[0]}..{self.batch[1]}" if self.batch else "")
                + "; compiling the preset with torch.compile for another input signature",
                stacklevel=3,
            )
            self._fallback = self._fallback_factory()
        return self._fallback
