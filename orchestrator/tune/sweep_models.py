"""What the export reads about a tune's models from its run log (`store.runlog.read_runs`, read
once and handed to each): each model's entry as the sweep file gave it (`model_specs`), and the
traffic each model's presets are to serve (`serving_profiles`, the `serving:` blocks,
`compiler.serving.traffic`; later runs win),
and the export line's words for the serving plan a preset got (`serving_line`)."""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Any

from compiler import statistics as cstats
from compiler.job import ModelSpec
from compiler.serving.traffic import ProfileError, ServingProfile, judged_prepare_s
from orchestrator.spec.models import default_name


def _entries(run: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """(name, entry) of each model entry of a run's spec that this tool would have run."""
    models = (run.get("spec") or {}).get("models")
    found = []
    for m in models if isinstance(models, list) else []:
        # a bare id (`- hf:...`) has no more to it than the row's model_id; an entry this tool
        # would not have run (edited since) is left out the same way
        if isinstance(m, dict) and isinstance(m.get("id"), str):
            found.append((m.get("name", default_name(m["id"])), m))  # no name: named from its id
    return found


def model_specs(runs: list[dict[str, Any]]) -> dict[str, ModelSpec]:
    """The sweep's model entries by name, from the run log's `runs` (later runs win)."""
    specs: dict[str, ModelSpec] = {}
    fields = {f.name for f in dataclasses.fields(ModelSpec)}
    for run in runs:
        for name, m in _entries(run):
            with contextlib.suppress(TypeError):
                specs[name] = ModelSpec(**{k: v for k, v in m.items() if k in fields} | {"name": name})
    return specs


def serving_profiles(runs: list[dict[str, Any]]) -> dict[str, ServingProfile]:
    """Each model's serving profile from the run log's `runs`' specs (the model's own `serving:` over the
    sweep's; later runs win); a model without one is absent. A block that no longer reads as a
    profile is left out (the sweep that recorded it was checked when it ran)."""
    profiles: dict[str, ServingProfile] = {}
    for run in runs:
        spec = run.get("spec") or {}
        for name, m in _entries(run):
            block = m.get("serving", spec.get("serving"))
            if block is None:
                profiles.pop(name, None)
                continue
            with contextlib.suppress(ProfileError):
                profiles[name] = ServingProfile.from_dict(block)
    return profiles


def serving_line(serving: dict[str, Any] | None) -> str:
    """The export line's words for a preset's serving plan (`workers.bench.serving`), or ""."""
    if not serving:
        return ""
    plans = serving.get("plans") or {}
    timed = ", ".join(
        f"{p} {v['weighted_ms']:.3f} ms" if "error" not in v else f"{p} failed: {v['error'][:150]}"
        for p, v in plans.items()
    )
    on = f" {serving['buckets']}" if serving["plan"] == "buckets" else ""
    why = "" if serving["padding"].get("ok") else " (padding refused: rows interact)"
    profile = ServingProfile.from_dict(serving["profile"]).describe()
    packages = serving.get("packages")
    if packages and "dynamic" in packages:
        p = packages["dynamic"]
        packed = f", one package for batch {p['batch'][0]}..{p['batch'][1]} (built in {p.get('compile_s') or 0:.0f} s)"
    elif packages:
        build = serving.get("package_build") or {}
        packed = (
            f", a package per bucket ({build['buckets']} built in {build['wall_s']:.0f} s by "
            f"{_count(build['processes'], 'process', 'processes')} on "
            f"{_count(build['gpus'], 'GPU', 'GPUs') if build['gpus'] else 'the CPU'})"
            if build.get("wall_s") is not None
            else f", a package per bucket ({sum(p.get('compile_s') or 0 for p in packages.values()):.0f} s)"
        )
    else:
        packed = (
            f", no {'bucket packages' if serving['plan'] == 'buckets' else 'package'} "
            f"({serving['package_error'][:200]})"
            if serving.get("package_error")
            else ""
        )
    packed += _cold_clause(serving)
    stock = serving.get("stock") or {}
    if serving.get("vs_stock") is not None:
        gain = serving["vs_stock"]
        against = (
            f"; {gain:.2f}x the stock user (torch.compile {stock.get('mode')}, {stock.get('dtype')}: "
            f"{stock['weighted_ms']:.3f} ms, stalls {stock.get('stall_s', 0):.1f} s apart)"
        )
        if gain < 1:
            against += ": LOSES to stock"
    elif stock.get("error"):
        against = f"; the stock user not measured ({stock['error'][:200]})"
    else:
        against = ""
    miss = serving.get("config_miss") or {}
    if len(miss) > 1 or any(m["ratio"] > 1 for m in miss.values()):
        against += "; its config at the swept sizes: " + ", ".join(
            _miss_words(bs, m) for bs, m in miss.items()
        )
    return f", serves {profile} on {serving['plan']}{on}{why} (weighted {timed}){packed}{against}"


def _miss_words(bs: str, miss: dict[str, Any]) -> str:
    """One swept size of `config_miss` in the export line: the preset's config against the fastest
    there, with the interval where it has one and whether the gap is more than noise."""
    words = f"bs{bs} {miss['ratio']:.2f}x the fastest ({miss['best']})"
    if miss["ratio"] == 1.0 or "ratio_low" not in miss:
        return words  # the fastest itself, or an export written before intervals
    low, high = miss["ratio_low"], miss["ratio_high"]
    if low is None or high is None:
        return f"{words}, no samples to judge it"
    return f"{words} [{low:.2f}, {high:.2f}]" + ("" if miss.get("beyond_noise") else ", within noise")


def _ordinal(n: int) -> str:
    return {1: "first", 2: "second", 3: "third"}.get(n, f"{n}th")


def _cold_clause(serving: dict[str, Any]) -> str:
    """The export line's words for a buckets plan under a prepare budget: its chosen set's cold
    prepare as measured, the slowest of its fresh processes and the most a new one would take as
    their spread predicts (and which set it was, where the first did not fit the budget:
    `workers.bench.serving_prepare.from_packages`), doubted where
    other processes took a share of its cores that would doubt a row's timing
    (`compiler.statistics.other_share_doubt`), or why the budget was not applied; "" without a
    budget."""
    budget = ServingProfile.from_dict(serving["profile"]).prepare_budget_s
    plan = (serving.get("plans") or {}).get("buckets") or {}
    if serving["plan"] != "buckets" or budget is None:
        return ""
    if plan.get("cold_prepare_s") is not None:
        bound = plan.get("cold_prepare_bound_s")
        over = ": OVER BUDGET" if judged_prepare_s(plan["cold_prepare_s"], bound) > budget else ""
        tries = plan.get("cold_prepare_tries") or 1
        sets = f", the {_ordinal(tries)} set tried" if tries > 1 else ""
        runs = len(plan.get("cold_prepare_runs") or [])
        predicted = f", a new one predicted within {bound:.1f} s" if bound is not None else ""
        slowest = f"the slowest of {runs} fresh processes{predicted}; " if runs > 1 else ""
        doubt = cstats.other_share_doubt(plan.get("cold_prepare_other_shares"), doing="prepared")
        doubted = f" (doubted: {doubt}; export again on a quiet node)" if doubt else ""
        return f", prepared cold in {plan['cold_prepare_s']:.1f} s ({slowest}budget {budget:g} s{sets}){over}{doubted}"
    if plan.get("cold_prepare_error"):
        return f", prepare budget not applied (no cold prepare: {plan['cold_prepare_error'][:200]})"
    return ", prepare budget not applied (it weighs packages' cold prepare; this plan has none)"


def config_miss(rows: list[dict[str, Any]], entry: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """What serving a whole range with the preset's one config misses against the per-size optimum,
    at the sizes the tune measured (its representative sizes): per batch size of the preset's
    model and dtype in `rows` (ok rows of its class) where its config ran, the fastest config
    there, both median latencies, and `ratio`, the preset's config's over the fastest's (1.0
    where it is the fastest), with its interval over the two configs' processes (`ratio_low`,
    `ratio_high`, `compiler.statistics.ratio_interval`; None where the rows hold no samples) and
    `beyond_noise`, whether the fastest beats the preset's config by a margin the samples support
    (`compiler.statistics.beats`). The buckets between those sizes run the same config
    unmeasured."""
    import statistics

    cells: dict[int, dict[str, list[dict[str, Any]]]] = {}
    for r in rows:
        if (
            r.get("status") == "ok"
            and r.get("model") == entry.get("model")
            and r.get("dtype") == entry.get("dtype")
            and r.get("compiled_ms") is not None
        ):
            cells.setdefault(int(r["batch_size"]), {}).setdefault(r["config"], []).append(r)
    out = {}
    for bs in sorted(cells):
        medians = {c: statistics.median(float(r["compiled_ms"]) for r in rs) for c, rs in cells[bs].items()}
        preset = entry.get("config")
        if preset not in medians:
            continue
        best = min(medians, key=lambda c: medians[c])
        low = high = 1.0 if best == preset else None
        beyond = False
        if best != preset:  # each row's processes, pooled per config
            mine, theirs = (
                [g for r in cells[bs][c] for g in cstats.row_groups(r, "compiled")] for c in (preset, best)
            )
            if mine and theirs:
                iv = cstats.ratio_interval(mine, theirs, paired=False)
                low, high, beyond = iv.low, iv.high, cstats.beats(iv)
        out[str(bs)] = {
            "best": best,
            "best_ms": medians[best],
            "preset_ms": medians[preset],
            "ratio": medians[preset] / medians[best],
            "ratio_low": low,
            "ratio_high": high,
            "beyond_noise": beyond,
        }
    return out


STOCK_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")


def serving_stock(entry: dict[str, Any]) -> dict[str, Any]:
    """The stock user a preset's serving plan is measured against under its traffic: plain
    `torch.compile` in the stock mode the tune found faster at the preset's batch size
    (`stock_compile_config`, `default` where it named none), in fp32, the model's own dtype."""
    config = entry.get("stock_compile_config")
    return {"mode": config if config in STOCK_MODES else "default", "dtype": "fp32"}


def packaged_plan(serving: dict[str, Any], folder: str) -> dict[str, Any]:
    """A bundle job's serving plan as serving.json records it: each bucket's package file named by
    its path in the export (`folder`/FILE)."""
    packages = serving.get("packages")
    if not packages:
        return serving
    return {**serving, "packages": {b: {**p, "file": f"{folder}/{p['file']}"} for b, p in packages.items()}}


def _count(n: int, one: str, many: str) -> str:
    return f"{n} {one if n == 1 else many}"
