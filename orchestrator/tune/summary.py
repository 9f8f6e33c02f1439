"""What a tune says at its end: `tune.json` (`tune_document`: how it was asked for, what each
setting gained, and every cell's log), and `TuneSummary`, which `run_tune` returns: what it
decided, and the jobs its rounds left unfinished, as `harness_error` (a fault of the harness, not
of the model), which `orchestrate tune --resume` runs again before it decides anew."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from orchestrator.fleet.summary import unfinished
from store.storage import Location


@dataclass
class TuneSummary:
    out_dir: Location
    cells: int
    tuned: int
    stock: int
    no_preset: int
    eager: int
    """Cells whose preset is eager: the compiled preset chosen ran slower than eager there
    (`orchestrator.tune.eager`)."""
    jobs: dict[str, int]
    wall_s: float
    decisions: dict[str, str]
    what_won: list[dict[str, Any]] = field(default_factory=list)
    pruned: dict[str, dict[str, str]] = field(default_factory=dict)
    deployed: dict[str, Any] = field(default_factory=dict)
    """`deployed.json`: per cell and budget what was deployed and its speedup over a stock user."""
    budgets: list[str] = field(default_factory=list)
    """The accuracy budgets the presets were decided under (a preset per cell and budget)."""
    time_went: str = ""
    """Where the time of the jobs this tune ran went (`reports.efficiency`), over all its rounds."""
    harness_errors: dict[str, int] = field(default_factory=dict)
    """Jobs each round (by name) left as `harness_error`: their candidates were left out of the
    decisions, which `resume_command` makes again once it has run them."""
    resume_command: str = ""

    def unfinished(self) -> str | None:
        """What to tell the user where rounds left `harness_error` jobs; None if none did."""
        count = sum(self.harness_errors.values())
        if not count:
            return None
        rounds = ", ".join(f"{n} in {r}" for r, n in self.harness_errors.items())
        return (
            f"{unfinished(count, self.resume_command)}\n  ({rounds}; the presets were decided without them)"
        )


def tune_document(spec, opts, budgets, pruned, effects, won, jobs_run, log) -> dict[str, Any]:
    """tune.json: how the tune was asked for, what each setting gained, and every cell's log."""
    return {
        "format": 2,
        "sweep": spec.source,
        "argv": opts.sweep.argv,
        "budgets": opts.limits.to_dict(),
        "accuracy": [b.name for b in budgets],
        "eta": opts.eta,
        "confirm_repeats": opts.confirm_repeats,
        "eager_presets": opts.eager_presets,
        "precisions": list(opts.precisions) if opts.precisions is not None else "as the budgets allow",
        "knobs": list(opts.knobs),
        "bases": list(opts.bases) if opts.bases is not None else "max-autotune modes on GPU classes",
        "pruned": pruned,
        "setting_effects": effects,
        "what_won": won,
        "jobs": jobs_run,
        "cells": log,
    }
