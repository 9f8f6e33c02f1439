"""Longest-expected-first ordering of a class's job queue.

Starting the longest jobs first shortens the makespan (a long job started last keeps one slot
busy while the others idle). Expected cost comes from earlier runs in the same output
directory (and in any ``--history`` directories), matched by hardware, model, config and batch size, then by model and config; with
no history, from a heuristic: compile mode (autotuning compiles for minutes), batch size, and
whether the architecture is reduced by overrides.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable

from compiler.job import Job
from store.fields import HARNESS_ERROR
from store.schema import read_results
from store.storage import Target, resolve

MODE_COST = {"max-autotune": 20.0, "max-autotune-no-cudagraphs": 15.0, "reduce-overhead": 1.1}


def heuristic_cost(job: Job) -> float:
    mode = job.config.mode
    if job.config.options.get("max_autotune"):
        mode = "max-autotune"
    size = 0.2 if job.model.overrides else 1.0
    return MODE_COST.get(mode or "", 1.0) * size * (1.0 + math.log2(job.batch_size) / 4)


def job_seconds(row: dict) -> float | None:
    """How long a job held its slot: its `wall_s` (dispatch to result, less any wait for a GPU
    behind another job), else the sum of its processes' lifetimes (`subprocess_s`), which with
    processes started ahead also counts their waits at the gate, up to the whole run before them."""
    for key in ("wall_s", "subprocess_s"):
        if isinstance(row.get(key), (int, float)):
            return float(row[key])
    return None


class History:
    """Earlier rows of an output directory: which jobs have one, and the mean time a job held its
    slot (`job_seconds`) by (hardware, model_id, config, batch) and by (model_id, config)."""

    def __init__(self, rows: Iterable[dict], timing_only: Iterable[dict] = ()):
        exact: dict[tuple, list[float]] = defaultdict(list)
        loose: dict[tuple, list[float]] = defaultdict(list)
        self.job_ids: set[str] = set()
        """Every job that has a result row in `rows`: any status but `harness_error`, a failure of
        the orchestrator's own environment that `--resume` runs again (`timing_only` rows excluded)."""
        self.sweeps: set[str] = set()
        """The sweeps the rows of `rows` belong to (their `sweep` column)."""
        self.recorded = 0
        """How many rows `rows` holds, harness failures included."""
        for own, r in [(True, r) for r in rows] + [(False, r) for r in timing_only]:
            if own and r.get("job_id"):
                self.recorded += 1
                self.sweeps.add(r.get("sweep") or "")
                if r.get("status") != HARNESS_ERROR:
                    self.job_ids.add(r["job_id"])
            took = job_seconds(r)
            if took is None:
                continue
            exact[(r["hardware"], r["model_id"], r["config"], r["batch_size"])].append(took)
            loose[(r["model_id"], r["config"])].append(took)
        self.exact = {k: sum(v) / len(v) for k, v in exact.items()}
        self.loose = {k: sum(v) / len(v) for k, v in loose.items()}

    @classmethod
    def from_output(cls, out_dir: Target, history_dirs: Iterable[Target] = ()) -> History:
        """Rows of `out_dir`, plus timings (only) from other output directories (paths or URIs)."""
        columns = [
            "job_id",
            "sweep",
            "status",
            "hardware",
            "model_id",
            "config",
            "batch_size",
            "subprocess_s",
            "wall_s",
        ]
        extra: list[dict] = []
        for other in history_dirs:
            loc = resolve(other)
            if not loc.is_dir():
                raise FileNotFoundError(f"--history {loc}: no such output directory")
            extra += read_results(loc, columns=columns).to_pylist()
        return cls(read_results(out_dir, columns=columns).to_pylist(), extra)

    def expected_s(self, job: Job) -> float | None:
        key = (job.hardware, job.model.id, job.config.name, job.batch_size)
        if key in self.exact:
            return self.exact[key]
        return self.loose.get((job.model.id, job.config.name))


def longest_first(jobs: list[Job], history: History) -> list[Job]:
    """Jobs with a measured history first, longest first; then the rest by heuristic.

    Measured seconds and heuristic units are not comparable, so the two groups are not mixed;
    a job that took long before is the surest bet to take long again."""
    measured = [(history.expected_s(j), j) for j in jobs]
    known = sorted(((s, j) for s, j in measured if s is not None), key=lambda sj: -sj[0])
    unknown = sorted((j for s, j in measured if s is None), key=lambda j: -heuristic_cost(j))
    return [j for _, j in known] + unknown
