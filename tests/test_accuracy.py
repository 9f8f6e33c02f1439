"""Accuracy budgets (`compiler.accuracy`): what a budget lets each hardware class search, and why the
other policies are out; when a cell's outputs can judge precision at all; and `orchestrate plan`
saying so before anything runs."""

from __future__ import annotations

import pytest

from compiler import accuracy
from compiler import statistics as cstats
from compiler.capabilities import known
from orchestrator.cli import main
from orchestrator.spec.sweep import SpecError, parse_spec

TH = cstats.load_thresholds()


def test_budgets_parse_names_levels_and_numbers_and_refuse_the_rest():
    assert accuracy.parse_budget("stock").kind == "stock"
    assert accuracy.parse_budget("bfloat16") == accuracy.AccuracyBudget("bf16")  # the precision aliases too
    assert accuracy.parse_budget(0.02) == accuracy.AccuracyBudget("0.02", 0.02)
    assert accuracy.parse_budget("1e-3").value == 1e-3
    for bad, match in (
        ("fp64", "unknown accuracy budget"),
        (2, r"in \(0, 1\)"),
        (True, "not True"),
        ("fp32", "unknown"),
    ):
        with pytest.raises(ValueError, match=match):
            accuracy.parse_budget(bad)
    with pytest.raises(ValueError, match="given twice"):
        accuracy.parse_budgets(["bf16", "bfloat16"])


def searched(budget: str, cls: str) -> dict[str, str]:
    return {
        c.policy: c.why
        for c in accuracy.policies_for(accuracy.parse_budget(budget), known(cls))
        if c.searched
    }


def test_each_class_searches_what_it_runs_natively_up_to_the_budgets_level():
    assert set(searched("bf16", "A100")) == {"fp32", "tf32", "fp16", "bf16"}
    assert set(searched("bf16", "V100")) == set(searched("bf16", "T4")) == {"fp32", "fp16"}
    assert set(searched("tf32", "H100")) == {"fp32", "tf32"}  # fp16 rounds its activations too
    assert set(searched("stock", "H100")) == {"fp32", "tf32"}  # stock convolutions run TF32 already
    assert set(searched("stock", "T4")) == {"fp32"}  # no TF32 there: stock is float32 throughout
    assert set(searched("0.2", "T4")) == {"fp32", "fp16"}  # a number: every policy the class runs
    out = {
        c.policy: c.why
        for c in accuracy.policies_for(accuracy.AccuracyBudget("bf16"), known("T4"))
        if not c.searched
    }
    assert "no native bf16" in out["bf16"] and "TF32 is a tensor-core format of sm80+" in out["tf32"]
    assert "stricter than the cell's own fp32" in out["fp32-strict"]
    restricted = accuracy.policies_for(accuracy.AccuracyBudget("bf16"), known("A100"), restrict=["bf16"])
    assert {c.policy for c in restricted if c.searched} == {"fp32", "bf16"}
    assert next(c for c in restricted if c.policy == "tf32").why == "not among --precisions"


def figures(stock_err=1e-3, spread=1.5, sens=(1.0, 1.0, 1.0), weights="random"):
    return accuracy.CellFigures(stock_err, spread, sens, weights)


@pytest.mark.parametrize(
    ("budget", "cell", "why"),
    [
        ("bf16", figures(stock_err=0.2), "already off by 0.2 against fp64"),  # owlvit-like: TF32 convs
        ("bf16", figures(spread=0.02), "nearly constant"),  # detr's boxes: a sigmoid near 0.5
        ("bf16", figures(sens=(3e-10, 3e-10, 3e-10)), "barely depend on the inputs"),  # biases only
        ("bf16", figures(sens=(0.1, 1.3, 256.0)), "ill-conditioned"),  # a box head that jumps at 2^-8
        ("bf16", figures(stock_err=None), "no error against fp64 was measured"),
    ],
)
def test_random_weights_that_cannot_judge_precision_are_undetermined(budget, cell, why):
    j = accuracy.judge(accuracy.parse_budget(budget), cell, TH)
    assert j.decision == "undetermined" and why in j.why and "keeps its own precision" in j.why


def test_judged_cells_get_the_budgets_tolerance_and_real_weights_are_judged_as_they_are():
    j = accuracy.judge(accuracy.AccuracyBudget("bf16"), figures(), TH)
    assert j.decision == "determined" and j.tolerance == TH.accuracy_bf16
    # the stock budget is relative to the stock policy's own error, with a floor
    assert accuracy.judge(accuracy.AccuracyBudget("stock"), figures(stock_err=1e-3), TH).tolerance == 2e-3
    assert (
        accuracy.judge(accuracy.AccuracyBudget("stock"), figures(stock_err=1e-9), TH).tolerance
        == TH.accuracy_floor
    )
    # the ill-conditioning that bf16's rounding shows is no reason under the stock budget (TF32 at most)
    assert (
        accuracy.judge(accuracy.AccuracyBudget("stock"), figures(sens=(0.1, 1.3, 256.0)), TH).decision
        == "determined"
    )
    # a checkpoint's outputs judge precision whatever they look like
    real = accuracy.judge(accuracy.AccuracyBudget("bf16"), figures(spread=0.0, weights="/ckpt/vit"), TH)
    assert real.decision == "determined" and "/ckpt/vit" in real.why


def test_a_candidate_of_another_precision_needs_a_determined_cell_and_its_error_within():
    ok = accuracy.judge(accuracy.AccuracyBudget("bf16"), figures(), TH)
    bad = accuracy.judge(accuracy.AccuracyBudget("bf16"), figures(spread=0.0), TH)
    row = {"dtype": "bf16", "fp64_max_rel_err": 0.01, "eager_fp64_max_rel_err": 0.2}
    assert accuracy.within(row, "compiled", ok) == (True, None)
    assert accuracy.within(row, "eager", ok)[1] == "error against fp64 0.2 over the budget's 0.05"
    assert "undetermined" in accuracy.within(row, "compiled", bad)[1]
    assert accuracy.within({"dtype": "fp32"}, "compiled", bad) == (True, None)  # its own precision


def test_figures_come_from_the_cells_own_precision_rows():
    rows = [
        {
            "dtype": "fp32",
            "status": "ok",
            "eager_fp64_max_rel_err": 1e-3,
            "output_spread": 1.2,
            "output_sensitivity": [0.5, 0.6, 0.7],
            "weights": "random",
        },
        {
            "dtype": "fp32",
            "status": "ok",
            "eager_fp64_max_rel_err": 2e-3,
            "output_spread": 0.9,
            "output_sensitivity": [0.4, 0.9, 3.0],
            "weights": "random",
        },
        {"dtype": "bf16", "status": "ok", "eager_fp64_max_rel_err": 0.5, "output_spread": 0.0},
        {"dtype": "fp32", "status": "crash"},
    ]
    got = accuracy.figures_of_rows(rows)
    assert got == accuracy.CellFigures(2e-3, 0.9, (0.5, 0.9, 3.0), "random")


BUDGETED = """\
name: budgeted
models: [python:workers.toy:mlp]
batch_sizes: [4]
configs: {default: {}, ro: {mode: reduce-overhead}}
hardware: [A100, V100, T4]
accuracy: bf16
"""


def test_plan_shows_fp16_for_v100_and_t4_under_a_bf16_budget_with_reasons(tmp_path, capsys):
    sweep = tmp_path / "budgeted.yaml"
    sweep.write_text(BUDGETED)
    assert main(["plan", str(sweep)]) == 0
    out = capsys.readouterr().out
    jobs = [line.split()[1] for line in out.splitlines() if line.strip()[:1].isdigit() and "/mlp/" in line]
    policies = {
        cls: {j.split("/")[3] for j in jobs if j.startswith(f"{cls}/")} for cls in ("A100", "V100", "T4")
    }
    assert policies == {
        "A100": {"fp32", "tf32", "fp16", "bf16"},
        "V100": {"fp32", "fp16"},
        "T4": {"fp32", "fp16"},
    }
    for cls, sm in (("V100", "sm70"), ("T4", "sm75")):
        assert f"  {cls}, bf16 budget: searches fp32, fp16\n" in out
        assert f"    - bf16: {cls} ({sm}) has no native bf16 (sm80+)" in out
        assert f"    - tf32: {cls} ({sm}): TF32 is a tensor-core format of sm80+, so tf32 would run" in out
        assert "    + fp16: within the bf16 budget's level" in out


def test_a_sweeps_accuracy_is_checked_with_the_file_and_line():
    with pytest.raises(SpecError) as err:
        parse_spec(BUDGETED.replace("accuracy: bf16", "accuracy: [bf16, fp64, bf16]"), "b.yaml")
    text = str(err.value)
    assert "b.yaml:6: unknown accuracy budget 'fp64'" in text and "appears twice" in text
    with pytest.raises(SpecError, match="names one policy, the model's own"):
        parse_spec(BUDGETED + "dtypes: [fp32, bf16]\n", "b.yaml")
    spec = parse_spec(BUDGETED.replace("accuracy: bf16", "accuracy: [stock, 0.02]"))
    assert [b.name for b in spec.accuracy] == ["stock", "0.02"]
