"""The deployed gain of a set of presets as one self-contained HTML page (`orchestrate presets OUT
--html FILE`): per accuracy budget, a chart of every cell's speedup over a stock PyTorch user's
torch.compile (`vs_stock_compile`) with its 95% interval as whiskers and 1x marked, then the
table: the preset, its precision, its gain over stock torch.compile and stock eager with their
intervals, and its error against fp64 beside the stock policy's.

It draws a `deployed.json` document (`orchestrator.tune.deployed.summary`: a tune's, or the same
summary of the presets `orchestrate presets` derives from a sweep); reports import nothing from
the orchestrator, so the caller hands it the document. Charts and frame: `reports.charts`."""

from __future__ import annotations

from typing import Any

from reports.charts import TABLE_END, Bar, interval_chart, page_end, page_head, table_start
from reports.charts import esc as _e

NO_BUDGET = "None"
"""`deployed.json`'s key for presets decided without accuracy budgets (one per precision swept)."""


def _budget_name(name: str) -> str:
    return "per precision swept (no accuracy budget)" if name == NO_BUDGET else f"{name} budget"


def _ratio(value: float | None, ci: list[float | None] | None) -> str:
    if value is None:
        return "-"
    low, high = (ci or [None, None])[:2]
    return f"{value:.2f}x" + (f" [{low:.2f}, {high:.2f}]" if low is not None and high is not None else "")


def _error(value: float | None) -> str:
    return "-" if value is None else f"{value:.2g}"


def gain_bar(cell: dict[str, Any]) -> Bar:
    """A cell's bar: its gain over stock torch.compile, or why there is none."""
    label = f"{cell['cell']} {cell.get('preset')}"
    low, high = (cell.get("vs_stock_compile_ci") or [None, None])[:2]
    if cell.get("vs_stock_compile") is None:
        return Bar(label, None, note="no stock user timed")
    return Bar(
        label,
        cell["vs_stock_compile"],
        low,
        high,
        detail=f"over stock torch.compile ({cell.get('stock_compile_config') or '-'}), "
        f"precision {cell.get('policy') or '-'}",
    )


def render_deployed_html(summary: dict[str, Any], title: str = "Deployed gain") -> str:
    """The page of a `deployed.json` document."""
    out = [page_head(title)]
    cells = summary.get("cells") or []
    classes = sorted({str(c["cell"]).split("/", 1)[0] for c in cells})
    named = ("torch",) if len(classes) > 1 else ("gpu", "torch")  # "gpu": that of the first preset
    facts = [f"hardware classes {', '.join(classes)}"] if len(classes) > 1 else []
    facts += [f"{k} {summary[k]}" for k in named if summary.get(k)]
    out.append(
        "<p>"
        + _e("; ".join(facts) + ". " if facts else "")
        + "Each preset's speedup over a stock PyTorch user's torch.compile (the model in its own dtype "
        "under torch's defaults, in its faster stock mode), with its 95% interval (whiskers); the dashed "
        "line is 1x: as fast as the stock user.</p>"
    )
    for name, figures in (summary.get("budgets") or {}).items():
        mine = [c for c in cells if str(c.get("budget")) == name]
        geo = figures.get("geomean_vs_stock_compile")
        out.append(f"<h2>{_e(_budget_name(name))}</h2>")
        out.append(
            f"<p>{len(mine)} cells; geometric mean over stock torch.compile "
            f"{'-' if geo is None else f'{geo:.3f}x'}"
            + (f"; below 1x: {_e(', '.join(figures['below_1']))}" if figures.get("below_1") else "")
            + "</p>"
        )
        out.append(
            interval_chart(
                f"{_budget_name(name)}: speedup over stock torch.compile", [gain_bar(c) for c in mine], "x"
            )
        )
        out += _table(mine)
    out.append(page_end())
    return "".join(out)


def _table(cells: list[dict[str, Any]]) -> list[str]:
    heads = (
        "cell",
        "preset",
        "precision",
        "vs stock torch.compile [95% CI]",
        "vs stock eager [95% CI]",
        "error vs fp64 (stock)",
        "accuracy",
        "source",
    )
    out = [table_start(heads)]
    for c in cells:
        gain = c.get("vs_stock_compile")
        out.append(
            f"<tr><td>{_e(c['cell'])}</td><td>{_e(c.get('preset'))}</td><td>{_e(c.get('policy') or '-')}</td>"
            f"<td data-v='{'' if gain is None else gain}'>{_ratio(gain, c.get('vs_stock_compile_ci'))}</td>"
            f"<td>{_ratio(c.get('vs_stock_eager'), c.get('vs_stock_eager_ci'))}</td>"
            f"<td>{_error(c.get('max_rel_err'))} ({_error(c.get('stock_max_rel_err'))})</td>"
            f"<td>{_e(c.get('accuracy_decision') or '-')}</td><td>{_e(c.get('source') or '-')}</td></tr>"
        )
    out.append(TABLE_END)
    return out
