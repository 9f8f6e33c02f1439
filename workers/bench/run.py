"""The entry points of a job process (`python -m workers.bench`, see `workers.bench`): `JobRun`
runs the phases in order (`run`, `run_warm`, `run_bundle`), `main` reads the command line, pins
the process to its cores and writes RESULT.json's final state.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from compiler.env import die_with_parent, guard_process_group
from workers.affinity import pin_from_environment
from workers.bench import PARENT_PID_ENV
from workers.bench.accuracy import check_accuracy
from workers.bench.baseline import baseline_phase
from workers.bench.build import build
from workers.bench.bundle import build_package, write_bundle
from workers.bench.calls import call, prime
from workers.bench.calls import call as _call  # the name benchmarks/ import it by
from workers.bench.compile import compile_phase
from workers.bench.flops import count_flops
from workers.bench.imports import imports, unsupported_here
from workers.bench.record import JobRecord
from workers.bench.serving import discard_packages, prepare_serving
from workers.bench.timing import timed_rounds
from workers.bench.warmup import compiled_warmup, eager_phase

__all__ = ["JobRun", "_call", "main"]  # what tests and benchmarks import from here


def _die_with_parent() -> None:
    """Ask Linux to SIGKILL this process when its parent (the Ray task) dies, so a killed driver
    or node never leaves a job holding a GPU; and, where the runner started this process as the
    leader of a process group of its own, fork a guard that then kills the whole group, so that
    none of its descendants (Inductor's compile workers, their `g++`) runs on either."""
    if not die_with_parent():
        return
    expected = os.environ.get(PARENT_PID_ENV)
    if expected and os.getppid() != int(expected):  # the parent died before prctl took effect
        os._exit(1)
    guard_process_group()


class JobRun(JobRecord):
    """One job process: each entry point (`run`, `run_warm`, `run_bundle`) is the sequence of
    phases it runs; `result` holds every field measured so far (see `JobRecord`)."""

    @classmethod
    def for_preset(cls, sweep: str, hardware: str, entry: dict[str, Any], config, dtype: str) -> JobRun:
        """A JobRun (in a fresh temporary directory) of an exported preset's cell compiled with
        `config`, for benchmarks that build the preset's model and inputs as its job did."""
        import tempfile

        from compiler.job import Job, MeasureSpec, ModelSpec

        job = Job(
            sweep=sweep,
            hardware=hardware,
            device="cpu" if hardware == "cpu" else "cuda",
            model=ModelSpec(**entry["model_spec"]),
            batch_size=entry["batch_size"],
            dtype=dtype,
            config=config,
            measure=MeasureSpec(),
            timeout_s=3600,
        )
        scratch = Path(tempfile.mkdtemp())
        (scratch / "job.json").write_text(json.dumps(job.to_dict()))
        return cls(scratch / "job.json", scratch / "result.json")

    # --- the phases other code runs on its own (tests, benchmarks/) -----------------------------

    def imports(self) -> None:
        """Phase `imports` (`workers.bench.imports.imports`)."""
        imports(self)

    def unsupported_here(self) -> str | None:
        """Why this device cannot run the job's cell, or None (`workers.bench.imports`)."""
        return unsupported_here(self)

    def build(self, keep_fp32_copy: bool = True, precision: str | None = None):
        """Phase `build`: model, input sets, fp32 copy (`workers.bench.build.build`)."""
        return build(self, keep_fp32_copy, precision)

    _rotating = JobRecord.rotating  # the name benchmarks/ call it by

    # --- the entry points -----------------------------------------------------------------------

    def run(self, repeat: int = 1) -> None:
        """Process `repeat` of the job. The first compiles cold and does everything; a later one
        (`measure.repeats`) compiles against the first one's cache, times again and checks its
        compiled output by the first's fp64 rule, against an fp64 reference of its own (FLOPs are
        the first's). A phase that raises ends the job with its status: `runtime_error` (build,
        eager, warm-up, timing) or `compile_error` (the baseline's and the candidate's compile)."""
        from compiler.capture import fxgraph_cache_counts

        first = repeat == 1
        if not first:
            self.result["repeat"] = repeat
        self.imports()
        # the check needs the device: a process started ahead makes it after its gate (in build)
        unsupported = None if self.ahead else self.unsupported_here()
        if unsupported:
            return self.fail("unsupported", unsupported)
        try:
            model, input_sets, fp32_copy = self.build()
            unsupported = self.unsupported_here() if self.ahead else None
            if unsupported:
                return self.fail("unsupported", unsupported)
            reference = eager_phase(self, model, input_sets)
        except Exception as exc:
            return self.fail("runtime_error", exc)
        baseline = None
        try:
            if self.job.baseline is not None:
                baseline = baseline_phase(self, input_sets)
            compiled, first_out = compile_phase(self, model, input_sets[0])
            if not first:
                self.result.update(fxgraph_cache_counts())
        except Exception as exc:
            return self.fail("compile_error", exc)
        try:
            compiled_warmup(self, compiled, input_sets)
            timed_rounds(self, model, compiled, input_sets, baseline)
        except Exception as exc:
            return self.fail("runtime_error", exc)
        if first:
            count_flops(self, model, input_sets[0])
        check_accuracy(self, reference, first_out, fp32_copy, input_sets[0])

    def run_warm(self) -> None:
        """A second compile of the same job against the cache the first run filled."""
        self.imports()
        try:
            model, input_sets, _ = self.build(keep_fp32_copy=False)
            # The cold process ran the model eagerly before compiling it: without this call
            # the warm compile traces other graphs, misses the cache and compiles again.
            prime(model, input_sets[0])
            compile_phase(self, model, input_sets[0])
            from compiler.capture import fxgraph_cache_counts

            self.result.update(fxgraph_cache_counts())
            self.result["status"] = "ok"
        except Exception as exc:
            self.fail("compile_error", exc)

    def run_bundle(
        self,
        bundle: Path,
        package: Path | None = None,
        serving: dict | None = None,
        stock: dict | None = None,
    ) -> None:
        """Compile the job's config cold and write the compile caches it filled to `bundle`
        (`torch.compiler.save_cache_artifacts()`: Inductor's FX graphs, AOTAutograd, autotuning),
        for `orchestrate export`; then, with `package`, build the config as an AOTInductor package
        there (`compiler.aoti`; a package that fails leaves `package_error`, the bundle stands).
        With `serving` (a serving profile's dict), the plan for that traffic is decided and every
        graph of it compiled before the bundle is written (`workers.bench.serving`), and with
        `stock` (a torch.compile mode and dtype) the stock user timed under the same traffic."""
        import torch

        self.imports()
        try:
            model, input_sets, _ = self.build(keep_fp32_copy=False)
            prime(model, input_sets[0])  # the eager call first, as a measured job makes it
            compiled, _ = compile_phase(self, model, input_sets[0])
            with torch.no_grad():  # the other input sets have the same shapes: no recompile expected
                for inputs in input_sets[1:]:
                    call(compiled, inputs)
            if serving is not None:
                prepare_serving(self, model, input_sets[0], serving, package, stock)
        except Exception as exc:
            return self.fail("compile_error", exc)
        if not write_bundle(self, bundle):
            discard_packages(self, package)  # no bundle, no preset: nothing of it ships
        elif package is not None and "package_from_bucket" not in self.result:
            build_package(self, model, input_sets[0], package)  # (else its batch's bucket is it)

    def run_bucket_package(self, bucket: int | tuple[int, int], path: Path) -> None:
        """The job's config built as an AOTInductor package at `path` for its inputs resized to a
        batch of `bucket` (`compiler.aoti.build_package`; its columns in the result): one bucket of
        a serving plan, built in a process of its own beside the others
        (`workers.bench.serving.package_buckets`). A (low, high) bucket is the dynamic plan's
        package for that batch range, exported at the job's batch size within it (at least 2)."""
        from compiler import aoti
        from compiler.serving.padding import resize_batch

        self.imports()
        try:
            model, input_sets, _ = self.build(keep_fp32_copy=False)
            args, kwargs = aoti.split_inputs(input_sets[0])
            batch = bucket if isinstance(bucket, tuple) else None
            size = bucket if batch is None else max(2, batch[0], min(self.job.batch_size, batch[1]))
            b_args, b_kwargs = resize_batch(args, kwargs, size)
            cfg = self.job.config
            self.enter("package")
            info = aoti.build_package(
                cfg.prepare_model(model),
                b_kwargs if isinstance(input_sets[0], dict) else b_args,
                cfg,
                path,
                batch,
            )
        except Exception as exc:
            return self.fail("compile_error", exc)
        self.result.update(info)
        self.result["status"] = "ok"

    def run_helper(self, work: Any, spec: dict) -> None:
        """A job's helper work in this process of its own: `work(self, spec)`, the stock user under
        a serving profile's traffic (`workers.bench.serving_stock.serve_stock`, `--serving-stock`)
        or a buckets plan's packages prepared cold (`workers.bench.serving_prepare.serve_prepare`,
        `--serving-prepare`); an exception it raises is the result's `runtime_error`."""
        self.imports()
        try:
            work(self, spec)
        except Exception as exc:
            return self.fail("runtime_error", exc)
        self.result["status"] = "ok"


USAGE = (
    "usage: python -m workers.bench [--warm | --repeat K | --bundle FILE [--package FILE] [--serving JSON] "
    "| --bucket-package N|LOW:HIGH FILE | --serving-stock JSON | --serving-prepare JSON] JOB.json RESULT.json"
)


def _bucket(text: str) -> int | tuple[int, int] | None:
    """`--bucket-package`'s bucket: N (a batch size) or LOW:HIGH (a batch range); None if neither."""
    low, _, high = text.partition(":")
    if not low.isdigit() or (high and not high.isdigit()):
        return None
    return (int(low), int(high)) if high else int(low)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    warm = bool(argv) and argv[0] == "--warm"
    repeat = 1
    bundle = package = serving = bucket = stock = cold = None
    if warm:
        argv = argv[1:]
    elif len(argv) >= 2 and argv[0] == "--serving-prepare":
        cold, argv = json.loads(argv[1]), argv[2:]
    elif len(argv) >= 2 and argv[0] == "--serving-stock":
        stock, argv = json.loads(argv[1]), argv[2:]
    elif len(argv) >= 3 and argv[0] == "--bucket-package" and _bucket(argv[1]) is not None:
        bucket, package, argv = _bucket(argv[1]), Path(argv[2]), argv[3:]
    elif len(argv) >= 2 and argv[0] == "--bundle":
        bundle, argv = Path(argv[1]), argv[2:]
        if len(argv) >= 2 and argv[0] == "--package":
            package, argv = Path(argv[1]), argv[2:]
        if len(argv) >= 2 and argv[0] == "--serving":
            serving, argv = json.loads(argv[1]), argv[2:]
        if len(argv) >= 2 and argv[0] == "--serving-stock":
            stock, argv = json.loads(argv[1]), argv[2:]
    elif len(argv) >= 2 and argv[0] == "--repeat":
        if not argv[1].isdigit() or int(argv[1]) < 2:
            print(f"--repeat takes a process number >= 2, got {argv[1]!r}\n{USAGE}", file=sys.stderr)
            return 2
        repeat, argv = int(argv[1]), argv[2:]
    if len(argv) != 2:
        print(USAGE, file=sys.stderr)
        return 2
    _die_with_parent()
    affinity, pinned, pin_note = pin_from_environment()
    run = JobRun(Path(argv[0]), Path(argv[1]))
    run.result.update(cpu_affinity=affinity, cpu_pinned=pinned)
    if pin_note:
        run.notes.append(pin_note)
    run.save()
    try:
        if warm:
            run.run_warm()
        elif bucket is not None:
            run.run_bucket_package(bucket, package)
        elif stock is not None and bundle is None:
            from workers.bench.serving_stock import serve_stock

            run.run_helper(serve_stock, stock)
        elif cold is not None:
            from workers.bench.serving_prepare import serve_prepare

            run.run_helper(serve_prepare, cold)
        elif bundle is not None:
            run.run_bundle(bundle, package, serving, stock)
        else:
            run.run(repeat)
    except BaseException as exc:  # a bug in this file must still become a row
        run.fail("runtime_error", exc)
    run.close_phase()
    run.result["phase"] = "done"
    run.result["finished_at_unix"] = time.time()  # the runner times the exit from here
    run.save(final=True)
    # The result is on disk: skip the interpreter's teardown (Inductor's compile-worker pool
    # shutdown and module finalizers cost about a second per job; the workers exit when their
    # pipe to us closes).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main())
