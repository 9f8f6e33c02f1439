"""The job subprocess: `python -m workers.bench JOB.json RESULT.json`.

Runs one job in a fresh process: build the model, measure eager, compile, measure compiled,
compare outputs. Exceptions become a status in RESULT.json; the result file is rewritten
after every phase so that a crash or a timeout still leaves what was measured before it.
Only a crash of the process itself (a segfault, a kill) leaves RESULT.json without "final".
"""

from __future__ import annotations

import ctypes
import json
import os
import platform
import signal
import sys
import time
import traceback
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

PARENT_PID_ENV = "CO_PARENT_PID"
ERROR_CHARS = 4000


def _die_with_parent() -> None:
    """Ask Linux to SIGKILL this process when its parent (the Ray task) dies, so a killed driver
    or node never leaves a job holding a GPU."""
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except OSError:
        return
    expected = os.environ.get(PARENT_PID_ENV)
    if expected and os.getppid() != int(expected):  # the parent died before prctl took effect
        os._exit(1)


def _atomic_write_json(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(data, default=str))
    os.replace(tmp, path)


def _error_text(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}"
    if len(text) > ERROR_CHARS:
        text = text[: ERROR_CHARS // 2] + "\n...\n" + text[-ERROR_CHARS // 2 :]
    return text


def _is_oom(exc: BaseException) -> bool:
    import torch

    if isinstance(exc, (MemoryError, torch.cuda.OutOfMemoryError)):
        return True
    text = str(exc).lower()
    # CUDA: "CUDA out of memory"; CPU allocator: "DefaultCPUAllocator: can't allocate memory"
    return any(m in text for m in ("out of memory", "can't allocate memory", "cannot allocate memory"))


class JobRun:
    """The phases of one job; `result` holds every field measured so far."""

    def __init__(self, job_path: Path, result_path: Path):
        from workers.job import Job

        self.job = Job.from_dict(json.loads(job_path.read_text()))
        self.result_path = result_path
        self.result: dict[str, Any] = {
            "started_at": datetime.now(timezone.utc).isoformat(),
            "python_version": platform.python_version(),
            "phase": "start",
        }

    def save(self, final: bool = False) -> None:
        self.result["final"] = final
        _atomic_write_json(self.result_path, self.result)

    def enter(self, phase: str) -> None:
        """Record the phase before starting it, so a crash or timeout says where it happened."""
        self.result["phase"] = phase
        self.save()

    def fail(self, status: str, exc: BaseException | str) -> None:
        self.result["status"] = "oom" if isinstance(exc, BaseException) and _is_oom(exc) else status
        self.result["error"] = exc if isinstance(exc, str) else _error_text(exc)
        if isinstance(exc, BaseException):
            self.result["traceback"] = "".join(traceback.format_exception(exc))[-ERROR_CHARS:]

    def run(self) -> None:
        import torch

        self.result["torch_version"] = torch.__version__
        job = self.job
        try:
            model, inputs = self.build()
        except Exception as exc:
            return self.fail("runtime_error", exc)
        try:
            reference = self.measure_eager(model, inputs)
        except Exception as exc:
            return self.fail("runtime_error", exc)
        try:
            self.enter("compile")  # also saves the eager numbers, should the compile never return
            compiled = torch.compile(model, **job.config.compile_kwargs())
            first_out = self.first_call(compiled, inputs)
        except Exception as exc:
            return self.fail("compile_error", exc)
        try:
            self.measure_compiled(compiled, inputs)
        except Exception as exc:
            return self.fail("runtime_error", exc)
        self.check_accuracy(reference, first_out)

    # --- phases ---------------------------------------------------------------------------------

    def build(self):
        import torch

        from compiler.precision import apply_precision
        from workers import zoo

        job = self.job
        self.enter("build")
        device = torch.device("cuda" if job.device == "cuda" else "cpu")
        if job.device == "cuda":
            self.result["device_name"] = torch.cuda.get_device_name(device)
        else:
            self.result["device_name"] = platform.processor() or platform.machine()
        dtype = apply_precision(job.dtype)
        torch.manual_seed(0)
        generator = torch.Generator().manual_seed(0)
        if job.model.id.startswith("python:"):
            factory = zoo.load_python_factory(job.model.id)
            model, inputs = factory(job.batch_size, job.model.input_size, dict(job.model.overrides))
            task = job.model.task or "other"
        else:
            entry = zoo.get_entry(job.model.id)
            model = entry.build(dict(job.model.overrides))
            inputs = entry.make_inputs(
                model, job.batch_size, job.model.input_size or entry.image_size, generator
            )
            task = job.model.task or entry.task
        self.result["task"] = task
        model = model.eval().to(device=device, dtype=dtype)

        def place(t):
            if isinstance(t, torch.Tensor):
                return t.to(device=device, dtype=dtype if t.is_floating_point() else t.dtype)
            return t

        inputs = (
            {k: place(v) for k, v in inputs.items()}
            if isinstance(inputs, dict)
            else tuple(map(place, inputs))
        )
        return model, inputs

    def _call(self, fn, inputs):
        return fn(**inputs) if isinstance(inputs, dict) else fn(*inputs)

    def measure_eager(self, model, inputs):
        import torch

        from compiler import measure
        from workers import zoo

        job, dev = self.job, self.job.device
        self.enter("eager")
        measure.reset_peak_memory(dev)
        with torch.inference_mode():
            reference = [t.clone() for t in zoo.output_tensors(self._call(model, inputs))]
            for _ in range(job.measure.warmup):
                self._call(model, inputs)
            measure.synchronize(dev)
            samples = measure.time_calls(lambda: self._call(model, inputs), job.measure.iterations, dev)
        summary = measure.summarize(samples)
        self.result.update(
            eager_ms=summary.median_ms,
            eager_p10_ms=summary.p10_ms,
            eager_p90_ms=summary.p90_ms,
            eager_peak_mem_bytes=measure.peak_memory_bytes(dev),
        )
        return reference

    def first_call(self, compiled, inputs):
        import torch

        from compiler import measure, stats
        from workers import zoo

        dev = self.job.device
        stats.reset()
        measure.reset_peak_memory(dev)
        t0 = time.perf_counter()
        with torch.inference_mode():
            out = [t.clone() for t in zoo.output_tensors(self._call(compiled, inputs))]
            measure.synchronize(dev)
        self.result["compile_s"] = time.perf_counter() - t0
        captured = stats.capture_stats()
        self.result.update(
            graph_count=captured.graph_count,
            graph_breaks=captured.graph_breaks,
            break_reasons=list(captured.break_reasons),
        )
        return out

    def measure_compiled(self, compiled, inputs):
        import torch

        from compiler import measure

        job, dev = self.job, self.job.device
        self.enter("compiled")
        with torch.inference_mode():
            for _ in range(job.measure.warmup):
                self._call(compiled, inputs)
            measure.synchronize(dev)
            samples = measure.time_calls(lambda: self._call(compiled, inputs), job.measure.iterations, dev)
        summary = measure.summarize(samples)
        self.result.update(
            compiled_ms=summary.median_ms,
            compiled_p10_ms=summary.p10_ms,
            compiled_p90_ms=summary.p90_ms,
            peak_mem_bytes=measure.peak_memory_bytes(dev),
            speedup=self.result["eager_ms"] / summary.median_ms if summary.median_ms > 0 else None,
        )

    def check_accuracy(self, reference, actual):
        from compiler import measure

        cmp = measure.compare_outputs(reference, actual, self.job.dtype)
        self.result.update(max_abs_err=cmp.max_abs_err, max_rel_err=cmp.max_rel_err)
        if cmp.ok:
            self.result["status"] = "ok"
        else:
            self.fail("accuracy_fail", cmp.detail)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 2:
        print("usage: python -m workers.bench JOB.json RESULT.json", file=sys.stderr)
        return 2
    _die_with_parent()
    run = JobRun(Path(argv[0]), Path(argv[1]))
    run.save()
    try:
        run.run()
    except BaseException as exc:  # a bug in this file must still become a row
        run.fail("runtime_error", exc)
    run.result["phase"] = "done"
    run.save(final=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
