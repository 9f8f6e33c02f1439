"""The serving summary `benchmarks/serving_traffic.py --summary FILE` adds a model to
(docs/results/serving-summary.json): a list with one object per accuracy budget and traffic,
each with the GPU, the software and every model's figures."""

from __future__ import annotations

import argparse
import json
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
