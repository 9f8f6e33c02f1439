"""`reports.kernels` on hand-built kernel_choices rows: one line per op signature, the first fresh
benchmark's times, the winner's tiles and its gain over the fastest extern kernel."""

from __future__ import annotations

import json

import pytest

from reports.kernels import render, summarize, tiles


def _row(op_index, choice, kind, ms, winner, from_cache=False, shapes=("16x768", "768x768"), job="j1", **cfg):
    return {
        "job_id": job,
        "hardware": "H100",
        "op": "mm",
        "op_index": op_index,
        "input_shapes": list(shapes),
        "input_dtypes": ["float32", "float32"],
        "choice": choice,
        "kind": kind,
        "config": json.dumps(cfg),
        "time_ms": ms,
        "is_winner": winner,
        "from_cache": from_cache,
    }


def test_one_line_per_signature_from_the_fresh_benchmark():
    rows = [
        # op 0: cached timings of a signature first benchmarked later in the graph (op 1)
        _row(0, "mm", "extern", 0.9, False, from_cache=True),
        _row(
            0,
            "triton_mm_1",
            "triton_template",
            0.5,
            True,
            from_cache=True,
            BLOCK_M=64,
            BLOCK_N=32,
            num_warps=4,
        ),
        _row(1, "mm", "extern", 0.1, False),
        _row(
            1, "triton_mm_1", "triton_template", 0.04, True, BLOCK_M=64, BLOCK_N=32, num_warps=4, num_stages=3
        ),
        _row(1, "triton_mm_2", "triton_template", None, False, BLOCK_M=128, BLOCK_N=128),
        # another signature, where ATen won
        _row(2, "mm", "extern", 0.2, True, shapes=("3152x768", "768x3072")),
        _row(2, "triton_mm_3", "triton_template", 0.3, False, shapes=("3152x768", "768x3072")),
    ]
    summary = summarize(rows)
    assert [s["input_shapes"][0] for s in summary] == ["16x768", "3152x768"]
    small, big = summary
    assert small["times_tuned"] == 2 and small["candidates"] == 3
    assert small["winner"]["choice"] == "triton_mm_1" and small["winner_ms"] == 0.04
    assert small["best_extern_ms"] == 0.1 and small["best_template_ms"] == 0.04
    assert small["extern_over_winner"] == pytest.approx(2.5)
    assert big["winner"]["kind"] == "extern" and big["extern_over_winner"] == pytest.approx(1.0)
    text = render(summary)
    assert "triton_template: triton_mm_1 | 64x32 w4 s3 | 0.0400 | 0.1000 | 0.0400 | 2.50x" in text
    assert len(text.splitlines()) == 2 + 2


def test_tiles_of_configs_that_are_not_templates():
    assert tiles('{"backend": "extern"}') == ""
    assert tiles("not json") == "" and tiles(None) == ""
    assert tiles('{"BLOCK_M": 16, "BLOCK_N": 32, "BLOCK_K": 128, "num_warps": 2}') == "16x32x128 w2"


def test_the_emitted_kernel_is_shown_where_epilogue_fusion_chose_another():
    rows = [
        {**_row(0, "mm", "extern", 0.10, True), "emitted": False},
        {**_row(0, "triton_mm_4", "triton_template", 0.12, False), "emitted": True},
        {**_row(1, "mm", "extern", 0.2, True, shapes=("3152x768", "768x3072")), "emitted": True},
        _row(2, "mm", "extern", 0.3, True, shapes=("1x1", "1x1")),  # written before `emitted` existed
    ]
    text = render(summarize(rows))
    fused, old, same = text.splitlines()[2:]  # sorted by shapes: 16x768, 1x1, 3152x768
    assert fused.endswith("| 1.00x | triton_template: triton_mm_4 (epilogue fusion) |")
    assert same.endswith("| = |") and old.endswith("| - |")


def test_a_partial_compile_counts_but_a_finished_one_speaks_for_the_signature():
    """Rows kept from a compile that timed out (`partial`) count as a tuning of the signature; where
    a finished compile tuned it too, its benchmark is the line's, since it knows what was emitted."""
    rows = [
        {**_row(0, "mm", "extern", 0.30, True, job="cut"), "partial": True},
        {**_row(0, "triton_mm_1", "triton_template", 0.35, False, job="cut"), "partial": True},
        {**_row(0, "mm", "extern", 0.10, True, job="whole"), "partial": False, "emitted": True},
        {
            **_row(0, "triton_mm_1", "triton_template", 0.12, False, job="whole"),
            "partial": False,
            "emitted": False,
        },
    ]
    (line,) = summarize(rows)
    assert line["winner"]["job_id"] == "whole" and line["times_tuned"] == 2 and line["partial_instances"] == 1
    assert (
        render([line])
        .splitlines()[2]
        .startswith("| H100 | mm | 16x768 , 768x768 | float32 | 2 (1 partial) | 2 |")
    )
    assert render([line]).endswith("| = |")
    (only_cut,) = summarize(rows[:2])
    assert render([only_cut]).endswith(
        "| 1 (1 partial) | 2 | extern: mm |  | 0.3000 | 0.3000 | 0.3500 | 1.00x | none (partial compile) |"
    )


def test_one_job_run_twice_is_two_tunings_not_one_op_with_twice_the_candidates():
    """A job cancelled mid-autotune (its partial rows kept) and run again by `--resume` has the same
    job_id and op indexes under two run_ids: two tunings of the signature, two candidates each."""
    first = [{**_row(0, c, k, ms, w), "run_id": "r1", "partial": True} for c, k, ms, w in CANDIDATES]
    again = [{**_row(0, c, k, ms / 2, w), "run_id": "r2", "partial": False} for c, k, ms, w in CANDIDATES]
    (line,) = summarize(first + again)
    assert (line["times_tuned"], line["partial_instances"], line["candidates"]) == (2, 1, 2)
    assert line["winner"]["run_id"] == "r2" and line["winner_ms"] == 0.05


CANDIDATES = [("mm", "extern", 0.1, True), ("triton_mm_1", "triton_template", 0.2, False)]
