"""The export's line per preset, in words: what its bundle will not save where it is applied
(`bundle_caveat`) and what became of its package (`package_line`, which records it in the
preset's entry); the serving plan's words are `orchestrator.tune.sweep_models.serving_line`."""

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
