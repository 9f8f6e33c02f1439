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

A later process of a job may be started ahead, while the one before it still times
(`workers.ahead`): it imports and builds on the host on cores of its own, then waits at its gate
until the device is free (`workers.bench.gate`, `JobRecord.pass_gate`); from there on it runs
as any other. The process pins itself to the cores the runner reserved (`CO_CPU_AFFINITY`) before
it imports anything heavy, records the wall time of every phase (`phase_<name>_s`, from its spawn by the
runner to its last phase), and on a GPU samples the clocks through NVML during the timed rounds.
Exceptions become a status in RESULT.json; the file is rewritten at every phase, so a crash or a
timeout still leaves what was measured before it. Only a crash of the process itself (a
segfault, a kill) leaves RESULT.json without "final". Within the compile phase, each autotuned
op's kernel choices are appended to `RESULT.kernel_choices.jsonl` beside it as they are timed
(`choices_stream`), so a compile killed mid-autotune leaves them for the runner.

The phases live in modules of their own, one unit each, and `JobRun` (`run`, with `main`, the
entry point `__main__` calls) runs them in order: `imports` (imports, the device check), `build`
(model and input sets), `warmup` (the eager phase, the compiled warm-up), `baseline` (a job's
baseline side), `compile` (the compile), `timing` (the timed rounds), `flops`, `accuracy`, and
`bundle` (`--bundle`, `--package`); `record` keeps RESULT.json and the phase times, `calls` how a
model is called, `gate` the gate of a process started ahead.

This module holds only what other modules (the runner, the Ray task), tests and benchmarks
import from `workers.bench`: the variables the runner sets for a job process, the files it
reads, the test hooks. It stays light: the runner imports it, and a job process's start-up is
measured (`phase_start_s`).
"""

from __future__ import annotations

from workers.bench.build import INPUT_SETS
from workers.bench.compile import STALL_ENV, choices_stream
from workers.bench.record import ERROR_CHARS, SPAWNED_AT_ENV
from workers.bench.timing import DEVICE_CALLS, PIN_TIMING_THREAD_ENV, SLOWDOWN_ENV, slowdown_hook

__all__ = [  # what other modules, tests and benchmarks import from here
    "DEVICE_CALLS",
    "ERROR_CHARS",
    "INPUT_SETS",
    "PARENT_PID_ENV",
    "PIN_TIMING_THREAD_ENV",
    "SLOWDOWN_ENV",
    "SPAWNED_AT_ENV",
    "STALL_ENV",
    "choices_stream",
    "slowdown_hook",
]

PARENT_PID_ENV = "CO_PARENT_PID"
