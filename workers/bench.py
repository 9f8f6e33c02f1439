"""The job subprocess: `python -m workers.bench [--warm] JOB.json RESULT.json`.

Runs one job in a fresh process (see docs/measurement.md, "How a job runs and is measured"):

1. build the model (random weights) and `INPUT_SETS` task-correct input sets, rotated call by
   call so that caches do not flatter either side; keep an fp32 copy for the fp64 reference;
2. eager: a reference output, then warm-up until the latency is stable (peak memory measured);
3. compile: the first compiled call's wall time is `compile_s`, with Dynamo's and Inductor's
   breakdown; then warm-up until stable (peak memory measured);
4. `iterations` timed calls of eager and of compiled, interleaved in rounds; CUDA events on GPU;
   per-call samples kept; median, p10, p90 and a bootstrap CI of the speedup;
5. FLOPs of one call; accuracy of the compiled output against an fp64 reference with the rule of
   PyTorch's benchmark harness.

`--repeat K` (K >= 2, for `measure.repeats`) is a later process of the same job: it builds,
warms eager up, compiles against the cache the first process filled (its `compile_s` is a warm
compile), warms up and times again, and checks its compiled output by the same fp64 rule as the first
(against an fp64 reference of its own): a warm process may not be held to a stricter rule than
the cold one. FLOPs are the first process's. `--warm` only builds and compiles against that cache
and reports the compile time.

The process pins itself to the cores the runner reserved (`CO_CPU_AFFINITY`) before it imports
anything heavy, records the wall time of every phase (`phase_<name>_s`, from its spawn by the
runner to its last phase), and on a GPU samples the clocks through NVML during the timed rounds.
Exceptions become a status in RESULT.json; the file is rewritten at every phase, so a crash or a
timeout still leaves what was measured before it. Only a crash of the process itself (a
segfault, a kill) leaves RESULT.json without "final". Within the compile phase, each autotuned
op's kernel choices are appended to `RESULT.kernel_choices.jsonl` beside it as they are timed
(`choices_stream`), so a compile killed mid-autotune leaves them for the runner.
"""

from __future__ import annotations

import copy
import json
import os
import platform
import statistics
import sys
import time
import traceback
from contextlib import contextmanager, nullcontext, suppress
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from compiler import durable
from compiler.env import die_with_parent, guard_process_group
from workers.affinity import pin_from_environment
from workers.job import PHASES

PARENT_PID_ENV = "CO_PARENT_PID"
SPAWNED_AT_ENV = "CO_SPAWNED_AT"
PIN_TIMING_THREAD_ENV = "CO_PIN_TIMING_THREAD"
ERROR_CHARS = 4000
INPUT_SETS = 3


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


def _atomic_write_json(path: Path, data: dict[str, Any]) -> None:
    durable.write_text(path, json.dumps(data, default=str))


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


def _call(fn, inputs):
    return fn(**inputs) if isinstance(inputs, dict) else fn(*inputs)


def _cast_inputs(inputs, device, dtype):
    import torch

    def place(t):
        if isinstance(t, torch.Tensor):
            return t.to(device=device, dtype=dtype if t.is_floating_point() else t.dtype)
        return t

    return {k: place(v) for k, v in inputs.items()} if isinstance(inputs, dict) else tuple(map(place, inputs))


@contextmanager
def _timing_thread_pinned():
    """With CO_PIN_TIMING_THREAD=1 (an experiment of benchmarks/noise.py), the thread that times
    the calls runs on one core of the job's set, so it cannot migrate while it times."""
    if os.environ.get(PIN_TIMING_THREAD_ENV) != "1":
        yield
        return
    allowed = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {min(allowed)})  # pid 0: the calling thread only
    try:
        yield
    finally:
        os.sched_setaffinity(0, allowed)


DEVICE_CALLS = 20
"""Calls of each side a GPU job profiles for its device time (after its timed rounds)."""

SLOWDOWN_ENV = "ORCHESTRATE_TEST_SLOWDOWN"
"""A test hook of the regression report: `CLASS=FACTOR[,CLASS=FACTOR...]` (e.g. `H100=1.10`)
multiplies the compiled samples of jobs on those hardware classes by FACTOR, wall and device time
alike, before the row is computed, and the row's notes say so. For checking that a known slowdown is flagged on real
hardware noise; never set it in a real sweep."""


STALL_ENV = "ORCHESTRATE_TEST_STALL_AFTER_OPS"
"""A test hook of kernel-choice streaming: `N` makes the job process sleep for good, inside its
compile, once N ops have been autotuned and their rows written to the choices stream, so that
the job's real timeout lands mid-autotune after exactly N ops (a timing-independent way to test
what a timed-out job keeps). The result's notes say so. Never set it in a real sweep."""


def choices_stream(result_path: Path) -> Path:
    """The JSON-lines file beside a process's RESULT.json where its compile appends each
    autotuned op's kernel-choice rows as they are timed (`compiler.kernels.KernelChoiceRecorder`);
    the runner reads it when the process ends without them in its result."""
    return result_path.with_name(f"{result_path.stem}.kernel_choices.jsonl")


def slowdown_hook(hardware: str) -> float:
    """The factor `ORCHESTRATE_TEST_SLOWDOWN` sets for `hardware` (1.0 when unset)."""
    for item in filter(None, os.environ.get(SLOWDOWN_ENV, "").split(",")):
        name, _, factor = item.partition("=")
        if name.strip() == hardware:
            try:
                return float(factor)
            except ValueError:
                raise ValueError(
                    f"{SLOWDOWN_ENV}={os.environ[SLOWDOWN_ENV]!r}: {factor!r} is not a number"
                ) from None
    return 1.0


class JobRun:
    """The phases of one job; `result` holds every field measured so far."""

    def __init__(self, job_path: Path, result_path: Path):
        from workers.job import Job

        self.job = Job.from_dict(json.loads(job_path.read_text()))
        self.result_path = result_path
        self.notes: list[str] = []
        self.shared_cache = None  # compiler.shared_cache.SharedCache, once the compile stack is loaded
        self.result: dict[str, Any] = {
            "started_at": datetime.now(timezone.utc).isoformat(),
            "python_version": platform.python_version(),
            "phase": "start",
        }
        self._phase_t0 = time.perf_counter()
        spawned = os.environ.get(SPAWNED_AT_ENV)
        if spawned:  # interpreter start and this module's imports, from the runner's clock
            with suppress(ValueError):
                self.result["phase_start_s"] = max(0.0, time.time() - float(spawned))

    @classmethod
    def for_preset(cls, sweep: str, hardware: str, entry: dict[str, Any], config, dtype: str) -> JobRun:
        """A JobRun (in a fresh temporary directory) of an exported preset's cell compiled with
        `config`, for benchmarks that build the preset's model and inputs as its job did."""
        import tempfile

        from workers.job import Job, MeasureSpec, ModelSpec

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

    def save(self, final: bool = False) -> None:
        self.result["final"] = final
        if self.notes:
            self.result["notes"] = "; ".join(self.notes)
        _atomic_write_json(self.result_path, self.result)

    def enter(self, phase: str) -> None:
        """Record the phase before starting it, so a crash or timeout says where it happened; the
        phase it ends gets its wall time (`phase_<name>_s`)."""
        self.close_phase()
        self.result["phase"] = phase
        self.save()

    def close_phase(self) -> None:
        now = time.perf_counter()
        previous = self.result.get("phase")
        if previous in PHASES and previous not in ("start", "exit"):
            key = f"phase_{previous}_s"
            self.result[key] = self.result.get(key, 0.0) + now - self._phase_t0
        self._phase_t0 = now

    def fail(self, status: str, exc: BaseException | str) -> None:
        self.result["status"] = "oom" if isinstance(exc, BaseException) and _is_oom(exc) else status
        self.result["error"] = exc if isinstance(exc, str) else _error_text(exc)
        if isinstance(exc, BaseException):
            self.result["traceback"] = "".join(traceback.format_exception(exc))[-ERROR_CHARS:]

    # --- the two entry points -------------------------------------------------------------------

    def imports(self) -> None:
        """torch and the model's code (for an hf: id transformers and its modeling module; a
        python: model imports neither); the compile stack comes in `compile_imports`."""
        self.enter("imports")
        import torch  # noqa: F401

        from compiler import env
        from workers import external, zoo  # noqa: F401

        if self.job.model.id.startswith("hf:") and zoo.is_known(self.job.model.id):
            zoo.model_class(self.job.model.id)

        self.result.update(env.describe(self.job.device))

    def compile_imports(self) -> None:
        """Dynamo and Inductor load lazily at the first `torch.compile` (about 3 s on a 2-core
        machine, 8 s on the H100 host): counted as imports, not as compile time, and only paid
        by a process that gets as far as compiling."""
        self.enter("imports")
        import torch._dynamo  # noqa: F401

        with suppress(ImportError):  # another torch layout: it loads at the first compile instead
            import torch._inductor.compile_fx  # noqa: F401
        if self.job.device == "cpu" and self.job.config.backend == "inductor":
            from compiler import isa_probe  # the machine's ISA check, not the model's compile

            with suppress(Exception):  # another torch layout: the compile runs the check itself
                isa_probe.probe()
        if self.shared_cache is None:  # before the first compile (a tune's baseline compiles first)
            from compiler.shared_cache import install

            self.shared_cache = install(self.job.hardware)
            self.result.update(
                compile_cache=self.shared_cache.mode, cache_namespace=self.shared_cache.namespace
            )
            self.notes.extend(self.shared_cache.notes)

    def run(self, repeat: int = 1) -> None:
        """Process `repeat` of the job. The first compiles cold and does everything; a later one
        (`measure.repeats`) compiles against the first one's cache, times again and checks its
        compiled output by the first's fp64 rule, against an fp64 reference of its own (FLOPs are
        the first's)."""
        from compiler.capture import fxgraph_cache_counts

        first = repeat == 1
        if not first:
            self.result["repeat"] = repeat
        self.imports()
        unsupported = self.unsupported_here()
        if unsupported:
            return self.fail("unsupported", unsupported)
        try:
            model, input_sets, fp32_copy = self.build()
            reference = self.eager_phase(model, input_sets)
        except Exception as exc:
            return self.fail("runtime_error", exc)
        baseline = None
        try:
            if self.job.baseline is not None:
                baseline = self.baseline_phase(input_sets)
            compiled, first_out = self.compile_phase(model, input_sets[0])
            if not first:
                self.result.update(fxgraph_cache_counts())
        except Exception as exc:
            return self.fail("compile_error", exc)
        try:
            self.compiled_warmup(compiled, input_sets)
            self.timed_rounds(model, compiled, input_sets, baseline)
        except Exception as exc:
            return self.fail("runtime_error", exc)
        if first:
            self.count_flops(model, input_sets[0])
        self.check_accuracy(reference, first_out, fp32_copy, input_sets[0])

    def unsupported_here(self) -> str | None:
        """Why this device cannot run the job's cell (`compiler.capabilities`, measured from the
        device: a class the planner's table lacks is judged here), or None; what it runs without
        goes into the notes."""
        if self.job.device != "cuda":
            return None
        from compiler.capabilities import cell_support, from_device

        caps = from_device()
        reason, notes = cell_support(caps, self.job.dtype, self.job.config)
        self.notes.extend(n for n in notes if n not in self.notes)
        if reason is None:
            return None
        return f"{reason} (measured on this device: {caps.sm}, {caps.sm_count} SMs)"

    def run_warm(self) -> None:
        """A second compile of the same job against the cache the first run filled."""
        self.imports()
        import torch

        try:
            model, input_sets, _ = self.build(keep_fp32_copy=False)
            # The cold process ran the model eagerly before compiling it. Some models change on
            # their first call (SegFormer traces two graphs before it and one after), so without
            # this call the warm compile traces other graphs, misses the cache and compiles again.
            with torch.no_grad():
                _call(model, input_sets[0])
            self.compile_phase(model, input_sets[0])
            from compiler.capture import fxgraph_cache_counts

            self.result.update(fxgraph_cache_counts())
            self.result["status"] = "ok"
        except Exception as exc:
            self.fail("compile_error", exc)

    def run_bundle(self, bundle: Path, package: Path | None = None) -> None:
        """Compile the job's config cold and write the compile caches it filled to `bundle`
        (`torch.compiler.save_cache_artifacts()`: Inductor's FX graphs, AOTAutograd, autotuning),
        for `orchestrate export`; then, with `package`, build the config as an AOTInductor package
        there (`compiler.aoti`; a package that fails leaves `package_error`, the bundle stands)."""
        import torch

        self.imports()
        try:
            model, input_sets, _ = self.build(keep_fp32_copy=False)
            with torch.no_grad():  # the eager call first, as a measured job makes it (see run_warm)
                _call(model, input_sets[0])
            compiled, _ = self.compile_phase(model, input_sets[0])
            with torch.no_grad():  # the other input sets have the same shapes: no recompile expected
                for inputs in input_sets[1:]:
                    _call(compiled, inputs)
        except Exception as exc:
            return self.fail("compile_error", exc)
        self.enter("bundle")
        artifacts = torch.compiler.save_cache_artifacts()
        if artifacts is None:
            from compiler.capture import fxgraph_cache_counts

            why = "the compile left nothing in the caches to bundle"
            if fxgraph_cache_counts()["fxgraph_cache_misses"]:
                why += " (Inductor bypassed its FX-graph cache"
                if self.job.config.freezing and self.job.device == "cpu":
                    why += ": freezing on CPU packs the weights as oneDNN tensors, which it cannot pickle"
                why += "); the preset is exported without a bundle and compiles cold where it is applied"
            return self.fail("compile_error", why)
        data, info = artifacts
        durable.write_bytes(bundle, data)
        self.result.update(
            status="ok",
            bundle_bytes=len(data),
            bundle_artifacts={k: len(v) for k, v in info.artifacts.items()},
        )
        if package is not None:
            self.build_package(model, input_sets[0], package)

    def build_package(self, model, inputs, package: Path) -> None:
        from compiler import aoti

        self.enter("package")
        cfg = self.job.config
        why = aoti.packageable(cfg)
        if why:
            self.result["package_error"] = f"not packaged: {why}"
            return
        try:  # the compiled model may hold the module: export a copy laid out as the config says
            info = aoti.build_package(cfg.prepare_model(copy.deepcopy(model)), inputs, cfg, package)
        except Exception as exc:
            self.result["package_error"] = (
                f"{type(exc).__name__}: {str(exc).splitlines()[0][:500] if str(exc) else ''}"
            )
            return
        self.result.update(info)

    # --- phases ---------------------------------------------------------------------------------

    def build(self, keep_fp32_copy: bool = True, precision: str | None = None):
        """The model (random weights, seed 0) and its input sets, cast for `precision` (default:
        the job's), and an fp32 copy on the host for the fp64 reference if asked."""
        import torch

        from compiler import precision as policies
        from compiler import runtime
        from compiler.precision import apply_precision
        from workers import external, zoo

        job = self.job
        self.enter("build")
        device = torch.device("cuda" if job.device == "cuda" else "cpu")
        dtype = apply_precision(precision or job.dtype)
        # before the model exists: eager and compiled run under the same settings, from the first call
        job.config.apply_runtime()
        self.result["runtime"] = json.dumps(runtime.current(), sort_keys=True)
        if precision is None or precision == job.dtype:  # what the job's own side ran under
            self.result.update(policies.current(), weights=job.model.weights)
        torch.manual_seed(0)
        if job.model.id.startswith("python:"):
            factory = zoo.load_python_factory(job.model.id)
            model, inputs = factory(job.batch_size, job.model.input_size, dict(job.model.overrides))
            input_sets = [inputs]
            task = job.model.task or "other"
        elif external.is_external_id(job.model.id):
            built = external.build(job.model.id, dict(job.model.overrides))
            model = built.module
            size = job.model.input_size or built.image_size
            input_sets = [
                external.make_inputs(job.batch_size, size, torch.Generator().manual_seed(seed))
                for seed in range(INPUT_SETS)
            ]
            task = job.model.task or built.task
        else:
            entry = zoo.get_entry(job.model.id)
            if job.model.weights == "random":
                model = entry.build(dict(job.model.overrides))
            else:  # the checkpoint's own weights (in float32), from a local directory only
                model = zoo.load_pretrained(job.model.id, zoo.weights_dir(job.model.id, job.model.weights))
            size = job.model.input_size or entry.image_size
            input_sets = [
                entry.make_inputs(model, job.batch_size, size, torch.Generator().manual_seed(seed))
                for seed in range(INPUT_SETS)
            ]
            task = job.model.task or entry.task
        self.result["task"] = task
        model = model.eval()
        fp32_copy = copy.deepcopy(model).float() if keep_fp32_copy else None
        model = model.to(device=device, dtype=dtype)
        return model, [_cast_inputs(i, device, dtype) for i in input_sets], fp32_copy

    def _rotating(self, fn, input_sets, mark_step: bool = False):
        import torch

        n = len(input_sets)
        if mark_step and self.job.device == "cuda":

            def call(i):
                torch.compiler.cudagraph_mark_step_begin()  # CUDA-graph outputs live until the next step
                return _call(fn, input_sets[i % n])

            return call
        return lambda i: _call(fn, input_sets[i % n])

    def eager_phase(self, model, input_sets):
        import torch

        from compiler import measure
        from workers import zoo

        job, dev = self.job, self.job.device
        self.enter("eager")
        measure.reset_peak_memory(dev)
        with torch.no_grad():
            reference = [t.clone() for t in zoo.output_tensors(_call(model, input_sets[0]))]
            calls = measure.warmup_until_stable(self._rotating(model, input_sets), dev, job.measure.warmup)
        self.result.update(eager_warmup_calls=calls, eager_peak_mem_bytes=measure.peak_memory_bytes(dev))
        return reference

    def baseline_phase(self, input_sets):
        """Build and compile the job's baseline (its own model copy and precision), timing its
        first call as `baseline_compile_s`; return its rotating call for the timed rounds. Runs before the candidate compiles, so the
        candidate's compile statistics are its own."""
        import torch

        from compiler import capture, measure
        from compiler.precision import apply_precision
        from workers import zoo

        base = self.job.baseline
        if base.config.runtime != self.job.config.runtime:
            # a process keeps its first cuDNN plan per convolution: the second side would be
            # timed under the first side's plans, whatever its own setting says
            raise ValueError(
                f"the baseline {base.config.name!r} and {self.job.config.name!r} differ in runtime "
                f"settings ({base.config.runtime} vs {self.job.config.runtime}): such configs are "
                "compared in processes of their own, never in one"
            )
        model, base_inputs, _ = self.build(keep_fp32_copy=False, precision=base.dtype)
        with torch.no_grad():  # the eager call first, as the candidate's model had one
            _call(model, base_inputs[0])
        self.compile_imports()
        self.enter("compile")
        capture.reset()
        base.config.apply_globals()
        side = _sides()[0](base.config.prepare_model(model))
        compiled = torch.compile(side, **base.config.compile_kwargs())
        t0 = time.perf_counter()
        with torch.no_grad():
            if self.job.device == "cuda":
                torch.compiler.cudagraph_mark_step_begin()
            zoo.output_tensors(_call(compiled, base_inputs[0]))
            measure.synchronize(self.job.device)
        self.result["baseline_compile_s"] = time.perf_counter() - t0
        with torch.no_grad():
            measure.warmup_until_stable(
                self._rotating(compiled, base_inputs, mark_step=True),
                self.job.device,
                self.job.measure.warmup,
            )
        apply_precision(self.job.dtype)  # the candidate's policy again, for its compile
        return self._rotating(compiled, base_inputs, mark_step=True)

    def compile_phase(self, model, inputs):
        import torch

        from compiler import capture, measure
        from compiler.kernels import KernelChoiceRecorder, autotuner_ids, triton_kernel_rows
        from workers import zoo

        dev = self.job.device
        self.compile_imports()
        self.enter("compile")  # also saves the eager numbers, should the compile never return
        capture.reset(dynamo=self.job.baseline is None)  # the baseline, compiled already, stays
        self.shared_cache.start_counting()
        cfg = self.job.config
        cfg.apply_globals()
        earlier = autotuner_ids() if self.job.baseline is not None else set()  # the baseline's kernels
        if cfg.channels_last:  # a copy: eager keeps timing the model as built
            model = cfg.prepare_model(copy.deepcopy(model))
        if self.job.baseline is not None:
            model = _sides()[1](model)
        compiled = torch.compile(model, **cfg.compile_kwargs())
        # Each op's candidates also go to a file as they are timed: a compile killed by the
        # timeout mid-autotune (minutes of it, for a big model on a GPU) still leaves them.
        recorder = KernelChoiceRecorder(stream=choices_stream(self.result_path), after_op=self._stall_hook())
        t0 = time.perf_counter()
        with torch.no_grad(), recorder as choices:
            if dev == "cuda":
                torch.compiler.cudagraph_mark_step_begin()
            out = [t.clone() for t in zoo.output_tensors(_call(compiled, inputs))]
            measure.synchronize(dev)
        self.result["compile_s"] = time.perf_counter() - t0
        self.result.update(capture.capture_stats().to_dict())
        self.record_cache_use()
        if choices.rows:  # only a compile that autotuned (a warm one hits the FX-graph cache)
            self.result["kernel_choices"] = choices.rows
        if choices.ops:
            self.result["autotuned_ops"] = choices.ops
        if choices.stream_error:
            self.notes.append(f"kernel choices not streamed to disk ({choices.stream_error})")
        kernels = triton_kernel_rows(exclude=earlier)  # settled by the first run, just made
        if kernels and "repeat" not in self.result:  # the cold process's, as kernel_choices
            self.result["triton_kernels"] = kernels
        return compiled, out

    def _stall_hook(self):
        """The recorder's `after_op` for `STALL_ENV` (None when it is unset)."""
        value = os.environ.get(STALL_ENV)
        if not value:
            return None
        if not value.isdigit() or int(value) < 1:
            raise ValueError(f"{STALL_ENV}={value!r}: expected a number of ops >= 1")
        limit = int(value)

        def stall(ops: int) -> None:
            if ops < limit:
                return
            self.notes.append(f"test hook {STALL_ENV}: stalled the compile after {ops} autotuned ops")
            self.save()
            while True:  # until the runner's timeout kills the process
                time.sleep(60)

        return stall

    def record_cache_use(self) -> None:
        """Whether and how the compile just timed used the shared cache: `compile_s` of a compile
        served from it is not a cold compile, and the row must say so."""
        from compiler.capture import fxgraph_cache_counts

        fx = fxgraph_cache_counts()
        cache = self.shared_cache.columns()
        cache.update(fx_cache_hits=fx["fxgraph_cache_hits"], fx_cache_misses=fx["fxgraph_cache_misses"])
        # A fresh process starts with empty local caches, so with the shared cache on, every hit
        # was served by it; with it off, nothing could be.
        hits = ("fx_cache_hits", "autotune_cache_hits", "gemm_cache_hits")
        cache["compile_from_cache"] = cache["compile_cache"] == "shared" and any(cache.get(k) for k in hits)
        self.result.update(cache)
        self.notes.extend(n for n in self.shared_cache.notes if n not in self.notes)

    def compiled_warmup(self, compiled, input_sets):
        import torch

        from compiler import measure

        dev = self.job.device
        self.enter("compiled_warmup")
        measure.reset_peak_memory(dev)
        with torch.no_grad():
            calls = measure.warmup_until_stable(
                self._rotating(compiled, input_sets, mark_step=True), dev, self.job.measure.warmup
            )
        peak = measure.peak_memory_bytes(dev)
        eager_peak = self.result.get("eager_peak_mem_bytes")
        self.result.update(
            compiled_warmup_calls=calls,
            peak_mem_bytes=peak,
            memory_compression=eager_peak / peak if eager_peak and peak else None,
        )

    def timed_rounds(self, model, compiled, input_sets, baseline=None):
        """Eager and compiled calls interleaved in rounds (and the baseline's, if the job has
        one: then every round times eager, the baseline and the candidate in turn)."""
        import torch

        from compiler import measure
        from compiler.clocks import ClockSampler
        from workers.repeats import device_fields, latency_fields

        job, dev = self.job, self.job.device
        self.enter("timing")
        probes: list[float] = []
        steal_before = measure.cpu_steal_ticks()
        cores = sorted(os.sched_getaffinity(0))
        host = {"load": os.getloadavg()[0], "mhz": [measure.cpu_mhz(cores)], "gc": measure.gc_collections()}
        sampler = ClockSampler() if dev == "cuda" else nullcontext()
        sides = [self._rotating(model, input_sets), self._rotating(compiled, input_sets, mark_step=True)]
        if baseline is not None:
            sides.insert(1, baseline)
            if job.baseline.dtype != job.dtype:  # every side pays the same switch, so none is favoured
                policies = [job.dtype, job.baseline.dtype, job.dtype]
                sides = [_switching_precision(c, p, job.dtype) for c, p in zip(sides, policies, strict=True)]
        with torch.no_grad(), sampler, _timing_thread_pinned():
            samples = measure.interleaved(
                sides,
                dev,
                job.measure.iterations,
                job.measure.rounds,
                after_round=lambda: probes.append(measure.host_probe_us()),
            )
            eager_ms, compiled_ms = samples[0], samples[-1]
            factor = slowdown_hook(job.hardware)
            if factor != 1.0:
                compiled_ms = [x * factor for x in compiled_ms]
                self.notes.append(f"test hook {SLOWDOWN_ENV}: compiled samples multiplied by {factor:g}")
            n = max(1, job.measure.iterations // 2)
            eager_b2b = measure.back_to_back_ms(self._rotating(model, input_sets), n, dev)
            compiled_b2b = measure.back_to_back_ms(
                self._rotating(compiled, input_sets, mark_step=True), n, dev
            )
            device = self.device_times(model, compiled, input_sets, factor) if dev == "cuda" else None
        self.result.update(
            latency_fields([eager_ms], [compiled_ms], [samples[1]] if baseline is not None else None)
        )
        if device is not None:  # against the wall medians just computed
            wall = (self.result["eager_ms"], self.result["compiled_ms"])
            self.result.update(device_fields([device[0]], [device[1]], *wall))
        self.result.update(eager_b2b_ms=eager_b2b, compiled_b2b_ms=compiled_b2b, host_probe_us=probes)
        steal = measure.steal_share(steal_before, measure.cpu_steal_ticks())
        if steal is not None:
            self.result["host_steal_share"] = steal
        mhz = [m for m in (*host["mhz"], measure.cpu_mhz(cores)) if m is not None]
        self.result.update(
            host_cpu_mhz=[statistics.fmean(mhz) if mhz else None],
            host_load_1m=[host["load"]],
            timing_gc_collections=[measure.gc_collections() - host["gc"]],
        )
        if isinstance(sampler, ClockSampler):
            if sampler.unavailable:
                self.notes.append(f"clocks not sampled during timing: {sampler.unavailable}")
            else:
                self.result.update(sampler.summary())

    def device_times(self, model, compiled, input_sets, factor: float = 1.0):
        """Device (GPU) busy time per call of eager and of compiled, from the profiler's kernel
        records of `DEVICE_CALLS` calls each (`compiler.measure.device_busy_ms`); the slowdown
        test hook scales the compiled side as it scales the wall samples. None, with a note, where
        the profiler gives nothing (no CUPTI, or no kernel records)."""
        from compiler import measure

        calls = min(DEVICE_CALLS, max(1, self.job.measure.iterations))
        try:
            eager, comp = measure.device_busy_ms(
                [self._rotating(model, input_sets), self._rotating(compiled, input_sets, mark_step=True)],
                calls,
            )
        except Exception as exc:  # a profiler that cannot start must not fail the job
            self.notes.append(f"device time not measured: {_error_text(exc)[:200]}")
            return None
        if not eager or not comp:
            self.notes.append("device time not measured: the profiler recorded no kernels")
            return None
        if factor != 1.0:
            comp = [x * factor for x in comp]
        return eager, comp

    def count_flops(self, model, inputs):
        import torch

        from compiler import measure

        if not self.job.measure.flops:
            return
        self.enter("flops")
        with torch.no_grad():
            flops = measure.count_flops(lambda: _call(model, inputs))
        if flops:
            self.result["flops"] = flops
            for side in ("eager", "compiled"):
                ms = self.result.get(f"{side}_ms")
                self.result[f"{side}_tflops"] = flops / (ms * 1e-3) / 1e12 if ms else None
        else:
            self.notes.append("FLOPs not counted: the flop counter failed on this model")

    def check_accuracy(self, reference, compiled_out, fp32_copy, inputs):
        import torch

        from compiler import measure
        from workers import zoo

        job = self.job
        self.enter("accuracy")
        cmp = measure.compare_outputs(reference, compiled_out, job.dtype)
        self.result.update(max_abs_err=cmp.max_abs_err, max_rel_err=cmp.max_rel_err)
        try:
            device = "cuda" if job.device == "cuda" else "cpu"
            fp64_model = fp32_copy.to(device=device, dtype=torch.float64)
            inputs64 = _cast_inputs(inputs, device, torch.float64)
            with torch.no_grad():
                fp64 = [t.double() for t in zoo.output_tensors(_call(fp64_model, inputs64))]
                if "repeat" not in self.result:  # the model's own conditioning: the first process's
                    self.conditioning(fp64_model, inputs64, fp64)
            del fp64_model
        except Exception as exc:  # no fp64 reference (memory, an op without fp64): fall back to eager
            why = "out of memory" if _is_oom(exc) else _error_text(exc)[:200]
            self.notes.append(f"no fp64 reference ({why}): accuracy judged against eager only")
            if cmp.ok:
                self.result["status"] = "ok"
            else:
                self.fail("accuracy_fail", cmp.detail)
            return
        check = measure.check_against_fp64(reference, compiled_out, fp64, job.dtype)
        self.result.update(
            rmse_eager=check.rmse_eager,
            rmse_compiled=check.rmse_compiled,
            fp64_max_rel_err=measure.rel_err_against(fp64, compiled_out),
            eager_fp64_max_rel_err=measure.rel_err_against(fp64, reference),
        )
        if check.ok:
            self.result["status"] = "ok"
        else:
            self.fail("accuracy_fail", check.detail)

    def conditioning(self, fp64_model, inputs64, fp64) -> None:
        """What the fp64 outputs can show of a precision's error (`compiler.accuracy` judges it):
        their spread, and their sensitivity to a relative change of the float inputs, from one
        more fp64 call (none where the model takes no float input)."""
        import torch

        from compiler import measure
        from workers import zoo

        self.result["output_spread"] = measure.output_spread(fp64)
        found = []
        for step in measure.SENSITIVITY_STEPS:
            moved, changed = measure.perturbed(inputs64, torch.Generator().manual_seed(1), step)
            if not changed:
                return
            again = [t.double() for t in zoo.output_tensors(_call(fp64_model, moved))]
            found.append(measure.sensitivity(fp64, again, step))
        self.result["output_sensitivity"] = found


def _sides():
    """Two wrapper module classes for a job with a baseline, one per compiled side. Dynamo caches
    compiled code per code object and guards parameters by shape, not identity, so two copies
    of one model compiled with equal `torch.compile` arguments share their first compile (a
    global such as `freezing` is not part of the match): the candidate would run the baseline's
    code. Each wrapper's `forward` is a code object of its own, so each side compiles its own."""
    import torch

    class BaselineSide(torch.nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, *args, **kwargs):
            return self.inner(*args, **kwargs)

    class CandidateSide(torch.nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, *args, **kwargs):
            return self.inner(*args, **kwargs)

    return BaselineSide, CandidateSide


def _switching_precision(call, own: str, other: str):
    """`call` run under precision policy `own` and the process put back to `other` after it (TF32
    is a process-wide matmul setting; a baseline and a candidate with different policies share
    one process)."""
    from compiler.precision import apply_precision

    def run(i):
        apply_precision(own)
        try:
            return call(i)
        finally:
            apply_precision(other)

    return run


USAGE = "usage: python -m workers.bench [--warm | --repeat K | --bundle FILE [--package FILE]] JOB.json RESULT.json"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    warm = bool(argv) and argv[0] == "--warm"
    repeat = 1
    bundle = package = None
    if warm:
        argv = argv[1:]
    elif len(argv) >= 2 and argv[0] == "--bundle":
        bundle, argv = Path(argv[1]), argv[2:]
        if len(argv) >= 2 and argv[0] == "--package":
            package, argv = Path(argv[1]), argv[2:]
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
        elif bundle is not None:
            run.run_bundle(bundle, package)
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
