"""Two runs compared cell by cell: what got slower, on which hardware class, by how much (with
its interval) and why.

A cell is (hardware class, model, batch size, precision, config); a run's job ids include its
software stack, so cells are matched on those five names, not on ids. For every cell in either
run: the status change, the compiled-latency ratio current / baseline with its interval (from
every timed sample, grouped by process: `compiler.statistics.ratio_interval`, unpaired), the
speedup change, the cold compile time and peak memory changes, graph breaks and recompiles with
the reasons that are new, and the autotune winners that changed (from `kernel_choices`, where
both runs have them). Each becomes a verdict (regression, improvement, unchanged, new, missing)
with its reasons in words. The decisions and their thresholds are `compiler.statistics`'s
(`latency_verdict`, `figure_verdict`, `thresholds.json`); nothing here decides on its own.
"""

from __future__ import annotations

import json
import re
from collections import defaultdict
from dataclasses import asdict, dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from compiler import statistics as cstats
from store.rows import latest_rows

KEY = ("hardware", "model", "batch_size", "dtype", "config")
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
        """A `watch` for too few processes per side (`statistics.undecided_reason`)."""
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
        return (
            f"{n} cell{'s' if n != 1 else ''} left undecided (watch): a figure measured once a run (a latency "
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
            "cells": [{"name": c.name, **asdict(c)} for c in self.cells],
        }


def _groups(row: dict[str, Any]) -> list[list[float]]:
    return cstats.split_groups(row.get("compiled_samples_ms") or [], row.get("samples_per_repeat"))


def _device_groups(row: dict[str, Any]) -> list[list[float]]:
    return cstats.split_groups(
        row.get("compiled_device_samples_ms") or [], row.get("device_samples_per_repeat")
    )


def _first_line(text: str | None) -> str:
    return (text or "").strip().splitlines()[0][:200] if (text or "").strip() else ""


def _latest(table: pa.Table) -> dict[tuple, dict[str, Any]]:
    return latest_rows(table.to_pylist(), lambda r: tuple(r[k] for k in KEY))


def _winners(choices: pa.Table | None) -> dict[tuple, dict[tuple, str]]:
    """Per cell job id: (op, input shapes) -> the winning candidate's name."""
    found: dict[str, dict[tuple, str]] = defaultdict(dict)
    if choices is None or choices.num_rows == 0:
        return found
    for r in choices.filter(pc.equal(choices["is_winner"], True)).to_pylist():
        found[r["job_id"]][(r["op"], tuple(r["input_shapes"] or ()))] = r["choice"]
    return found


def compare(
    current: pa.Table,
    baseline: pa.Table,
    thresholds: cstats.Thresholds | None = None,
    current_choices: pa.Table | None = None,
    baseline_choices: pa.Table | None = None,
    window: list[pa.Table] = (),
) -> Comparison:
    """`current` against `baseline`; the timed samples of the same cell in the `window` runs (older
    ones) join the baseline's in the latency interval (a multi-run baseline)."""
    t = thresholds or cstats.load_thresholds()
    cur, base = _latest(current), _latest(baseline)
    pooled: dict[tuple, list[list[float]]] = defaultdict(list)
    pooled_device: dict[tuple, list[list[float]]] = defaultdict(list)
    pooled_compile: dict[tuple, list[float]] = defaultdict(list)
    for table in window:
        for key, row in _latest(table).items():
            if row["status"] == "ok":
                pooled[key] += _groups(row)
                pooled_device[key] += _device_groups(row)
                pooled_compile[key].append(row.get("compile_s"))
    cur_win, base_win = _winners(current_choices), _winners(baseline_choices)
    cells = []
    for key in sorted(set(cur) | set(base), key=lambda k: tuple(map(str, k))):
        c = CellChange(*key)
        now, before = cur.get(key), base.get(key)
        if before is None:
            c.verdict = "new"
            c.reasons.append(f"not in the baseline; now {now['status']}")
        elif now is None:
            c.verdict = "missing"
            c.reasons.append(f"not in this run; was {before['status']}")
        else:
            older = (pooled.get(key, []), pooled_device.get(key, []), pooled_compile.get(key, []))
            _compare_cell(c, now, before, t, *older)
            _compare_winners(c, cur_win.get(now["job_id"], {}), base_win.get(before["job_id"], {}))
        cells.append(c)
    return Comparison(cells, _environment(current, baseline), t)


def _compare_cell(
    c: CellChange,
    now: dict[str, Any],
    before: dict[str, Any],
    t: cstats.Thresholds,
    older: list[list[float]],
    older_device: list[list[float]] = (),
    older_compile: list[float] = (),
) -> None:
    c.status = (before["status"], now["status"])
    for name in ("compiled_ms", "speedup", "compile_s", "peak_mem_bytes", "graph_breaks", "recompiles"):
        setattr(c, name, (before.get(name), now.get(name)))
    c.device_ms = (before.get("compiled_device_ms"), now.get("compiled_device_ms"))
    c.host_bound_share = (before.get("compiled_host_bound_share"), now.get("compiled_host_bound_share"))
    if "unsupported" in (before["status"], now["status"]):  # a cell not run, never a regression
        if now["status"] != before["status"]:
            c.reasons.append(f"{before['status']} -> {now['status']}: {_first_line(now.get('error'))}")
        return
    if before["status"] == "ok" and now["status"] != "ok":
        c.note("regression", f"ok -> {now['status']}: {_first_line(now.get('error'))}", "status")
        return
    if before["status"] != "ok" and now["status"] == "ok":
        c.note("improvement", f"{before['status']} -> ok")
    elif now["status"] != "ok":
        if now["status"] != before["status"]:
            c.reasons.append(f"{before['status']} -> {now['status']}: {_first_line(now.get('error'))}")
        return
    if before["status"] != "ok":
        return
    _compare_latency(c, now, before, t, older, list(older_device))
    _compare_figures(c, now, before, t, list(older_compile))


def _compare_latency(
    c: CellChange,
    now: dict[str, Any],
    before: dict[str, Any],
    t: cstats.Thresholds,
    older: list[list[float]],
    older_device: list[list[float]],
) -> None:
    """The latency verdict: wall time always, device time too where the cell is host-bound
    (`statistics.judged_figure`); a regression on either counts, and a comparison with too few
    processes per side is only a `watch` (`statistics.undecided_reason`)."""
    current, reference = _groups(now), _groups(before) + older
    history = bool(older)
    undecided = cstats.undecided_reason(len(current), len(reference), t, history=history)
    borrow = history and undecided is None and cstats.borrows_between(len(current), len(reference), t)
    c.processes = (len(reference), len(current))
    dev_now, dev_ref = _device_groups(now), _device_groups(before) + older_device
    shares = [s for s in c.host_bound_share if s is not None]
    figure, why = cstats.judged_figure(max(shares) if shares and dev_now and dev_ref else None, t)
    c.judged_on = figure
    # a host-bound cell is tested on two figures: each at the level that keeps the cell's own
    # false-alarm rate at t.level (Bonferroni)
    level = cstats.family_level(t.level, 2 if figure == "device" else 1)
    wall = cstats.ratio_interval(current, reference, paired=False, level=level, borrow_between=borrow)
    if not wall.processes:
        return
    c.latency_ratio, c.latency_ci = wall.estimate, (wall.low, wall.high)
    device = None
    if dev_now and dev_ref:
        device = cstats.ratio_interval(dev_now, dev_ref, paired=False, level=level, borrow_between=borrow)
        c.device_ratio, c.device_ci = device.estimate, (device.low, device.high)
    verdicts = {"wall": cstats.latency_verdict(wall, t)}
    if figure == "device":
        verdicts["device"] = cstats.latency_verdict(device, t)
    found = [v for v in ("regression", "improvement") if v in verdicts.values()]
    against = f" against {len(reference)} processes of the window" if older else ""
    text = (
        f"compiled {before['compiled_ms']:.3f} -> {now['compiled_ms']:.3f} ms, "
        f"x{wall.estimate:.3f} [{wall.low:.3f}, {wall.high:.3f}] ({wall.scope}){against}"
    )
    if device is not None:
        text += (
            f"; device {c.device_ms[0]:.3f} -> {c.device_ms[1]:.3f} ms, "
            f"x{device.estimate:.3f} [{device.low:.3f}, {device.high:.3f}]"
        )
    if not found:
        return
    verdict = found[0]
    shown_by = [f for f, v in verdicts.items() if v == verdict]
    if device is not None:  # which figure, where there was a choice
        text += f"; judged on {why}" + (
            "" if figure in shown_by else f"; shown by the {' and '.join(shown_by)} time"
        )
    if undecided:
        c.note("watch", f"{undecided} ({verdict} if decided: {text})", "latency")
    else:
        c.note(verdict, text, "latency")


def _compare_figures(
    c: CellChange,
    now: dict[str, Any],
    before: dict[str, Any],
    t: cstats.Thresholds,
    older_compile: list[float] = (),
) -> None:
    verdict, why = cstats.once_per_run_verdict(
        now.get("compile_s"),
        [*older_compile, before.get("compile_s")],
        t.compile_time_change,
        t.compile_time_floor_s,
        t,
    )
    if verdict != "unchanged":
        text = f"cold compile {before['compile_s']:.1f} -> {now['compile_s']:.1f} s"
        c.note(
            verdict, f"undecided: {text}: {why}" if verdict == "watch" else f"{text}, {why}", "compile_time"
        )
    mb = [None if v is None else v / 2**20 for v in (now.get("peak_mem_bytes"), before.get("peak_mem_bytes"))]
    verdict = cstats.figure_verdict(mb[0], mb[1], t.memory_change, t.memory_floor_mb)
    if verdict != "unchanged":
        c.note(verdict, f"peak memory {mb[1]:.0f} -> {mb[0]:.0f} MiB", "memory")
    for name, reasons in (("graph_breaks", "break_reasons"), ("recompiles", "recompile_reasons")):
        was, is_ = before.get(name) or 0, now.get(name) or 0
        new = sorted(set(now.get(reasons) or []) - set(before.get(reasons) or []))
        label = name.replace("_", " ")
        if is_ > was:
            c.note("regression", f"{label} {was} -> {is_}" + (f": {'; '.join(new)}" if new else ""), name)
        elif is_ < was:
            c.note("improvement", f"{label} {was} -> {is_}")


NOISY = ("latency", "compile_time", "memory")
"""Regressions one noisy run can show: in history mode they must hold on consecutive runs."""


def compare_history(
    runs: list[pa.Table],
    thresholds: cstats.Thresholds | None = None,
    choices: list[pa.Table | None] | None = None,
    labels: list[str] | None = None,
) -> Comparison:
    """The newest of `runs` (oldest first) against the ones before it, in the manner of PyTorch's
    dashboard: the last `consecutive` runs are each compared with the same reference, the
    `window_runs` runs before them (the newest of those as the baseline, the samples of all of
    them pooled), and a latency, compile-time or memory regression of the newest run counts only
    if every one of those `consecutive` runs shows it (a step change is caught on its second
    night, a single noisy night is not); a status, graph-break or recompile regression counts at
    once. With too few runs for a reference the newest is compared with the one before it and a
    noisy regression is only a "watch". Each reason says which rule fired."""
    t = thresholds or cstats.load_thresholds()
    if len(runs) < 2:
        raise ValueError("history mode needs at least two runs")
    choices = list(choices or [None] * len(runs))
    k = t.consecutive
    reference = list(range(max(0, len(runs) - k - t.window_runs), max(0, len(runs) - k)))
    rule = f"the last {k} runs against the {len(reference)} runs before them"

    def against_reference(i: int) -> Comparison:
        if not reference:
            return compare(runs[i], runs[i - 1], t, choices[i], choices[i - 1])
        base = reference[-1]
        window = [runs[j] for j in reference[:-1]]
        return compare(runs[i], runs[base], t, choices[i], choices[base], window=window)

    newest = against_reference(len(runs) - 1)
    others = [against_reference(i) for i in range(len(runs) - k, len(runs) - 1)] if reference else []
    for cell in newest.cells:
        if cell.verdict != "regression":
            continue
        if not all(what in NOISY for what in cell.regressed_on):
            cell.reasons.append("rule fired: a failure, graph break or recompile counts at once")
            continue
        held = [any(e.name == cell.name and e.verdict == "regression" for e in comp.cells) for comp in others]
        if not reference:
            cell.verdict = "watch"
            cell.reasons.append(
                f"watch: {len(runs)} runs are too few for the {k}-run rule; against the previous run only"
            )
        elif not all(held):
            cell.verdict = "watch"
            cell.reasons.append(f"watch: over the threshold on {1 + sum(held)} of the last {k} runs ({rule})")
        else:
            cell.reasons.append(f"rule fired: {rule}, every one over the threshold")
    newest.trend = _trend(runs, labels or [f"run {i + 1}" for i in range(len(runs))])
    return newest


def _trend(runs: list[pa.Table], labels: list[str]) -> dict[str, list[tuple[str, float | None]]]:
    """Per cell name, each run's speedup over eager (None where the cell was not ok)."""
    per_run = [_latest(table) for table in runs]
    trend: dict[str, list[tuple[str, float | None]]] = {}
    for key in sorted({k for rows in per_run for k in rows}, key=lambda k: tuple(map(str, k))):
        name = CellChange(*key).name
        trend[name] = [
            (label, rows[key]["speedup"] if key in rows and rows[key]["status"] == "ok" else None)
            for label, rows in zip(labels, per_run, strict=True)
        ]
    return trend


def _compare_winners(c: CellChange, now: dict[tuple, str], before: dict[tuple, str]) -> None:
    changed = [(op, before[op], now[op]) for op in sorted(set(now) & set(before)) if now[op] != before[op]]
    for (op, shapes), was, is_ in changed[:5]:
        c.reasons.append(f"autotune winner for {op} ({', '.join(shapes)}): {was} -> {is_}")
    if len(changed) > 5:
        c.reasons.append(f"... and {len(changed) - 5} more autotune winner changes")


def _environment(current: pa.Table, baseline: pa.Table) -> dict[str, dict[str, tuple[list[str], list[str]]]]:
    def values(table: pa.Table) -> dict[str, dict[str, set[str]]]:
        found: dict[str, dict[str, set[str]]] = defaultdict(lambda: defaultdict(set))
        for r in table.select(
            [k for k in ("hardware", *ENV_KEYS, "sm_clock_mean_mhz") if k in table.column_names]
        ).to_pylist():
            for k in ENV_KEYS:
                if r.get(k):
                    found[r["hardware"]][k].add(str(r[k]))
            if r.get("sm_clock_mean_mhz"):
                found[r["hardware"]]["sm_clock_mean_mhz"].add(f"{round(r['sm_clock_mean_mhz'], -1):.0f}")
        return found

    now, before = values(current), values(baseline)
    diff: dict[str, dict[str, tuple[list[str], list[str]]]] = {}
    for hw in sorted(set(now) | set(before)):
        for k in (*ENV_KEYS, "sm_clock_mean_mhz"):
            a, b = sorted(before.get(hw, {}).get(k, set())), sorted(now.get(hw, {}).get(k, set()))
            if a != b:
                diff.setdefault(hw, {})[k] = (a, b)
    return diff


# --- rendering ------------------------------------------------------------------------------------


def _ms(pair: tuple[float | None, float | None]) -> str:
    return " -> ".join("-" if v is None else f"{v:.3f}" for v in pair)


def to_markdown(comparison: Comparison, limit: int = 40, terminal: bool = False) -> str:
    """A summary short enough for a CI comment: the counts, the cross-GPU view, the environment
    diff, and the regressions (then the watches and improvements) with their reasons, `limit`
    lines at most. Text from the data (model names, errors, reasons) is escaped so that a
    Markdown renderer shows it as text: no link, image, HTML or emphasis can come from a row.
    `terminal=True`: the same lines for a terminal, with the text as it is."""

    def _md(text: str) -> str:
        return _plain(text) if terminal else _escaped(text)

    counts = comparison.counts()
    lines = [
        "## Regression report",
        "",
        ", ".join(f"**{n}** {v}" for v, n in counts.items() if n) or "no cells",
        f"(thresholds v{comparison.thresholds.version}: latency beyond {comparison.thresholds.latency_change:.0%} "
        f"with {comparison.thresholds.level:.0%} confidence)",
        "",
    ]
    if comparison.undecided():
        lines += [comparison.undecided_line() + ".", ""]
    if comparison.environment:
        lines.append("**Environment changes**")
        lines.append("")
        for hw, keys in comparison.environment.items():
            for k, (a, b) in keys.items():
                lines.append(f"- {hw} {k}: {', '.join(a) or '-'} -> {', '.join(b) or '-'}")
        lines.append("")
    view = comparison.by_model()
    if view:
        lines += ["| model | regressed on | improved on |", "|---|---|---|"]
        for model, d in view.items():
            lines.append(
                f"| {_md(model)} | {', '.join(d['regression']) or '-'} | {', '.join(d['improvement']) or '-'} |"
            )
        lines.append("")
    shown = [c for v in ("regression", "watch", "improvement") for c in comparison.cells if c.verdict == v]
    if shown:
        device = any(v is not None for c in shown for v in c.device_ms)  # GPU rows only
        lines += [
            "| cell | verdict | compiled ms |" + (" device ms |" if device else "") + " why |",
            "|---|---|---|" + ("---|" if device else "") + "---|",
        ]
        for c in shown[:limit]:
            lines.append(
                f"| {_md(c.name)} | {c.verdict} | {_ms(c.compiled_ms)} |"
                + (f" {_ms(c.device_ms)} |" if device else "")
                + f" {_md('; '.join(c.reasons))} |"
            )
        if len(shown) > limit:
            lines.append(f"\n... {len(shown) - limit} more in the JSON report")
    return "\n".join(lines) + "\n"


_MD_SPECIAL = set("\\`*_[]<>|&~!:")


def _escaped(text: str) -> str:
    """`text` as literal Markdown: every character that could start inline markup under
    CommonMark or GitHub's flavour backslash-escaped (links, images, raw HTML, entities,
    emphasis, code, strikethrough, table cells, and the `://` and `www.` that GitHub would turn
    into a link), newlines folded."""
    out = "".join("\\" + ch if ch in _MD_SPECIAL else ch for ch in _plain(text))
    return re.sub(r"(?i)\b(www)\.", r"\1\\.", out)


def _plain(text: str) -> str:
    return " ".join(text.splitlines())


def to_json_text(comparison: Comparison) -> str:
    return json.dumps(comparison.to_json(), indent=1, default=str)
