"""A comparison as text: the Markdown summary for a CI comment (or a terminal) and the JSON of
every cell."""

from __future__ import annotations

import json
import re

from reports.regression.cells import Comparison


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
