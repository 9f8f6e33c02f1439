"""Speedup report: per hardware class, a model x config table of speedups over each cell's one eager
reference, doubted timings marked, and each cell's fastest config."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any

import pyarrow as pa

from analysis import efficiency
from compiler import statistics as cstats
from reports.run_cells import RunCell, run_cells
from store.layout import REPORT_FILE
from store.storage import Target, resolve


def _cell(cell: RunCell | None) -> str:
    if cell is None:
        return "-"
    row, s = cell.row, cell.speedup
    if row["status"] != "ok":
        return str(row["status"])
    if s is None:
        return "-"
    text = f"{s.estimate:.2f}x" + (
        f" [{s.low:.2f}, {s.high:.2f}]" if s.low is not None and s.high is not None else ""
    )
    return text + (f" {cstats.MARK}" if cell.doubted else "")


def fastest(cells: list[RunCell]) -> str:
    """The config a cell's rows show fastest (the highest speedup over the cell's one reference,
    so the lowest compiled latency), or why none is: "undecided" where a row's timing is doubted
    (its true latency is not known) or no row is ok."""
    ok = [c for c in cells if c.row["status"] == "ok" and c.speedup is not None]
    if not ok:
        return "-"
    if any(c.doubted for c in ok):
        return f"undecided {cstats.MARK}"
    return str(max(ok, key=lambda c: c.speedup.estimate).row["config"])


def speedup_tables(table: pa.Table) -> dict[str, tuple[list[str], list[list[str]], list[str]]]:
    """{hardware: (header, rows, doubts)}; one row per (model, batch size, dtype), one column per
    config: its speedup over the cell's one eager reference (`reports.run_cells`) with its 95%
    interval, marked where its timing is doubted, and the cell's fastest config; `doubts` lists
    each doubted row with its reasons."""
    by_hw: dict[str, list[RunCell]] = defaultdict(list)
    for cell in run_cells(table):
        by_hw[str(cell.row["hardware"])].append(cell)
    out = {}
    for hw, hw_cells in by_hw.items():
        configs = sorted({c.row["config"] for c in hw_cells}, key=str)
        cells: dict[tuple, dict[str, RunCell]] = defaultdict(dict)
        for c in hw_cells:
            cells[(c.row["model"], c.row["batch_size"], c.row["dtype"])][c.row["config"]] = c
        header = ["model", "batch", "dtype", "eager ms", *map(str, configs), "fastest"]
        body, doubts = [], []
        for (model, bs, dtype), by_cfg in sorted(cells.items(), key=lambda kv: tuple(map(str, kv[0]))):
            ref = next((c.reference_ms for c in by_cfg.values() if c.reference_ms is not None), None)
            eager_s = "-" if ref is None else f"{ref:.3f}"
            line = [str(model), str(bs), str(dtype), eager_s, *(_cell(by_cfg.get(c)) for c in configs)]
            body.append([*line, fastest(list(by_cfg.values()))])
            doubts += [
                f"{c.label}: {cstats.doubt_text(list(c.doubts))}" for c in by_cfg.values() if c.doubted
            ]
        out[hw] = (header, body, doubts)
    return out


def stock_user_tables(table: pa.Table) -> dict[str, tuple[list[str], list[list[str]]]]:
    """{hardware: (header, rows)}: per (model, batch size), a stock PyTorch user's eager and
    torch.compile latencies (`analysis.stock`: the model's fp32 under torch's defaults,
    the faster stock mode) and, per precision swept, the fastest config's speedup over that
    torch.compile with its error against fp64. Empty where no cell timed a stock user."""
    from analysis.stock import stock_user, versus
    from compiler.precision import POLICIES

    cells: dict[tuple, list[dict[str, Any]]] = defaultdict(list)
    for row in table.to_pylist():
        if row.get("dtype") is not None:
            cells[(row["hardware"], row["model"], row["batch_size"])].append(row)
    out: dict[str, tuple[list[str], list[list[str]]]] = {}
    for hw in sorted({k[0] for k in cells}, key=str):
        mine = {k: v for k, v in cells.items() if k[0] == hw}
        policies = sorted(
            {r["dtype"] for v in mine.values() for r in v},
            key=lambda d: POLICIES[d].rank if d in POLICIES else 9,
        )
        body = []
        for (_, model, bs), rows in sorted(mine.items(), key=lambda kv: tuple(map(str, kv[0]))):
            user = stock_user(rows)
            if user is None:
                continue
            line = [
                str(model),
                str(bs),
                f"{user.eager_ms:.3f}" if user.eager_ms else "-",
                f"{user.compile_config} {user.compile_ms:.3f}",
            ]
            for policy in policies:
                ok = [
                    r for r in rows if r["dtype"] == policy and r["status"] == "ok" and r.get("compiled_ms")
                ]
                if not ok:
                    line.append("-")
                    continue
                best = min(ok, key=lambda r: r["compiled_ms"])
                figures = versus(user, best)
                err = figures.get("max_rel_err")
                line.append(
                    f"{best['config']} {figures.get('vs_stock_compile', 0):.2f}x"
                    + (f" (err {err:.2g})" if err is not None else "")
                )
            body.append(line)
        if body:
            out[hw] = (["model", "batch", "stock eager ms", "stock torch.compile ms", *policies], body)
    return out


def _markdown_table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def _text_table(header: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(x) for x in col) for col in zip(header, *rows, strict=False)]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    return "\n".join(
        [fmt.format(*header), fmt.format(*("-" * w for w in widths)), *(fmt.format(*r) for r in rows)]
    )


def render(table: pa.Table, markdown: bool = True) -> str:
    """The report as Markdown (markdown=True) or aligned plain text for a terminal."""
    statuses: dict[str, int] = defaultdict(int)
    for s in table.column("status").to_pylist():
        statuses[s] += 1
    parts = []
    if markdown:
        parts.append("# Speedup of torch.compile over eager\n")
    parts.append(
        f"{table.num_rows} results: "
        + ", ".join(f"{n} {s}" for s, n in sorted(statuses.items(), key=lambda kv: str(kv[0])))
        + ". Cells: the cell's eager reference (median over its jobs' eager calls) / the config's median compiled "
        "latency, with its 95% interval; a status where the job did not succeed. "
        f"{cstats.MARK}: the row's timing is doubted (the reasons are listed below its table); a cell with one "
        "is left undecided.\n"
    )
    for hw, (header, rows, doubts) in speedup_tables(table).items():
        parts.append(f"## {hw}\n" if markdown else f"[{hw}]")
        parts.append((_markdown_table if markdown else _text_table)(header, rows) + "\n")
        if doubts:
            parts.append(
                f"{cstats.MARK} timing doubted ({len(doubts)} rows):\n"
                + "\n".join(f"- {d}" for d in doubts)
                + "\n"
            )
    stock = stock_user_tables(table)
    if stock:
        parts.append("# Against a stock PyTorch user\n" if markdown else "Against a stock PyTorch user")
        parts.append(
            "A stock user runs the model in fp32 under torch's defaults, eagerly or with torch.compile in its faster "
            "stock mode (default or reduce-overhead). Per precision: the fastest config, its median speedup over "
            "that torch.compile (rows of separate jobs) and its max relative error against fp64.\n"
        )
        for hw, (header, rows) in stock.items():
            parts.append(f"## {hw}\n" if markdown else f"[{hw}]")
            parts.append((_markdown_table if markdown else _text_table)(header, rows) + "\n")
    time_went = efficiency.render(table.to_pylist(), markdown)  # analysis/efficiency.py
    if time_went:
        parts.append(time_went)
    return "\n".join(parts)


def write_report(out_dir: Target, table: pa.Table) -> Path | str:
    """Write `<out>/report.md` (a path or a URI) whole; return where (a Path or the URI)."""
    path = resolve(out_dir).join(REPORT_FILE)
    path.write_text(render(table, markdown=True))
    return path.target
