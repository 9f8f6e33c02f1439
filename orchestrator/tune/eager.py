"""Eager presets: cells where the compiled preset chosen runs slower than not compiling at all.

Every job times eager and its compiled config interleaved in the same processes, so whether eager
beats the preset P chosen for a cell (`orchestrator.tune.decide.within_precision`,
`presets.derive_presets`) is a paired comparison that P's own row holds already: the ratio P's
compiled / eager (`compiler.statistics.paired_speedup`: the hierarchical bootstrap over P's
processes), judged by
the project's one "faster than" rule (`statistics.beats`: the whole 95% interval above 1), and
only where the row holds at least `min_processes` processes
(`compiler/statistics/thresholds.json`: one process's interval cannot cover the spread between
processes). The row is the one P's figures
come from: the confirmation job of a tuned or kept stock preset, a sweep's row of a swept one.

Then the cell's preset becomes eager (`config: eager`, `compile: null`) under the runtime settings
eager was timed under in that row (P's: they are process-wide and set before the model is built)
and in the cell's precision. P's `channels_last` and `freezing` are compile choices and stay
behind: the job times eager on the model as built. Otherwise nothing changes.

A row whose eager ran in another precision than the cell's (a tf32 candidate of an fp32 cell, or
the confirmation job that timed one) is not judged: eager of the cell was not timed there.
"""

from __future__ import annotations

import contextlib
import math
from typing import Any

from compiler import runtime
from compiler import statistics as cstats
from compiler.config import EAGER
from orchestrator.tune.effects import EAGER_SETTING, VERDICTS, CellEffect, SettingEffect

Stock = tuple[str, dict[str, Any], str]
"""The best stock config of a cell for the comparison: (its name, the row its samples are in,
their side in that row: `compiled` or `baseline`)."""


def check(entry: dict[str, Any], row: dict[str, Any], side: str, cell_dtype: str) -> dict[str, Any]:
    """What P's row says of eager against P (the compiled preset `entry`, whose samples are the
    row's `side`: `compiled`, or `baseline` for the stock config of a confirmation job): a record
    for tune.json, with `verdict` `eager` (eager wins), `kept` or `not judged`, and `why`."""
    name, job = entry["config"], row.get("job_id")
    record: dict[str, Any] = {
        "hardware": entry["hardware"],
        "model": entry["model"],
        "cell": f"{entry['hardware']}/{entry['model']}/bs{entry['batch_size']}/{cell_dtype}",
        "config": name,
        "job_id": job,
    }
    if row.get("dtype") != cell_dtype:
        why = f"eager in job {job} ran in {row.get('dtype')}, not in the cell's {cell_dtype}"
        return record | {"verdict": "not judged", "why": why}
    iv = None
    with contextlib.suppress(ValueError):  # samples that do not split into the row's processes
        if row.get(f"{side}_samples_ms") and row.get("eager_samples_ms"):
            iv = cstats.paired_speedup(
                row[f"{side}_samples_ms"], row["eager_samples_ms"], row.get("samples_per_repeat")
            )
    if iv is None or math.isnan(iv.low):
        why = f"job {job} holds no samples of eager and {name} from the same processes"
        return record | {"verdict": "not judged", "why": why}
    thresholds = cstats.load_thresholds()
    enough = iv.processes >= thresholds.min_processes
    effect = VERDICTS[cstats.gain_verdict(iv, thresholds)] if enough else "unclear"
    figures = (
        f"compiled {name} took {iv.estimate:.3f}x eager's time [{iv.low:.3f}, {iv.high:.3f}], "
        f"paired over {iv.processes} process{'es' if iv.processes != 1 else ''} (job {job})"
    )
    if effect == "helps":
        verdict, why = "eager", figures
    elif not enough:
        verdict = "kept"
        why = (
            f"{figures}: fewer than {thresholds.min_processes} processes cannot show the spread between them"
        )
    else:
        verdict, why = "kept", f"{figures}, an interval that does not lie above 1"
    return record | {
        "compiled_ms": row.get(f"{side}_ms"),
        "eager_ms": row.get("eager_ms"),
        "gain": iv.estimate,
        "ci_low": iv.low,
        "ci_high": iv.high,
        "processes": iv.processes,
        "paired": True,
        "effect": effect,
        "verdict": verdict,
        "why": why,
    }


def vs_stock(row: dict[str, Any], stock: Stock) -> dict[str, Any]:
    """An eager preset against the cell's best stock config: stock / eager with its interval,
    paired where both were timed in the same processes (the same row), else unpaired (the stock
    config timed apart because it differs in a runtime setting), and which it is, in words."""
    name, stock_row, side = stock
    eager = cstats.row_groups(row, "eager")
    if stock_row is row:
        iv = cstats.ratio_interval(cstats.row_groups(row, side), eager, paired=True)
        scope = (
            f"paired: eager and {name} interleaved in the same {iv.processes} processes (job {row['job_id']})"
        )
    else:
        iv = cstats.ratio_interval(cstats.row_groups(stock_row, side), eager, paired=False)
        scope = (
            f"unpaired: {name} in the {len(cstats.row_groups(stock_row, side))} processes of job {stock_row['job_id']}, "
            f"eager in the {len(eager)} processes of job {row['job_id']} (they differ in a runtime setting)"
        )
    return {
        "stock_config": name,
        "stock_ms": stock_row.get(f"{side}_ms"),
        "speedup_vs_stock": iv.estimate,
        "speedup_vs_stock_ci_low": iv.low,
        "speedup_vs_stock_ci_high": iv.high,
        "speedup_vs_stock_from": scope,
    }


def reconsider(
    entry: dict[str, Any],
    why: str,
    row: dict[str, Any],
    side: str,
    cell_dtype: str,
    stock: Stock | None = None,
    log: dict[str, Any] | None = None,
    veto: str | None = None,
) -> tuple[dict[str, Any], str]:
    """The compiled preset `entry` (chosen for `why`), or the eager preset that replaces it where
    its row shows eager faster (`check`, recorded in `log["eager_check"]`) and nothing vetoes it
    (`veto`: why eager may not be the preset, e.g. --no-eager, or an error over the accuracy
    budget); and the decision in words. `stock`: the comparison an eager preset states against
    the best stock config."""
    record = check(entry, row, side, cell_dtype)
    if record["verdict"] == "eager" and veto:
        record.update(verdict="kept", why=f"{record['why']}; {veto}")
    if log is not None:
        log["eager_check"] = record
    if record["verdict"] != "eager":
        return entry, why
    decision = f"eager: {record['why']}; {entry['config']} had been chosen: {why}"
    new = {
        **entry,
        "config": EAGER,
        "compile": None,
        "runtime": runtime.from_json(row.get("runtime")),
        "precision": cell_dtype,
        "source": "eager",
        "compiled_ms": None,
        "eager_ms": row.get("eager_ms"),
        "speedup_vs_eager": None,
        "compile_s": None,
        "peak_mem_bytes": row.get("eager_peak_mem_bytes"),
        "serving_peak_mem_bytes": row.get("eager_peak_mem_bytes"),  # a process that compiles nothing
        "job_id": row.get("job_id"),
        "eager_over_config": entry["config"],
        "eager_over_compile": entry["compile"],
        "eager_over_ms": record["compiled_ms"],
        "eager_gain": record["gain"],
        "eager_gain_ci_low": record["ci_low"],
        "eager_gain_ci_high": record["ci_high"],
        "eager_gain_processes": record["processes"],
    }
    if stock is not None:
        new.update(vs_stock(row, stock))
        decision += (
            f"; against the best stock config {new['stock_config']}: {new['speedup_vs_stock']:.3f}x "
            f"[{new['speedup_vs_stock_ci_low']:.3f}, {new['speedup_vs_stock_ci_high']:.3f}] "
            f"({new['speedup_vs_stock_from']})"
        )
    new["decision"] = decision
    return new, decision


def add_effects(
    effects: dict[str, dict[str, SettingEffect]], records: list[dict[str, Any]]
) -> dict[str, dict[str, SettingEffect]]:
    """`effects` (`effects.setting_effects`) with eager as a setting of its own, where the eager
    checks measured it: its gain is the compiled preset's time / eager's, `helps` where the cell's
    preset became eager."""
    for r in records:
        if r.get("gain") is None:
            continue
        by_setting = effects.setdefault(r["hardware"], {})
        setting = by_setting.setdefault(EAGER_SETTING, SettingEffect(r["hardware"], EAGER_SETTING))
        setting.cells.append(
            CellEffect(
                r["cell"], r["model"], r["config"], EAGER, r["gain"], r["ci_low"], r["ci_high"], r["effect"]
            )
        )
    return effects
