"""When a change counts: `Thresholds`, read by `load_thresholds` from a versioned JSON file
(`thresholds.json` beside this module by default; an older version's file is read with the keys
it lacks defaulted). The regression report's thresholds, the latency change the tuner's verdicts
count (`compiler.statistics.verdicts`) and the accuracy budgets of `compiler.accuracy`. Part of
the one statistics module (`compiler.statistics`).

Standard library only."""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass
from pathlib import Path

THRESHOLDS_FILE = Path(__file__).with_name("thresholds.json")
THRESHOLDS_ENV = "ORCHESTRATE_THRESHOLDS"
"""A site's own thresholds file, read instead of `THRESHOLDS_FILE` where no file is named (by every
process of a run: the driver, the tuner, the reports). The test suite points it at a file that
doubts no timing, so that a test about something else does not depend on an idle machine."""
THRESHOLDS_VERSION = 4
_MAX_THRESHOLDS_BYTES = 65536
_ADDED_IN_V2 = {"host_bound_share": 0.25, "min_processes": 2, "noise_processes": 3}
"""Keys version 2 added, with the values a version-1 file is read with."""
_ADDED_IN_V3 = {
    "accuracy_tf32": 1e-2,
    "accuracy_fp16": 1e-2,
    "accuracy_bf16": 5e-2,
    "accuracy_stock_factor": 2.0,
    "accuracy_floor": 1e-5,
    "accuracy_min_spread": 1e-2,
    "accuracy_min_sensitivity": 1e-2,
    "accuracy_max_sensitivity": 100.0,
}
"""Keys version 3 added (the accuracy budgets of `compiler.accuracy`), with the values an older
file is read with."""
_ADDED_IN_V4 = {
    "doubt_other_share": 0.25,
    "doubt_load_per_core": 2.0,
    "doubt_probe_ratio": 3.0,
    "doubt_interval_ratio": 4.0,
}
"""Keys version 4 added (when a row's timing is doubted, `compiler.statistics.trust`), with the
values an older file is read with."""


@dataclass(frozen=True)
class Thresholds:
    """When a change between two runs counts, from a versioned JSON file (`thresholds.json`
    beside this module by default): the regression report's only thresholds."""

    version: int
    level: float
    """Confidence level of the latency intervals."""
    latency_change: float
    """A cell's compiled latency regressed when the interval of current / baseline lies wholly
    above 1 + this (improved: wholly below 1 / (1 + this)). The interval covers the spread
    between processes, so two runs of one stack (an A/A pair) do not regress."""
    compile_time_change: float
    """Cold compile time regressed when it grew by more than this fraction..."""
    compile_time_floor_s: float
    """...and by more than this many seconds (a one-number figure: no interval)."""
    memory_change: float
    memory_floor_mb: float
    window_runs: int
    """History mode: the baseline pools this many previous runs."""
    consecutive: int
    """History mode: a latency, compile-time or memory regression must hold on this many runs in a
    row (each against its own window) before it counts (PyTorch's dashboard: 2)."""
    host_bound_share: float = 0.25
    """A GPU cell is host-bound when its device sat idle for at least this share of the wall
    latency (1 - device time / wall time); it is then judged on device time (`judged_figure`)."""
    min_processes: int = 2
    """A latency verdict needs at least this many processes per cell on each side: one process's
    interval cannot cover the spread between processes (`undecided_reason`)."""
    noise_processes: int = 3
    """History mode: a side with too few processes is decided anyway when the other side pools at
    least this many (runs of the window), whose spread estimates the process noise it lacks."""
    accuracy_tf32: float = 1e-2
    """The `tf32` accuracy budget: max relative error against fp64 (`compiler.accuracy`)."""
    accuracy_fp16: float = 1e-2
    """The `fp16` budget."""
    accuracy_bf16: float = 5e-2
    """The `bf16` budget."""
    accuracy_stock_factor: float = 2.0
    """The `stock` budget: at most this many times the stock policy's own eager error against fp64
    on the cell..."""
    accuracy_floor: float = 1e-5
    """...and never less than this (an error below it is float32 rounding, not a precision's)."""
    accuracy_min_spread: float = 1e-2
    """Random weights: an output whose (max - min) / max |x| is below this, or below the budget's
    tolerance, is too constant to judge a precision (an error the budget allows could erase all
    of its variation, and normalized by its magnitude looks small): undetermined."""
    accuracy_min_sensitivity: float = 1e-2
    """Random weights: outputs that move less than this fraction of a tiny relative input change
    barely depend on the inputs (biases carry them), so no precision's error reaches them:
    undetermined."""
    accuracy_max_sensitivity: float = 100.0
    """Random weights: outputs that amplify a relative input change of the budget's rounding more
    than this many times are ill-conditioned (a saturated or discontinuous head); their error says
    more of the random weights than of the arithmetic: undetermined."""
    confirm_extend_gain: float = 1.05
    """A tune extends a confirmation (more fresh processes, pooled with the first ones) where a
    candidate measured at least this much faster than what it must beat, but its interval did not
    lie above 1 (`orchestrator.tune.search.run_extend`): few processes of a launch-bound cell give
    wide intervals."""
    doubt_other_share: float = 0.25
    """A row's timing is doubted where other processes took more than this share of the job's
    cores while one of its processes timed (`host_other_share`; an idle host gives a few percent,
    a busy loop on each core about 0.5): `compiler.statistics.trust`."""
    doubt_load_per_core: float = 2.0
    """...or, for a row without `host_other_share` (written before schema 16), where the host's
    1-minute load when a process began timing exceeded this many per core the job ran on."""
    doubt_probe_ratio: float = 3.0
    """...or where the host dispatch probe after one timed round was this many times slower than
    after another (the host slowed down mid-measurement)."""
    doubt_interval_ratio: float = 4.0
    """...or where the speedup interval's high end is more than this many times its low end (the
    samples spread too widely for the figure to mean anything)."""


def load_thresholds(path: str | Path | None = None) -> Thresholds:
    """The thresholds in `path` (default: the file `ORCHESTRATE_THRESHOLDS` names, else
    `thresholds.json` here); a bad file raises ValueError naming the file and the key."""
    if path is None:
        path = os.environ.get(THRESHOLDS_ENV) or THRESHOLDS_FILE
    path = Path(path)
    try:
        if not path.is_file():  # a FIFO or device would block or never end
            raise ValueError("not a regular file")
        with path.open("rb") as f:
            raw = f.read(_MAX_THRESHOLDS_BYTES + 1)
        if len(raw) > _MAX_THRESHOLDS_BYTES:
            raise ValueError(f"over {_MAX_THRESHOLDS_BYTES} bytes, far more than a thresholds file holds")
        data = json.loads(raw)
    except RecursionError:
        raise ValueError(f"{path}: cannot read the thresholds: nested too deeply") from None
    except (OSError, ValueError) as exc:
        raise ValueError(f"{path}: cannot read the thresholds: {exc}") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a JSON object of thresholds, got {type(data).__name__}")
    if data.get("version") == 1:
        data = {**_ADDED_IN_V2, **data, "version": 2}
    if data.get("version") == 2:
        data = {**_ADDED_IN_V3, **data, "version": 3}
    if data.get("version") == 3:
        data = {**_ADDED_IN_V4, **data, "version": THRESHOLDS_VERSION}
    names = [f.name for f in dataclasses.fields(Thresholds)]
    missing = [n for n in names if n not in data]
    unknown = sorted(set(data) - set(names))
    if missing or unknown:
        raise ValueError(f"{path}: missing keys {missing}, unknown keys {unknown}; expected {names}")
    if data["version"] != THRESHOLDS_VERSION:
        raise ValueError(f"{path}: version {data['version']!r}; this code reads version {THRESHOLDS_VERSION}")
    for name in names[1:]:
        value = data[name]
        if not isinstance(value, (int, float)) or isinstance(value, bool) or value < 0:
            raise ValueError(f"{path}: {name} must be a non-negative number, got {value!r}")
    for name in ("window_runs", "consecutive", "min_processes", "noise_processes"):
        if not isinstance(data[name], int) or isinstance(data[name], bool) or data[name] < 1:
            raise ValueError(f"{path}: {name} must be a positive integer, got {data[name]!r}")
    for name in ("level", "host_bound_share", "accuracy_tf32", "accuracy_fp16", "accuracy_bf16"):
        if not 0 < data[name] < 1:
            raise ValueError(f"{path}: {name} must be between 0 and 1, got {data[name]!r}")
    return Thresholds(**data)
