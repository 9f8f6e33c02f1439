"""docs/results/serving-summary.json, the serving results the results page (serving-h200.md)
reads: per budget and traffic, the GPU, the software and the commands, and per model the fields
the serving targets are judged on, each consistent with the others."""

from __future__ import annotations

import json
from pathlib import Path

SUMMARY = Path(__file__).resolve().parents[2] / "docs/results/serving-summary.json"

MODEL_KEYS = {
    "model",
    "precision",
    "plan",
    "buckets",
    "prepare_s",
    "max_first_call_s",
    "compiles_after_prepare",
    "weighted_ms_served",
    "weighted_ms_oracle",
    "weighted_ms_stock",
    "stall_s_stock",
    "p99_ms_served",
    "peak_mem_gib",
}


def test_every_budgets_models_carry_the_fields_their_targets_are_judged_on():
    doc = json.loads(SUMMARY.read_text())
    assert {s["budget"] for s in doc} >= {"bf16", "stock"}
    for summary in doc:
        assert summary["gpu"] and summary["torch"] and summary["commands"], summary["budget"]
        assert summary["traffic"]["min"] <= summary["traffic"]["max"]
        names = [m["model"] for m in summary["models"]]
        assert len(names) == len(set(names)), names  # one entry per model and budget
        for m in summary["models"]:
            assert m.keys() >= MODEL_KEYS, (summary["budget"], m["model"], MODEL_KEYS - m.keys())
            assert m["plan"] in ("buckets", "dynamic"), m["model"]
            if m["plan"] == "buckets":  # every size of the range is served by a bucket at or above it
                assert m["buckets"] == sorted(m["buckets"]) and m["buckets"][-1] == summary["traffic"]["max"]
            if "prepare_s_runs" in m:  # the slowest fresh process's prepare is the one reported
                assert m["prepare_s"] == max(m["prepare_s_runs"]), m["model"]
            assert min(m["weighted_ms_served"], m["weighted_ms_oracle"], m["weighted_ms_stock"]) > 0
