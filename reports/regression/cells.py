"""What comparing two runs finds: one `CellChange` per cell (its figures on both sides, its verdict
and the reasons for it) and the `Comparison` of them all, with its counts, its cross-GPU view and
its JSON form."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import asdict, dataclass, field
from typing import Any

from compiler import statistics as cstats

VERDICTS = ("regression", "watch", "improvement", "unchanged", "new", "missing")
"""`watch`: over a threshold, but not decided: too few processes per side
(`statistics.undecided_reason`), or in history mode not yet on enough consecutive runs."""
ENV_KEYS = ("torch_version", "triton_version", "cuda_version", "driver_version", "device_name")


@dataclass
class CellChange:
    hardware: str
    model: str
    batch_size: int
    dtype: str
    config: str
    verdict: str = "unchanged"
    reasons: list[str] = field(default_factory=list)
    status: tuple[str | None, str | None] = (None, None)
    compiled_ms: tuple[float | None, float | None] = (None, None)
    latency_ratio: float | None = None
    latency_ci: tuple[float | None, float | None] = (None, None)
    speedup: tuple[float | None, float | None] = (None, None)
    compile_s: tuple[float | None, float | None] = (None, None)
    peak_mem_bytes: tuple[int | None, int | None] = (None, None)
    graph_breaks: tuple[int | None, int | None] = (None, None)
    recompiles: tuple[int | None, int | None] = (None, None)
    device_ms: tuple[float | None, float | None] = (None, None)
    """Compiled device time per call (GPU rows), baseline -> current."""
    device_ratio: float | None = None
    device_ci: tuple[float | None, float | None] = (None, None)
    host_bound_share: tuple[float | None, float | None] = (None, None)
    judged_on: str | None = None
    """The latency figure the verdict rests on: "wall" or "device" (`statistics.judged_figure`)."""
    processes: tuple[int, int] = (0, 0)
    """Processes whose samples each side's latency interval rests on, baseline and current."""

    @property
    def name(self) -> str:
        return f"{self.hardware}/{self.model}/bs{self.batch_size}/{self.dtype}/{self.config}"

    regressed_on: list[str] = field(default_factory=list)
    """What regressed: latency, compile_time, memory, status, graph_breaks, recompiles."""

    by_figure: dict[str, str] = field(default_factory=dict)
    """The verdict each figure gave on its own where it was not unchanged: latency,
    compile_time, memory, status, graph_breaks, recompiles."""

    def note(self, verdict: str, reason: str, what: str = "") -> None:
        self.reasons.append(f"{verdict}: {reason}" if verdict in ("regression", "improvement") else reason)
        if what:
            self.by_figure[what] = verdict
        if verdict == "regression":
            self.regressed_on.append(what)
        if (
            verdict == "regression"
            or (verdict == "watch" and self.verdict in ("unchanged", "improvement"))
            or (verdict == "improvement" and self.verdict == "unchanged")
        ):
            self.verdict = verdict

    @property
    def undecided(self) -> bool:
        """A `watch` for too few processes per side (`statistics.undecided_reason`) or a doubted
        timing (`statistics.timing_doubts`)."""
        return self.verdict == "watch" and any(r.startswith("undecided:") for r in self.reasons)


@dataclass
class Comparison:
    cells: list[CellChange]
    environment: dict[str, dict[str, tuple[list[str], list[str]]]]
    """Per hardware class, per versions key: (baseline values, current values) where they differ."""
    thresholds: cstats.Thresholds
    trend: dict[str, list[tuple[str, float | None]]] = field(default_factory=dict)
    """History mode: per cell name, (run label, speedup over eager or None where not ok) for every
    run compared, oldest first (the HTML report's trend charts)."""
    trend_ci: dict[str, list[tuple[float | None, float | None]]] = field(default_factory=dict)
    """History mode: per cell name, beside `trend`, each run's 95% interval of that speedup (low,
    high; None where the run has none): the band of the cell's trend chart."""

    def counts(self) -> dict[str, int]:
        found = dict.fromkeys(VERDICTS, 0)
        for c in self.cells:
            found[c.verdict] += 1
        return found

    def undecided(self) -> int:
        """Cells left `watch` because a side had too few processes (the fix: `measure.repeats`)."""
        return sum(c.undecided for c in self.cells)

    def undecided_line(self) -> str:
        n = self.undecided()
        if not n:
            return ""
        doubted = sum(c.undecided and any("timing doubted" in r for r in c.reasons) for c in self.cells)
        marked = (
            f" ({doubted} of them {cstats.MARK}: a timing doubted, listed with its reasons)"
            if doubted
            else ""
        )
        return (
            f"{n} cell{'s' if n != 1 else ''} left undecided (watch){marked}: a figure measured once a run (a latency "
            f"from one process per cell, a cold compile time) cannot show how much it moves between runs; "
            f"set measure.repeats: 3 in the sweep file for latencies, and compare against a window of runs "
            f"(--history, nightly) for compile times"
        )

    def by_model(self) -> dict[str, dict[str, list[str]]]:
        """The cross-GPU view: per model, the hardware classes where some cell regressed and
        where some improved (a regression on one class only is the finding to look at)."""
        view: dict[str, dict[str, set[str]]] = defaultdict(
            lambda: {"regression": set(), "improvement": set()}
        )
        for c in self.cells:
            if c.verdict in ("regression", "improvement"):
                view[c.model][c.verdict].add(c.hardware)
        return {m: {k: sorted(v) for k, v in d.items()} for m, d in sorted(view.items())}

    def to_json(self) -> dict[str, Any]:
        return {
            "format": 1,
            "thresholds": asdict(self.thresholds),
            "counts": self.counts(),
            "undecided": self.undecided(),
            "by_model": self.by_model(),
            "environment": self.environment,
            "trend": self.trend,
            "trend_ci": self.trend_ci,
            "cells": [{"name": c.name, **asdict(c)} for c in self.cells],
        }
