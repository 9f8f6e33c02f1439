"""The deployed gain of a set of presets as one self-contained HTML page (`orchestrate presets OUT
--html FILE`): per accuracy budget and hardware class (labelled by what it is: "GPU: NVIDIA H100
...", "CPU: AMD EPYC ..."), a chart of every cell's gain over a stock PyTorch user, two bars a
cell: over stock eager (`vs_stock_eager`) and over stock torch.compile (`vs_stock_compile`), each
with its 95% interval as whiskers on a log axis with 1x marked; then the table: the preset, its
precision, both gains with their intervals, and its error against fp64 beside the stock policy's.

It draws a `deployed.json` document (`orchestrator.tune.deployed.summary`: a tune's, or the same
summary of the presets `orchestrate presets` derives from a sweep); reports import nothing from
the orchestrator, so the caller hands it the document. Geometry: `reports.charts`; markup:
`reports/templates/deployed.html.j2`."""

from __future__ import annotations

from typing import Any

from compiler import statistics as cstats
from reports.charts import CROSSES, Bar, Td, class_label, interval_chart, render

NO_BUDGET = "None"
"""`deployed.json`'s key for presets decided without accuracy budgets (one per precision swept)."""

GAINS = {"over stock eager": "#9a6700", "over stock torch.compile": "#1f6feb"}
"""The chart's two series, each a bar a cell: its legend name and colour."""
_KEYS = {"over stock eager": "vs_stock_eager", "over stock torch.compile": "vs_stock_compile"}
"""Each series' figure in a `deployed.json` cell (its interval: the same key with `_ci`)."""

HEADS = (
    "cell",
    "preset",
    "precision",
    "vs stock torch.compile [95% CI]",
    "vs stock eager [95% CI]",
    "error vs fp64 (stock)",
    "accuracy",
    "source",
)


def _budget_name(name: str) -> str:
    return "per precision swept (no accuracy budget)" if name == NO_BUDGET else f"{name} budget"


def _interval(cell: dict[str, Any], key: str) -> tuple[float | None, float | None]:
    low, high = (list(cell.get(f"{key}_ci") or []) + [None, None])[:2]
    return low, high


def _crosses(value: float | None, low: float | None, high: float | None) -> bool:
    return value is not None and low is not None and high is not None and low <= 1.0 <= high


def _ratio(cell: dict[str, Any], key: str) -> Td:
    value = cell.get(key)
    if value is None:
        return Td()
    low, high = _interval(cell, key)
    text = f"{value:.2f}x" + (f" [{low:.2f}, {high:.2f}]" if low is not None and high is not None else "")
    doubts = list(cell.get("doubts") or [])
    text += (f" {cstats.MARK}" if doubts else "") + (f" {CROSSES}" if _crosses(value, low, high) else "")
    return Td(text, value, cstats.doubt_text(doubts))


def _error(value: float | None) -> str:
    return "-" if value is None else f"{value:.2g}"


def gain_bars(cell: dict[str, Any], label: str | None = None) -> list[Bar]:
    """A cell's two bars: its gain over stock eager and over stock torch.compile, each with its
    interval, or why there is none."""
    label = label or f"{cell['cell']} {cell.get('preset')}"
    bars = []
    for series, key in _KEYS.items():
        value = cell.get(key)
        if value is None:
            bars.append(Bar(label, None, note="no stock user timed", series=series))
            continue
        stock = (
            f"stock torch.compile ({cell.get('stock_compile_config') or '-'})"
            if "compile" in key
            else "stock eager"
        )
        low, high = _interval(cell, key)
        bars.append(
            Bar(
                label,
                value,
                low,
                high,
                detail=f"over {stock}, precision {cell.get('policy') or '-'}",
                doubts=tuple(cell.get("doubts") or ()),
                series=series,
            )
        )
    return bars


def _classes(summary: dict[str, Any]) -> dict[str, str]:
    """Per hardware class of the cells, its label: the summary's device name (that of its first
    preset) names the first cell's class; a cell's own `device_name`, where it has one, its own."""
    cells = summary.get("cells") or []
    names: dict[str, list[str]] = {}
    for i, c in enumerate(cells):
        hw = str(c["cell"]).split("/", 1)[0]
        device = c.get("device_name") or (summary.get("gpu") if i == 0 else None)
        names.setdefault(hw, []).extend([device] if device else [])
    return {hw: class_label(hw, devices) for hw, devices in names.items()}


def render_deployed_html(summary: dict[str, Any], title: str = "Deployed gain") -> str:
    """The page of a `deployed.json` document."""
    cells = summary.get("cells") or []
    labels = _classes(summary)
    facts = [", ".join(labels.values())] if labels else []
    facts += [f"torch {summary['torch']}"] if summary.get("torch") else []
    budgets = []
    for name, figures in (summary.get("budgets") or {}).items():
        mine = [c for c in cells if str(c.get("budget")) == name]
        charts = []
        for hw, label in labels.items():
            here = [c for c in mine if str(c["cell"]).split("/", 1)[0] == hw]
            if here:
                bars = [b for c in here for b in gain_bars(c, _cell_label(c))]
                charts.append(
                    interval_chart(f"{label}, {_budget_name(name)}: gain over a stock user", bars, "x", GAINS)
                )
        budgets.append(
            {
                "name": _budget_name(name),
                "cells": len(mine),
                "geo_eager": _geo(figures.get("geomean_vs_stock_eager")),
                "geo_compile": _geo(figures.get("geomean_vs_stock_compile")),
                "below_1": ", ".join(figures.get("below_1") or []),
                "charts": charts,
                "rows": [_row(c) for c in mine],
            }
        )
    return render("deployed.html.j2", title=title, facts="; ".join(facts), budgets=budgets, heads=HEADS)


def _cell_label(cell: dict[str, Any]) -> str:
    """A cell within its class's chart: model, batch size, precision and preset."""
    return f"{str(cell['cell']).split('/', 1)[-1]} {cell.get('preset')}"


def _geo(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}x"


def _row(c: dict[str, Any]) -> list[Td]:
    return [
        Td(c["cell"]),
        Td(c.get("preset")),
        Td(c.get("policy") or "-"),
        _ratio(c, "vs_stock_compile"),
        _ratio(c, "vs_stock_eager"),
        Td(f"{_error(c.get('max_rel_err'))} ({_error(c.get('stock_max_rel_err'))})"),
        Td(c.get("accuracy_decision") or "-"),
        Td(c.get("source") or "-"),
    ]
