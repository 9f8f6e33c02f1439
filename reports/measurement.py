"""How far a measurement can be trusted, as Markdown tables of result rows.

- `sweep_table` / `spread_table`: one cell measured in several separate sweeps
  (`benchmarks/noise.py`): each sweep's medians and 95% intervals, then the spread across sweeps
  and whether each sweep's interval contains the median of all of them;
- `host_speed_table`: the host dispatch probe taken after every timed round against that round's
  latency, which separates host-bound cells from GPU-bound ones;
- `phase_table` / `clock_table`: where each job's wall time went, and the GPU's clocks and state
  while it timed.

Rows are dicts with the columns of the results table (`store/schema.py`).

    python -m reports.measurement --noise noise-resnet.json noise-vit.json \\
        --phases p1.parquet p2.parquet --gpu H100 --notes-file notes.md --out docs/results/h100-measurement.md
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq

from compiler.job import PHASES
from compiler.statistics import spread

SPREAD_TARGET = 0.05
"""The reproducibility target: a cell's speedup across separate sweeps within 5%, or every interval holding the median."""

Row = dict[str, Any]


def _table(header: list[str], body: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(cells) + " |" for cells in body])


def _ci(row: Row, key: str) -> str:
    lo, hi = row.get(f"{key}_ci_low"), row.get(f"{key}_ci_high")
    return f"[{lo:.3f}, {hi:.3f}]" if lo is not None and hi is not None else "-"


def _num(value: Any, fmt: str = ".1f") -> str:
    return "-" if value is None else format(value, fmt)


def _clock(row: Row) -> str:
    if row.get("sm_clock_mean_mhz") is None:
        return "-"
    reasons = ", ".join(row.get("throttle_reasons") or []) or "none"
    return f"{row['sm_clock_mean_mhz']:.0f} / {row['sm_clock_min_mhz']} ({reasons})"


# --- several sweeps of one cell -------------------------------------------------------------------


def sweep_table(rows: list[Row]) -> str:
    body = []
    for i, r in enumerate(rows, 1):
        if r.get("status") != "ok":
            body.append([str(i), str(r.get("status")), (r.get("error") or "")[:120]] + [""] * 8)
            continue
        per = " ".join(
            f"{e:.2f}/{c:.2f}"
            for e, c in zip(r.get("eager_repeat_ms") or [], r.get("compiled_repeat_ms") or [], strict=False)
        )
        probes = r.get("host_probe_us") or []
        warm = _num(r.get("warm_compile_s"))
        body.append(
            [
                str(i),
                "ok",
                f"{r['eager_ms']:.3f} {_ci(r, 'eager')}",
                f"{r['compiled_ms']:.3f} {_ci(r, 'compiled')}",
                f"{r['speedup']:.3f} {_ci(r, 'speedup')}",
                _num(r.get("speedup_ci_between_share"), ".2f"),
                per,
                f"{min(probes):.1f}-{max(probes):.1f}" if probes else "-",
                _clock(r),
                f"{r['compile_s']:.1f} / {warm}",
                _num(r.get("wall_s"), ".0f"),
            ]
        )
    header = [
        "sweep",
        "status",
        "eager ms [95% CI]",
        "compiled ms [95% CI]",
        "speedup [95% CI]",
        "between-process share",
        "per-process eager / compiled ms",
        "host probe us (min-max)",
        "SM MHz during timing, mean / min (reasons)",
        "compile s cold / warm",
        "wall s",
    ]
    return _table(header, body)


def spread_table(rows: list[Row]) -> tuple[str, bool]:
    """The spread of each figure across sweeps; whether the cell meets the target."""
    ok = [r for r in rows if r.get("status") == "ok"]
    if len(ok) < 2:
        return "fewer than two ok sweeps: no spread", False
    body, contained = [], {}
    for label, key in (("eager median", "eager"), ("compiled median", "compiled"), ("speedup", "speedup")):
        values = [r["speedup"] if key == "speedup" else r[f"{key}_ms"] for r in ok]
        center = statistics.median(values)
        inside = sum(r[f"{key}_ci_low"] <= center <= r[f"{key}_ci_high"] for r in ok)
        contained[key] = inside == len(ok)
        body.append([label, f"{spread(values):.2%}", f"{center:.3f}", f"{inside} of {len(ok)}"])
    header = [
        f"across {len(ok)} sweeps",
        "spread (max/min - 1)",
        "median of the sweeps",
        "sweeps whose CI contains it",
    ]
    met = spread([r["speedup"] for r in ok]) <= SPREAD_TARGET or contained["speedup"]
    verdict = (
        f"Target (speedup spread <= {SPREAD_TARGET:.0%}, or every sweep's interval contains the median): "
        f"**{'met' if met else 'missed'}**."
    )
    return _table(header, body) + "\n\n" + verdict, met


# --- host speed against latency, round by round ---------------------------------------------------


def rounds_of(row: Row, rounds: int) -> list[tuple[float, float, float]]:
    """(host probe us, eager median ms, compiled median ms) of every timed round of a row."""
    probes = row.get("host_probe_us") or []
    sizes = row.get("samples_per_repeat") or [len(row.get("eager_samples_ms") or [])]
    if len(probes) != rounds * len(sizes):
        return []
    out, start = [], 0
    for p, n in enumerate(sizes):
        eager = row["eager_samples_ms"][start : start + n]
        compiled = row["compiled_samples_ms"][start : start + n]
        done = 0
        for k in range(rounds):  # the same split as compiler.measure.interleaved_samples
            m = n * (k + 1) // rounds - done
            if m:
                out.append(
                    (
                        probes[p * rounds + k],
                        statistics.median(eager[done : done + m]),
                        statistics.median(compiled[done : done + m]),
                    )
                )
            done += m
        start += n
    return out


def host_speed_table(cells: dict[str, list[Row]], rounds: int) -> str:
    """Rounds of each cell split into thirds by host speed: the latency of each third."""
    body = []
    for name, rows in cells.items():
        points = np.array([p for r in rows if r.get("status") == "ok" for p in rounds_of(r, rounds)])
        if len(points) < 6:
            continue
        corr = np.corrcoef(points.T)
        cuts = np.quantile(points[:, 0], [1 / 3, 2 / 3])
        thirds = [
            points[:, 0] <= cuts[0],
            (points[:, 0] > cuts[0]) & (points[:, 0] <= cuts[1]),
            points[:, 0] > cuts[1],
        ]
        for label, mask in zip(("fastest third", "middle third", "slowest third"), thirds, strict=True):
            sel = points[mask]
            body.append(
                [
                    name,
                    label,
                    str(len(sel)),
                    f"{np.median(sel[:, 0]):.1f}",
                    f"{np.median(sel[:, 1]):.3f}",
                    f"{np.median(sel[:, 2]):.3f}",
                    f"{np.median(sel[:, 1] / sel[:, 2]):.3f}",
                    f"{corr[0, 1]:.2f} / {corr[0, 2]:.2f}" if label == "fastest third" else "",
                ]
            )
    header = [
        "cell",
        "rounds by host speed",
        "rounds",
        "host probe us/op",
        "eager ms",
        "compiled ms",
        "eager / compiled",
        "correlation of probe with eager / compiled",
    ]
    return _table(header, body)


# --- where a job's time goes ----------------------------------------------------------------------


def phase_table(rows: list[Row]) -> str:
    """Each phase's seconds and share of the job's wall time, summed over the job's processes."""
    body = []
    for r in sorted(rows, key=lambda r: (r.get("batch_size") or 0, r.get("model") or "")):
        wall = r.get("wall_s") or r.get("subprocess_s")
        if not wall:
            continue
        cells = [
            f"{r.get('model')} bs{r.get('batch_size')} {r.get('config')}",
            str(r.get("job_processes") or "-"),
            f"{wall:.1f}",
        ]
        known = 0.0
        for phase in PHASES:
            value = r.get(f"phase_{phase}_s")
            known += value or 0.0
            cells.append("-" if value is None else f"{value:.1f} ({value / wall:.0%})")
        rest = wall - known
        cells.append(f"{rest:.1f} ({rest / wall:.0%})")
        cells.append(_num(r.get("job_efficiency"), ".0%") if r.get("job_efficiency") is not None else "-")
        body.append(cells)
    header = ["job", "processes", "wall s", *PHASES, "other (exit when not a column, dispatch)", "efficiency"]
    return _table(header, body)


def clock_table(rows: list[Row]) -> str:
    body = []
    for r in sorted(rows, key=lambda r: (r.get("batch_size") or 0, r.get("model") or "")):
        body.append(
            [
                f"{r.get('model')} bs{r.get('batch_size')} {r.get('config')}",
                _num(r.get("sm_clock_mhz"), "d"),
                f"{_num(r.get('sm_clock_mean_mhz'), '.0f')} / {_num(r.get('sm_clock_min_mhz'), 'd')} / "
                f"{_num(r.get('sm_clock_max_mhz'), 'd')}",
                _num(r.get("mem_clock_mean_mhz"), ".0f"),
                f"{_num(r.get('power_mean_w'), '.0f')} / {_num(r.get('power_max_w'), '.0f')}",
                _num(r.get("gpu_temp_max_c"), "d"),
                ", ".join(r.get("throttle_reasons") or []) or "none",
                _num(r.get("clock_samples"), "d"),
                str(r.get("cpu_affinity") or "-"),
                str(r.get("timing_cpus") or "-"),
                _num(r.get("host_steal_share"), ".2%"),
            ]
        )
    header = [
        "job",
        "SM MHz at job start",
        "SM MHz during timing, mean / min / max",
        "memory MHz",
        "power W mean / max",
        "temp C max",
        "clock-event reasons",
        "samples",
        "cores",
        "timing thread on",
        "steal",
    ]
    return _table(header, body)


# --- the document ---------------------------------------------------------------------------------


def load_noise(path: str | Path) -> tuple[dict[str, Any], dict[str, list[Row]]]:
    """What `benchmarks/noise.py --save` wrote: its arguments and the rows of each cell."""
    data = json.loads(Path(path).read_text())
    return data.get("args", {}), data["cells"]


def render(
    *,
    gpu: str,
    noise: list[tuple[dict[str, Any], dict[str, list[Row]]]],
    phases: list[Row],
    notes: str = "",
) -> str:
    parts = [f"# Numbers that hold from process to process: {gpu}"]
    if notes:
        parts.append(notes.rstrip("\n"))
    cells: dict[str, list[Row]] = {}
    rounds = 10
    for args, by_cell in noise:
        rounds = args.get("rounds", rounds)
        for name, rows in by_cell.items():
            cells[name] = rows
            sweeps = f"{len(rows)} separate sweeps" if len(rows) > 1 else "one sweep"
            parts.append(f"## {name}: {sweeps} of {args.get('repeats', '?')} processes")
            parts.append(sweep_table(rows))
            parts.append(spread_table(rows)[0])
    if cells:
        parts.append("## Host speed and latency, round by round")
        parts.append(host_speed_table(cells, rounds))
    if phases:
        parts.append("## Where a job's time goes")
        parts.append(phase_table(phases))
        parts.append("## Clocks and state during timing")
        parts.append(clock_table(phases))
    return "\n\n".join(parts) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m reports.measurement", description=__doc__.split("\n")[0])
    parser.add_argument(
        "--noise", nargs="*", default=[], help="JSON files written by benchmarks/noise.py --save"
    )
    parser.add_argument(
        "--phases", nargs="*", default=[], help="result .parquet files (benchmarks/transfer/pack.py)"
    )
    parser.add_argument("--gpu", required=True, help="GPU name for the title, e.g. H100")
    parser.add_argument("--notes-file", help="Markdown placed under the title (commands, versions, findings)")
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    rows = [r for f in args.phases for r in pq.read_table(f).to_pylist()]
    notes = Path(args.notes_file).read_text() if args.notes_file else ""
    text = render(gpu=args.gpu, noise=[load_noise(f) for f in args.noise], phases=rows, notes=notes)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(text)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
