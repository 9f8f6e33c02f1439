"""Speedup report: per hardware class, a model x config table of compiled-over-eager speedups."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any

import pyarrow as pa

from analysis import efficiency
from store.layout import REPORT_FILE
from store.storage import Target, resolve


def _cell(row: dict[str, Any] | None) -> str:
    if row is None:
        return "-"
    if row["status"] != "ok":
        return str(row["status"])
    return "-" if row["speedup"] is None else f"{row['speedup']:.2f}x"


def speedup_tables(table: pa.Table) -> dict[str, tuple[list[str], list[list[str]]]]:
    """{hardware: (header, rows)}; one row per (model, batch size, dtype), one column per config."""
    by_hw: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for row in table.to_pylist():
        by_hw[row["hardware"]].append(row)
    out = {}
    for hw, rows in sorted(by_hw.items(), key=lambda kv: str(kv[0])):
        configs = sorted({r["config"] for r in rows}, key=str)
        cells: dict[tuple, dict[str, dict[str, Any]]] = defaultdict(dict)
        for r in rows:
            cells[(r["model"], r["batch_size"], r["dtype"])][r["config"]] = r
        header = ["model", "batch", "dtype", "eager ms", *map(str, configs)]
        body = []
        for (model, bs, dtype), by_cfg in sorted(cells.items(), key=lambda kv: tuple(map(str, kv[0]))):
            eager = [r["eager_ms"] for r in by_cfg.values() if r["eager_ms"] is not None]
            eager_s = f"{sorted(eager)[len(eager) // 2]:.3f}" if eager else "-"
            body.append([str(model), str(bs), str(dtype), eager_s, *(_cell(by_cfg.get(c)) for c in configs)])
        out[hw] = (header, body)
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
        + ". Cells: median eager latency / median compiled latency; a status where the job did not succeed.\n"
    )
    for hw, (header, rows) in speedup_tables(table).items():
        parts.append(f"## {hw}\n" if markdown else f"[{hw}]")
        parts.append((_markdown_table if markdown else _text_table)(header, rows) + "\n")
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
