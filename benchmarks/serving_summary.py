"""The serving summary `benchmarks/serving_traffic.py --summary FILE` adds a model to
(docs/results/serving-summary.json): a list with one object per accuracy budget and traffic,
each with the GPU, the software and every model's figures; and its judge against the serving
targets, `python benchmarks/serving_summary.py [FILE]`, which prints each budget's table and
exits 1 where a target is missed."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path

from compiler.hardware import software_stack
from compiler.serving.traffic import ServingProfile


def add_to_summary(path: Path, args: argparse.Namespace, profile: ServingProfile, entry: dict) -> None:
    """`entry` in the serving summary at `path` (a list, one object per budget: the GPU, the
    software, the budget, the traffic and each model's figures), replacing the model's entry of
    that budget; written whole."""
    import platform

    import torch

    summaries = json.loads(path.read_text()) if path.exists() else []
    traffic = {"min": profile.min, "max": profile.max, "weights": args.traffic or "uniform"}
    found = next((s for s in summaries if s["budget"] == args.budget and s["traffic"] == traffic), None)
    if found is None:
        found = {"budget": args.budget, "traffic": traffic, "models": []}
        summaries.append(found)
    stack = software_stack()
    found.update(
        gpu=torch.cuda.get_device_name() if args.device == "cuda" else platform.processor() or "cpu",
        torch=stack["torch"],
        cuda=stack["cuda"],
        triton=stack["triton"],
        requests=args.requests,
        seed=args.seed,
    )
    found["models"] = [m for m in found["models"] if m["model"] != entry["model"]] + [entry]
    path.write_text(json.dumps(summaries, indent=1) + "\n")


@dataclass(frozen=True)
class ServingTargets:
    """What a served plan must meet under traffic, per model and over a budget's models (the
    geometric means): the targets the published serving results are judged on."""

    max_first_call_s: float = 0.5
    """Every batch size's first call after preparation, in seconds."""
    oracle_geomean: float = 1.10
    """Served / the per-size oracle's traffic-weighted latency, geometric mean over models..."""
    oracle_each: float = 1.25
    """...and for each model."""
    stock_geomean: dict[str, float] = field(default_factory=lambda: {"bf16": 2.0, "stock": 1.10})
    """The stock user's traffic-weighted latency / the served plan's (stalls excluded), geometric
    mean over models, per budget (a budget not named: `stock_each`)..."""
    stock_each: float = 1.0
    """...and for each model: losing to stock is no speedup."""
    prepare_s: float = 10.0
    """The slowest fresh process's prepare, per model."""

    def stock_geomean_for(self, budget: str) -> float:
        return self.stock_geomean.get(budget, self.stock_each)


TARGETS = ServingTargets()


def judge(summary: dict, targets: ServingTargets = TARGETS) -> tuple[list[dict], list[str], dict]:
    """One budget's models judged against `targets`: a row per model (its ratios), the targets
    missed, each a sentence naming the model or the geometric mean, and the geometric means over
    the models (`oracle`, `stock`; None without models)."""
    from orchestrator.tune.deployed import geomean  # here: the traffic benchmark's children import this file

    rows, missed = [], []
    for m in summary["models"]:
        row = {
            "model": m["model"],
            "precision": m.get("precision"),
            "plan": m["plan"] if m["plan"] != "buckets" else f"{len(m['buckets'])} buckets",
            "prepare_s": m["prepare_s"],
            "max_first_call_s": m["max_first_call_s"],
            "compiles": m["compiles_after_prepare"],
            "vs_oracle": m["weighted_ms_served"] / m["weighted_ms_oracle"],
            "vs_stock": m["weighted_ms_stock"] / m["weighted_ms_served"],
        }
        rows.append(row)
        name = m["model"]
        if row["compiles"]:
            missed.append(f"{name}: {row['compiles']} compiles after preparing (target 0)")
        if row["max_first_call_s"] >= targets.max_first_call_s:
            missed.append(
                f"{name}: a first call took {row['max_first_call_s']:.3f} s (under {targets.max_first_call_s} s)"
            )
        if row["vs_oracle"] > targets.oracle_each:
            missed.append(f"{name}: {row['vs_oracle']:.3f}x the oracle (at most {targets.oracle_each}x)")
        if row["vs_stock"] < targets.stock_each:
            missed.append(f"{name}: {row['vs_stock']:.3f}x the stock user (at least {targets.stock_each}x)")
        if row["prepare_s"] > targets.prepare_s:
            missed.append(f"{name}: prepared in {row['prepare_s']:.2f} s (at most {targets.prepare_s} s)")
    means = {
        "oracle": geomean([r["vs_oracle"] for r in rows]),
        "stock": geomean([r["vs_stock"] for r in rows]),
    }
    if means["oracle"] is not None and means["oracle"] > targets.oracle_geomean:
        missed.append(f"geometric mean {means['oracle']:.3f}x the oracle (at most {targets.oracle_geomean}x)")
    want = targets.stock_geomean_for(summary["budget"])
    if means["stock"] is not None and means["stock"] < want:
        missed.append(f"geometric mean {means['stock']:.3f}x the stock user (at least {want}x)")
    return rows, missed, means


def _print_judged(summary: dict, rows: list[dict], missed: list[str], means: dict) -> None:
    t = summary["traffic"]
    print(
        f"budget {summary['budget']}: {len(rows)} models, batch {t['min']}..{t['max']} "
        f"({t['weights']}), {summary.get('gpu')}, torch {summary.get('torch')}"
    )
    print(
        "| model | precision | plan | prepare s | max first call s | compiles | served / oracle | vs stock |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['model']} | {r['precision']} | {r['plan']} | {r['prepare_s']:.2f} | {r['max_first_call_s']:.3f} | "
            f"{r['compiles']} | {r['vs_oracle']:.3f}x | {r['vs_stock']:.3f}x |"
        )
    if rows:
        print(f"geometric mean: {means['oracle']:.3f}x the oracle, {means['stock']:.3f}x the stock user")
    print("every target met" if not missed else "MISSED: " + "; ".join(missed))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description="Judge a serving summary against the serving targets: per budget, each model's "
        "served / oracle and stock / served traffic-weighted latency, prepare seconds, first calls and "
        "compiles after preparing, and the geometric means over the budget's models. Exits 1 where a "
        "target is missed, 2 where the file cannot be read."
    )
    p.add_argument(
        "summary",
        nargs="?",
        default=str(Path(__file__).resolve().parents[1] / "docs/results/serving-summary.json"),
        help="the summary file (default: docs/results/serving-summary.json)",
    )
    p.add_argument("--budget", help="judge this budget only (default: every budget in the file)")
    args = p.parse_args(argv)
    try:
        summaries = json.loads(Path(args.summary).read_text())
    except (OSError, ValueError) as exc:
        print(f"{args.summary}: cannot read the serving summary: {exc}", file=sys.stderr)
        return 2
    chosen = [s for s in summaries if args.budget in (None, s["budget"])]
    if not chosen:
        print(
            f"{args.summary}: no budget {args.budget!r} (it holds {[s['budget'] for s in summaries]})",
            file=sys.stderr,
        )
        return 2
    failed = False
    for i, summary in enumerate(chosen):
        rows, missed, means = judge(summary)
        if i:
            print()
        _print_judged(summary, rows, missed, means)
        failed |= bool(missed)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
