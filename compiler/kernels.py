"""Autotuning decisions as data: every candidate Inductor timed for each autotuned op.

When Inductor autotunes a GEMM or a convolution (max-autotune; on CPU with `freezing`, where
its C++ GEMM templates compete with MKL/oneDNN), it times every candidate kernel and keeps the
fastest. `KernelChoiceRecorder` registers a feedback saver
(`torch._inductor.select_algorithm.add_feedback_saver`, a private API reached through
`compiler.torch_private`) for the duration of a compile and turns
each call into one row per candidate: the op, its input shapes, strides and dtypes, the
candidate's name, kind and configuration, its time, its rank and whether it won. Rows whose
timings came from Inductor's autotune cache instead of a fresh benchmark say so (`from_cache`):
Inductor counts each fresh benchmark in Dynamo's `counters["inductor"]["select_algorithm_autotune"]`
(`compiler.torch_private.dynamo_counters`; null where this torch does not offer them as checked).

The fastest candidate is not always the kernel in the generated code: with
`benchmark_epilogue_fusion` (on by default under max-autotune) Inductor keeps the op as a
`MultiTemplateBuffer` and decides during fusion whether a template fused with the op's epilogue
beats the fastest kernel followed by a separate epilogue kernel. The recorder watches those
decisions (`MultiTemplateBuffer.finalize_as_triton_caller(s)` for a template, the scheduler's
`_replace_node` for an extern kernel, through `compiler.torch_private.watch_template_settlement`)
and marks the candidate finally emitted (`emitted`); an op selected without a MultiTemplateBuffer
emits its winner. Where this torch does not offer those as checked, the rows are recorded without
`emitted` and `fusion_benchmarked` (null), and `emitted_unavailable` says why.

An FX-graph-cache hit skips autotuning altogether, so a warm compile records nothing; the rows
are the cold compile's. The saver's arity changed across torch versions; extra arguments are
accepted and ignored.

A compile can run for minutes of autotuning and then be killed by its job's timeout (on an
H100 one convolution of resnet-50 took 76.7 s for 18 candidates). So that such a job keeps what
it timed, the recorder also appends each op's rows, as the saver fires, to a JSON-lines file
(`stream`): one line per op, `{"op_index": i, "rows": [...]}`, flushed before the compile goes
on. A kill loses at most the op being timed (its line is never written, or is torn and skipped
by `read_choice_stream`). The runner reads the file of a process whose result lacks the rows
(`workers.runner`); those rows are marked `partial` and have no `emitted` (the compile never
settled what it emits).
"""

from __future__ import annotations

import contextlib
import json
import math
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from compiler import torch_private


def _text(value: Any) -> str:
    try:
        return str(int(value))
    except (TypeError, ValueError):
        return str(value)


def _shape(node: Any, getter: str) -> str | None:
    try:
        return "x".join(_text(v) for v in getattr(node, getter)()) or "scalar"
    except Exception:  # a node without that property (a constant, a view Inductor cannot size)
        return None


def _dtype(node: Any) -> str | None:
    try:
        return str(node.get_dtype()).removeprefix("torch.")
    except Exception:
        return None


def choice_kind(choice: Any) -> str:
    """extern (an ATen/library kernel), triton_template, cpp_template, or the class name."""
    inner = getattr(choice, "_wrapped", choice)  # DataProcessorChoiceCallerWrapper
    name = type(inner).__name__
    if "Extern" in name:
        return "extern"
    if "Triton" in name:
        return "triton_template"
    if "Cpp" in name or "CPP" in name:
        return "cpp_template"
    return name


def choice_config(choice: Any) -> str:
    """The candidate's configuration as JSON: Inductor's `info_dict()` (tile shape, warps,
    stages, ... for Triton templates; the kernel call for extern ones)."""
    info: dict[str, Any] = {}
    with contextlib.suppress(Exception):
        info = dict(choice.info_dict())
    description = getattr(choice, "description", None)
    if description and "description" not in info:
        info["description"] = description
    return json.dumps(info, sort_keys=True, default=str)


def read_choice_stream(path: Path) -> tuple[int, list[dict[str, Any]]]:
    """The ops a recorder's `stream` file holds whole, and their rows marked `partial` (from a
    compile that did not finish). A line that does not parse is the op the process was writing
    when it was killed: it is skipped. A missing file holds nothing."""
    ops, rows = 0, []
    try:
        lines = Path(path).read_text().splitlines()
    except (OSError, UnicodeDecodeError):
        return 0, []
    for line in lines:
        try:
            entry = json.loads(line)
            op_rows = entry["rows"]
        except (ValueError, TypeError, KeyError):
            continue
        ops += 1
        rows += [{**r, "partial": True} for r in op_rows]
    return ops, rows


@dataclass
class KernelChoiceRecorder:
    """Collects one row per (autotuned op, candidate) while the `with` block compiles."""

    stream: Path | None = None
    """A JSON-lines file each op's rows are appended to as soon as they are timed (see the module
    docstring), so that a compile killed mid-autotune leaves them; None: memory only."""
    after_op: Callable[[int], None] | None = None
    """Called with the number of ops recorded so far, after each op's rows are in `stream` (a
    test hook stalls the job there: `workers.bench.STALL_ENV`)."""
    rows: list[dict[str, Any]] = field(default_factory=list)
    ops: int = 0
    stream_error: str | None = None
    """Why `stream` could not be written (streaming stopped there; the compile went on)."""
    unavailable: str | None = None
    """Why nothing is recorded: Inductor's feedback savers are not there as checked on this torch
    (`compiler.torch_private.TorchPrivateError`); the compile goes on."""
    emitted_unavailable: str | None = None
    """Why the rows have no `emitted` (nor `fusion_benchmarked`): where Inductor settles a
    MultiTemplateBuffer is not there as checked on this torch; the choices are still recorded."""
    _stream_file: IO[str] | None = None
    _autotunes_seen: int = 0
    _op_of_choices: dict[frozenset[int], int] = field(default_factory=dict)
    _emitted: dict[int, str | None] = field(default_factory=dict)
    """op_index -> the emitted candidate's name (None: an extern kernel, the fastest extern)."""
    _unwatch: Callable[[], None] | None = None

    @staticmethod
    def _fresh_autotunes() -> int | None:
        """Inductor's count of fresh autotune benchmarks; None where Dynamo's counters are not
        there as checked (`from_cache` is then null; `compiler.capture` says why in the notes)."""
        try:
            counters = torch_private.dynamo_counters()
        except torch_private.TorchPrivateError:
            return None
        return int(counters["inductor"].get("select_algorithm_autotune", 0))

    def __enter__(self) -> KernelChoiceRecorder:
        self._autotunes_seen = self._fresh_autotunes() or 0
        try:
            torch_private.add_feedback_saver(self._save)
        except torch_private.TorchPrivateError as exc:  # kernel choices are not worth the compile
            self.unavailable = str(exc)
            warnings.warn(f"no kernel choices recorded: {exc}", RuntimeWarning, stacklevel=2)
            return self
        try:
            self._watch_finalization()
        except torch_private.TorchPrivateError as exc:  # the choices without what was emitted
            self.emitted_unavailable = str(exc)
            warnings.warn(f"kernel choices recorded without `emitted`: {exc}", RuntimeWarning, stacklevel=2)
        return self

    def _watch_finalization(self) -> None:
        """Watch where Inductor settles a MultiTemplateBuffer's kernel (undone on exit)."""
        recorder = self

        def op_of(multi: Any) -> int | None:
            with contextlib.suppress(Exception):
                return recorder._op_of_choices.get(frozenset(id(c) for c in multi.choices))
            return None

        def as_template(multi, caller, *_):
            op = op_of(multi)
            if op is not None:
                recorder._emitted[op] = str(getattr(caller, "name", caller))

        def as_templates(multi, callers, *_):
            as_template(multi, callers.get(None) or next(iter(callers.values())))

        def as_extern(sched, out_buffer, multi, *_):
            op = op_of(multi)
            if op is not None:
                recorder._emitted[op] = None

        self._unwatch = torch_private.watch_template_settlement(as_template, as_templates, as_extern)

    def _mark_emitted(self) -> None:
        """Set `emitted` on every row: the settled candidate of a MultiTemplateBuffer (an extern
        settlement is the fastest extern, as Inductor picks it), else the winner; null where the
        settlements could not be watched (`emitted_unavailable`)."""
        if self.emitted_unavailable is not None:
            for row in self.rows:
                row["emitted"] = row["fusion_benchmarked"] = None
            return
        by_op: dict[int, list[dict[str, Any]]] = {}
        for row in self.rows:
            by_op.setdefault(row["op_index"], []).append(row)
        for op, rows in by_op.items():
            for row in rows:
                row["fusion_benchmarked"] = op in self._emitted
            if op not in self._emitted:
                for row in rows:
                    row["emitted"] = row["is_winner"]
                continue
            name = self._emitted[op]
            if name is None:
                externs = [r for r in rows if r["kind"] == "extern" and r["time_ms"] is not None]
                name = min(externs, key=lambda r: r["time_ms"])["choice"] if externs else None
            for row in rows:
                row["emitted"] = None if name is None else row["choice"] == name

    def _append(self, op_index: int, rows: list[dict[str, Any]]) -> None:
        """One line for the op, written and flushed at once: a kill that lands mid-write leaves
        a torn line, which the reader skips, never half an op's candidates counted as whole.
        Flushed to the OS, not fsynced: it has to outlive the process, not the node (the
        scratch directory it lives in does not outlive the node either)."""
        if self.stream is None or self.stream_error:
            return
        try:  # Inductor calls the saver unguarded: a full disk must not fail the compile
            if self._stream_file is None:
                self._stream_file = open(self.stream, "a")  # noqa: SIM115 (closed in __exit__)
            self._stream_file.write(json.dumps({"op_index": op_index, "rows": rows}, default=str) + "\n")
            self._stream_file.flush()
        except OSError as exc:
            self.stream_error = f"{type(exc).__name__}: {exc}"

    def __exit__(self, *exc) -> None:
        if self._stream_file is not None:
            with contextlib.suppress(OSError):
                self._stream_file.close()
            self._stream_file = None
        if self._unwatch is not None:
            self._unwatch()
            self._unwatch = None
        self._mark_emitted()
        if not any(exc):  # the compile returned: its rows are whole, not a partial compile's
            for row in self.rows:
                row["partial"] = False
        if self.unavailable is None:
            torch_private.remove_feedback_saver(self._save)

    def _save(self, timings: dict, name: str, input_nodes: list, choices: list, *_rest: Any) -> None:
        fresh = self._fresh_autotunes()
        from_cache = None if fresh is None else fresh <= self._autotunes_seen
        self._autotunes_seen = self._autotunes_seen if fresh is None else fresh
        op_index = self.ops
        self.ops += 1
        shapes = [_shape(n, "get_size") for n in input_nodes]
        strides = [_shape(n, "get_stride") for n in input_nodes]
        dtypes = [_dtype(n) for n in input_nodes]
        self._op_of_choices[frozenset(id(c) for c in choices)] = op_index
        timed = [(c, float(timings[c])) for c in choices if c in timings] or list(timings.items())
        finite = sorted((t, i) for i, (_, t) in enumerate(timed) if math.isfinite(t))
        rank = {i: r for r, (_, i) in enumerate(finite, start=1)}
        op_rows = []
        for i, (choice, ms) in enumerate(timed):
            op_rows.append(
                {
                    "op": name,
                    "op_index": op_index,
                    "input_shapes": shapes,
                    "input_strides": strides,
                    "input_dtypes": dtypes,
                    "choice": str(getattr(choice, "name", choice)),
                    "kind": choice_kind(choice),
                    "config": choice_config(choice),
                    "time_ms": ms if math.isfinite(ms) else None,
                    "rank": rank.get(i),
                    "is_winner": rank.get(i) == 1,
                    "from_cache": from_cache,
                }
            )
        self.rows += op_rows
        self._append(op_index, op_rows)
        if self.after_op is not None:
            self.after_op(self.ops)


# --- generated Triton kernels ---------------------------------------------------------------------


def autotuner_ids() -> set[int]:
    """The kernels loaded so far (to leave out of a later `triton_kernel_rows`); none where they
    cannot be found as checked on this torch (`triton_kernel_rows` then raises and says why)."""
    try:
        return {id(a) for a in torch_private.loaded_triton_autotuners()}
    except torch_private.TorchPrivateError:
        return set()


def triton_kernel_rows(exclude: set[int] | frozenset[int] = frozenset()) -> list[dict[str, Any]]:
    """One row per generated Triton kernel (leaving out `exclude`), after the compiled model's
    first run: the config its `CachingAutotuner` settled on (block sizes, warps, stages), whether
    coordinate-descent tuning was on and found it, and the time its first-run tuning took. A
    kernel that never ran has no settled config (null). The kernels are found through
    `compiler.torch_private.loaded_triton_autotuners` (`TorchPrivateError` where this torch does
    not offer them as checked); each autotuner's attributes are read here with defaults, so a
    field a torch drops reads as null."""
    rows = []
    for tuner in torch_private.loaded_triton_autotuners():
        if id(tuner) in exclude:
            continue
        meta = getattr(tuner, "inductor_meta", None) or {}
        launchers = getattr(tuner, "launchers", None) or []
        config = launchers[0].config if launchers else None
        heuristic = getattr(tuner, "heuristic_type", None)
        tuned_ns = getattr(tuner, "autotune_time_taken_ns", 0) or 0
        rows.append(
            {
                "kernel": getattr(getattr(tuner, "fn", None), "__name__", None) or meta.get("kernel_name"),
                "heuristic": getattr(heuristic, "name", None) or (str(heuristic) if heuristic else None),
                "size_hints": json.dumps(getattr(tuner, "size_hints", None), sort_keys=True, default=str),
                "config": json.dumps(dict(config.kwargs), sort_keys=True, default=str) if config else None,
                "num_warps": getattr(config, "num_warps", None),
                "num_stages": getattr(config, "num_stages", None),
                "coordinate_descent": bool(meta.get("coordinate_descent_tuning")),
                "found_by_coordesc": bool(getattr(config, "found_by_coordesc", False)) if config else None,
                "autotune_ms": tuned_ns / 1e6 if tuned_ns else None,
            }
        )
    rows.sort(key=lambda r: str(r["kernel"]))
    return rows
