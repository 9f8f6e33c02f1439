"""The one statistics module: latency summaries and confidence intervals that cover the
process-to-process spread, and the verdicts and thresholds that judge them. Measurement (a job's
row), the tuner and the regression report all use it, so a "faster than" means the same thing
everywhere.

Its parts live in modules of their own, by role; this module names the public API of all of
them, so a caller imports one module (``from compiler import statistics as cstats``):

- `compiler.statistics.samples`: a row's latency samples: `summarize` (median, p10, p90),
  `percentile`, `spread`, and `split_groups` (the flat sample list cut into the groups of its
  processes).
- `compiler.statistics.intervals`: the hierarchical (two-stage) bootstrap over processes, then
  calls, and the intervals it gives: `median_interval`, `ratio_interval` (paired or unpaired),
  `paired_speedup`, and the one "faster than" rule, `beats`. Its docstring says why the
  intervals resample processes and how they stay honest for a few of them.
- `compiler.statistics.thresholds`: `Thresholds` and `load_thresholds`
  (`compiler/statistics/thresholds.json`).
- `compiler.statistics.verdicts`: what a comparison shows: `gain_verdict`, `latency_verdict`,
  `figure_verdict`, `once_per_run_verdict`, `undecided_reason`, `borrows_between`,
  `judged_figure`, `host_bound_share`, `family_level`.
- `compiler.statistics.student_t`: `t_quantile`, Student's t without scipy.
- `compiler.statistics.trust`: when a row's timing cannot be trusted, `timing_doubts` (host
  load on its cores, cores held by another job, GPU slowdowns, a host-probe outlier, a wide
  interval), `other_share_doubt` (other processes on a measurement's cores), `doubt_text`,
  `doubted_status` and the `MARK` every reader puts beside a doubted figure.
- `compiler.statistics.reference`: one eager reference per cell (`cell_reference`, pooled over
  the cell's trusted jobs) that every speedup of the cell is over.

Each name has its one definition in those modules; nothing is defined here. Only numpy is
needed; nothing here imports torch, Ray or the orchestrator.
"""

from __future__ import annotations

from compiler.statistics.intervals import (
    LEVEL,
    N_BOOT,
    Interval,
    beats,
    median_interval,
    paired_speedup,
    ratio_interval,
)
from compiler.statistics.reference import CellReference, cell_reference
from compiler.statistics.samples import (
    LatencySummary,
    percentile,
    row_groups,
    split_groups,
    spread,
    summarize,
)
from compiler.statistics.student_t import t_quantile
from compiler.statistics.thresholds import THRESHOLDS_FILE, THRESHOLDS_VERSION, Thresholds, load_thresholds
from compiler.statistics.trust import (
    MARK,
    SPREAD_DOUBT,
    UNDECIDED,
    doubt_text,
    doubted_status,
    other_share_doubt,
    timing_doubts,
)
from compiler.statistics.verdicts import (
    borrows_between,
    family_level,
    figure_verdict,
    gain_verdict,
    host_bound_share,
    judged_figure,
    latency_verdict,
    once_per_run_verdict,
    prediction_high,
    undecided_reason,
)

__all__ = [
    "LEVEL",
    "MARK",
    "SPREAD_DOUBT",
    "UNDECIDED",
    "CellReference",
    "N_BOOT",
    "THRESHOLDS_FILE",
    "THRESHOLDS_VERSION",
    "Interval",
    "LatencySummary",
    "Thresholds",
    "beats",
    "cell_reference",
    "doubt_text",
    "doubted_status",
    "borrows_between",
    "family_level",
    "figure_verdict",
    "gain_verdict",
    "host_bound_share",
    "judged_figure",
    "latency_verdict",
    "load_thresholds",
    "median_interval",
    "once_per_run_verdict",
    "other_share_doubt",
    "paired_speedup",
    "percentile",
    "prediction_high",
    "ratio_interval",
    "split_groups",
    "row_groups",
    "spread",
    "summarize",
    "t_quantile",
    "timing_doubts",
    "undecided_reason",
]
