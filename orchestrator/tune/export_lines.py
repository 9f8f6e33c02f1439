"""The export's line per preset, in words: what its bundle will not save where it is applied
(`bundle_caveat`) and what became of its package (`package_line`, which records it in the
preset's entry), and why a cell has no preset (`no_preset_lines`); the serving plan's words are
`orchestrator.tune.sweep_models.serving_line`."""

from __future__ import annotations

from typing import Any

from compiler.config import CompileConfig


def bundle_caveat(config: CompileConfig, artifacts: dict[str, int]) -> str:
    """What a bundle will not save where it is applied, for the export's line: without an
    AOTAutograd entry (torch does not cache one with freezing) the applying process traces and
    re-runs AOTAutograd, and its start is only somewhat shorter than a cold compile."""
    if artifacts.get("aot_autograd"):
        return ""
    why = " (freezing: torch does not cache it)" if config.freezing else ""
    return (
        f"; no AOTAutograd entry{why}: applying it re-runs AOTAutograd, so it starts only somewhat "
        "faster than a cold compile (1.0-1.7x for freezing presets on an H200)"
    )


def package_line(
    entry: dict[str, Any], package: str | None, result: dict[str, Any], crashed: str = ""
) -> str:
    """Record the package's outcome in `entry`; the export line's words for it."""
    if package is None:
        if crashed:  # an earlier preset's package crashed its loader: none is built on this stack
            entry["package"] = None
            entry["package_error"] = f"not built: an earlier package of this export failed: {crashed}"
            return ", no package (this stack crashed loading an earlier one)"
        return ""
    if result.get("package_bytes"):
        entry["package"] = package
        for key in ("package_inputs", "package_cudagraphs", "package_compile_s"):
            entry[key] = result.get(key)
        return (
            f", package {result['package_bytes'] / 1e6:.1f} MB in {result.get('package_compile_s', 0):.1f} s"
        )
    entry["package"] = None
    entry["package_error"] = result.get("package_error") or "the export process made no package"
    return f", no package ({entry['package_error'][:200]})"


def no_preset_lines(missing: list[dict[str, Any]]) -> list[str]:
    """A line per cell without a preset (`presets`' `no_preset` entries): the cell, why, and what
    to do where its timing was doubted."""
    lines = []
    for m in missing:
        cell = f"{m['hardware']}/{m['model']}/bs{m['batch_size']}/{m['dtype']}"
        if m.get("undecided"):
            why = "; ".join(f"{c}: {status}" for c, status in m["statuses"].items())
            lines.append(
                f"{cell}: undecided, {m['undecided']} ({why}); measure it again on a quiet host "
                f"(`orchestrate sweep SWEEP --out NEW --only '{cell}/*'`) and export that"
            )
        else:
            lines.append(f"{cell}: no ok config ({'; '.join(f'{c}: {v}' for c, v in m['statuses'].items())})")
    return lines
