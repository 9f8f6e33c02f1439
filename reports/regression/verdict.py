"""One cell of two runs judged: its status change, its latency (wall time, and device time
where the cell is host-bound), its cold compile time, peak memory, graph breaks and recompiles, and
its changed autotune winners, each noted on the `CellChange` with its verdict in words. The
decisions and their thresholds are `compiler.statistics`'s; nothing here decides on its own."""

from __future__ import annotations

from typing import Any

from compiler import statistics as cstats
from reports.regression.cells import CellChange
from reports.regression.match import device_groups, sample_groups


def _first_line(text: str | None) -> str:
    return (text or "").strip().splitlines()[0][:200] if (text or "").strip() else ""


def compare_cell(
    c: CellChange,
    now: dict[str, Any],
    before: dict[str, Any],
    t: cstats.Thresholds,
    older: list[list[float]],
    older_device: list[list[float]] = (),
    older_compile: list[float] = (),
) -> None:
    """Judge a cell both runs have: its status change, then, where both sides are ok, its latency
    (against the baseline's samples and the `older` window's) and its once-per-run figures."""
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
    processes per side, or a side whose timing is doubted (`statistics.timing_doubts`), is only a
    `watch`."""
    current, reference = sample_groups(now), sample_groups(before) + older
    history = bool(older)
    undecided = cstats.undecided_reason(len(current), len(reference), t, history=history)
    doubts = [
        f"{side}: {cstats.doubt_text(found)}"
        for side, row in (("current", now), ("baseline", before))
        if (found := cstats.timing_doubts(row, t))
    ]
    if doubts:  # a timing that cannot be trusted decides nothing: a watch, with the reasons
        undecided = f"undecided: timing doubted {cstats.MARK} ({'; '.join(doubts)})"
    borrow = history and undecided is None and cstats.borrows_between(len(current), len(reference), t)
    c.processes = (len(reference), len(current))
    dev_now, dev_ref = device_groups(now), device_groups(before) + older_device
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
    """The once-per-run figures: the cold compile time (against the window's too), peak memory,
    graph breaks and recompiles (with the reasons that are new)."""
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


def compare_winners(c: CellChange, now: dict[tuple, str], before: dict[tuple, str]) -> None:
    """The autotune winners that changed, per (op, input shapes): five named, the rest counted."""
    changed = [(op, before[op], now[op]) for op in sorted(set(now) & set(before)) if now[op] != before[op]]
    for (op, shapes), was, is_ in changed[:5]:
        c.reasons.append(f"autotune winner for {op} ({', '.join(shapes)}): {was} -> {is_}")
    if len(changed) > 5:
        c.reasons.append(f"... and {len(changed) - 5} more autotune winner changes")
