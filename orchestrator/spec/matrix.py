"""Expand a `SweepSpec` into the list of `Job`s it stands for, and select among them."""

from __future__ import annotations

import fnmatch
from collections.abc import Iterable, Mapping

from compiler.accuracy import PolicyChoice, policies_for
from compiler.capabilities import known
from compiler.job import DeviceKind, Job, software_stack
from orchestrator.spec.sweep import SweepSpec


def class_policies(spec: SweepSpec, hardware: str, restrict=None) -> dict[str, list[PolicyChoice]]:
    """Per accuracy budget of the sweep, every precision policy and whether the class `hardware`
    searches it, with why (`compiler.accuracy.policies_for`, from the capability table; a class the
    table lacks searches what the budget allows, and its jobs check their device). Empty without
    budgets."""
    return {b.name: policies_for(b, known(hardware), spec.dtypes[0], restrict) for b in spec.accuracy}


def policies_of(spec: SweepSpec, hardware: str, restrict=None) -> tuple[str, ...]:
    """The precision policies a class measures: the sweep's dtypes, in their order, then with budgets
    every other policy one of them searches there, in the nominal order of `compiler.precision`."""
    from compiler.precision import PRECISIONS

    found: set[str] = set()
    for choices in class_policies(spec, hardware, restrict).values():
        found |= {c.policy for c in choices if c.searched}
    return (*spec.dtypes, *(p for p in PRECISIONS if p in found and p not in spec.dtypes))


def expand(
    spec: SweepSpec, hardware: Mapping[str, DeviceKind], stack: dict[str, str] | None = None
) -> list[Job]:
    """Every (hardware, model, batch size, dtype, config) cell, in that nesting order.

    `hardware` maps each hardware class the sweep runs on to the device kind its jobs use; the
    dtypes of a class are `policies_of` it (with accuracy budgets they differ between classes).
    """
    stack = software_stack() if stack is None else stack
    jobs = [
        Job(
            sweep=spec.name,
            hardware=hw,
            device=device,
            model=model,
            batch_size=bs,
            dtype=dtype,
            config=cfg,
            measure=spec.measure,
            timeout_s=model.timeout_s or cfg.effective_timeout(spec.timeout_s),
            stack=stack,
            serving=spec.serving_of(model),
        )
        for hw, device in hardware.items()
        for model in spec.models
        for bs in spec.batch_sizes
        for dtype in policies_of(spec, hw)
        for cfg in spec.configs
    ]
    ids = [j.job_id for j in jobs]
    if len(set(ids)) != len(ids):  # identity covers every axis, so this is a bug, not bad input
        raise AssertionError("job ids collide within one sweep")
    return jobs


def select(jobs: Iterable[Job], pattern: str | None) -> list[Job]:
    """Jobs whose name (hardware/model/bsN/dtype/config) matches `pattern`.

    A pattern with glob characters (* ? [) must match the whole name; a plain word matches
    anywhere in it. Several patterns may be given separated by commas.
    """
    jobs = list(jobs)
    if not pattern:
        return jobs
    parts = [p.strip() for p in pattern.split(",") if p.strip()]

    def hit(name: str) -> bool:
        return any(fnmatch.fnmatchcase(name, p) if any(c in p for c in "*?[") else p in name for p in parts)

    return [j for j in jobs if hit(j.name)]


class NoJobMatches(ValueError):
    """An --only pattern that matches none of a sweep's jobs; the message names the closest names."""


def select_matching(
    jobs: Iterable[Job],
    pattern: str | None,
    what: str = "the sweep's {n} jobs",
    listing: str = " (all: `orchestrate plan SWEEP`)",
) -> list[Job]:
    """`select`, refusing (NoJobMatches) a pattern that leaves none of `jobs` (`what` they are, in
    words, `{n}` their number; `listing`: where to see them all): a typo in --only must not pass
    as a sweep of 0 jobs."""
    import difflib

    jobs = list(jobs)
    chosen = select(jobs, pattern)
    if pattern is not None and jobs and not chosen:
        names = [j.name for j in jobs]
        near = (
            difflib.get_close_matches(pattern.split(",")[0].strip()[:200], names, n=3, cutoff=0) or names[:3]
        )
        shown = pattern if len(pattern) <= 200 else f"{pattern[:200]}... ({len(pattern):,} characters)"
        raise NoJobMatches(
            f"--only {shown!r} matches none of {what.format(n=len(jobs))}; job names are "
            f"hardware/model/bsN/dtype/config, e.g. {', '.join(near)}{listing}"
        )
    return chosen
