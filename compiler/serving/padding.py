"""Serving a batch on a larger graph: pad the inputs' batch dimension up, slice the outputs back,
and the check that proves this harmless for a model before any plan relies on it.

Padding repeats the batch's last row, so the padded rows are inputs of the kind the model sees
(zeros can be far from them: a normalisation of an all-zero image divides by a tiny variance).
A model whose rows interact (a batch statistic, attention across the batch, `x - x.mean(0)`)
gives its real rows other outputs once padded: `check_padding` runs the model eagerly on a batch
and on the same batch padded, and compares the real rows' outputs within a tolerance (the accuracy
budget's). A model that fails is served by a plan without padding (one dynamic-batch graph).

The batch dimension is dimension 0 of every input tensor whose size there is the batch's.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


def map_tensors(tree: Any, fn: Callable[[Any], Any]) -> Any:
    """`tree` with `fn` applied to each tensor: tensors, tuples (named ones too), lists and mappings
    (a model's output class, such as a Hugging Face `ModelOutput`, rebuilt as its own type)."""
    import torch

    if isinstance(tree, torch.Tensor):
        return fn(tree)
    if isinstance(tree, tuple) and hasattr(tree, "_fields"):
        return type(tree)(*(map_tensors(v, fn) for v in tree))
    if isinstance(tree, (tuple, list)):
        return type(tree)(map_tensors(v, fn) for v in tree)
    if isinstance(tree, dict):
        items = {k: map_tensors(v, fn) for k, v in tree.items()}
        try:
            return type(tree)(**items) if type(tree) is not dict else items
        except TypeError:
            return items
    return tree


def batch_size(args: tuple, kwargs: dict) -> int:
    """The batch size of a call: dimension 0 of its first tensor (ValueError without one)."""
    import torch
    import torch.utils._pytree as pytree

    for leaf in pytree.tree_leaves((args, kwargs)):
        if isinstance(leaf, torch.Tensor) and leaf.dim() > 0:
            return int(leaf.shape[0])
    raise ValueError("the call has no tensor with a batch dimension")


def resize_batch(
    args: tuple, kwargs: dict, size: int, batch: int | None = None, fill: str = "repeat"
) -> tuple[tuple, dict]:
    """The call's inputs with batch `size`: each tensor with the batch's size in dimension 0 cut
    to `size` rows, or padded to it. `fill` "repeat" (what serving does) repeats the last row;
    "contrast" (what the padding check adds) pads with rows unlike the real ones: the real rows
    in reverse order, cyclically, negated where they are floating point, so that a model whose
    rows interact (a batch mean) sees its batch change."""
    import torch

    batch = batch_size(args, kwargs) if batch is None else batch

    def resize(t: Any) -> Any:
        if not isinstance(t, torch.Tensor) or t.dim() == 0 or t.shape[0] != batch:
            return t
        if size <= batch:
            return t[:size]
        if fill == "repeat":
            return torch.cat([t, t[-1:].expand(size - batch, *t.shape[1:])])
        rows = t.flip(0)[torch.arange(size - batch, device=t.device) % batch]
        return torch.cat([t, -rows if t.is_floating_point() else rows])

    return map_tensors(args, resize), map_tensors(kwargs, resize)


def slice_batch(out: Any, padded: int, size: int) -> Any:
    """A padded call's outputs with the real rows only: every tensor whose dimension 0 is the padded
    batch cut to its first `size` rows (a view)."""
    import torch

    if padded == size:
        return out
    return map_tensors(
        out, lambda t: t[:size] if isinstance(t, torch.Tensor) and t.dim() and t.shape[0] == padded else t
    )


def concat_batches(parts: list[Any], sizes: list[int]) -> Any:
    """The outputs of consecutive chunks of one batch (`parts`, of `sizes` rows each) as one: every
    tensor with its chunk's rows in dimension 0 concatenated; anything else taken from the first."""
    import torch

    first = parts[0]
    flat_parts = [leaves(p) for p in parts]
    joined = []
    for i, leaf in enumerate(flat_parts[0]):
        if (
            isinstance(leaf, torch.Tensor)
            and leaf.dim()
            and all(
                isinstance(fp[i], torch.Tensor) and fp[i].shape[0] == n
                for fp, n in zip(flat_parts, sizes, strict=True)
            )
        ):
            joined.append(torch.cat([fp[i] for fp in flat_parts]))
        else:
            joined.append(leaf)
    it = iter(joined)
    return map_tensors(first, lambda _t: next(it))


def leaves(tree: Any) -> list[Any]:
    """The tensors of `tree` (as `map_tensors` walks it), in order."""
    found: list[Any] = []
    map_tensors(tree, lambda t: found.append(t) or t)
    return found


@dataclass(frozen=True)
class PaddingCheck:
    """Whether padding a batch leaves its real rows' outputs as they were (`ok`), the largest
    difference seen relative to the output's scale (`max_rel_diff`), the tolerance, the (size,
    padded to) pairs checked, and why it failed (`reason`, "" when ok)."""

    ok: bool
    max_rel_diff: float
    tolerance: float
    checked: tuple[tuple[int, int], ...]
    reason: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "max_rel_diff": self.max_rel_diff,
            "tolerance": self.tolerance,
            "checked": [list(p) for p in self.checked],
            "reason": self.reason,
        }


def rows_proven_independent(check: dict[str, Any]) -> bool:
    """Whether a padding check (`PaddingCheck.to_dict()`, as serving.json records it) proved that the
    model's rows do not interact: it padded some size and passed. A ladder of every size pads
    nothing, so its check passes without proving anything."""
    return bool(check.get("ok") and check.get("checked"))


def check_padding(
    model: Callable[..., Any],
    args: tuple,
    kwargs: dict,
    pairs: list[tuple[int, int]],
    tolerance: float,
) -> PaddingCheck:
    """Run `model` eagerly (under no_grad) at each (size, padded) pair of `pairs`, on the example
    call resized to `size` and on that batch padded to `padded`, both as serving pads (the last row
    repeated) and with contrasting rows (`resize_batch`), and compare the real rows' outputs: the
    largest |difference| over the largest |output| of each output tensor must be within
    `tolerance`. The first pair over it ends the check (`ok` False, with the reason)."""
    worst, checked = 0.0, []
    for size, padded in pairs:
        for fill in ("repeat", "contrast"):
            failed, worst = _check_pair(model, args, kwargs, size, padded, fill, tolerance, worst)
            if failed:
                checked.append((size, padded))
                return PaddingCheck(False, worst, tolerance, tuple(checked), failed)
        checked.append((size, padded))
    return PaddingCheck(True, worst, tolerance, tuple(checked))


def _check_pair(
    model: Callable[..., Any],
    args: tuple,
    kwargs: dict,
    size: int,
    padded: int,
    fill: str,
    tolerance: float,
    worst: float,
) -> tuple[str, float]:
    """(why padding `size` rows to `padded` with `fill` changed the real rows' outputs, or "";
    the largest relative difference so far)."""
    import torch

    a_args, a_kwargs = resize_batch(args, kwargs, size)
    p_args, p_kwargs = resize_batch(a_args, a_kwargs, padded, size, fill)
    with torch.no_grad():
        plain = leaves(model(*a_args, **a_kwargs))
        cut = leaves(slice_batch(model(*p_args, **p_kwargs), padded, size))
    what = f"padding {size} rows to {padded} ({fill})"
    if len(plain) != len(cut):
        return f"{what} changed the outputs' structure", float("inf")
    for i, (x, y) in enumerate(zip(plain, cut, strict=True)):
        if not isinstance(x, torch.Tensor):
            continue
        if x.shape != y.shape:
            return f"{what} changed output {i}'s shape {list(x.shape)} to {list(y.shape)}", float("inf")
        if not x.numel():
            continue
        if x.is_floating_point():
            scale = float(x.double().abs().max())
            diff = float((x.double() - y.double()).abs().max()) / max(scale, 1e-12)
        else:
            diff = float((x != y).any())
        worst = max(worst, diff)
        if not diff <= tolerance:
            return (
                f"the model's rows interact: {what} changed the real rows' output {i} by {diff:.3g} of its "
                f"scale (tolerance {tolerance:g})",
                worst,
            )
    return "", worst


def padding_tolerance(precision: str | None) -> float:
    """How far padding may move the real rows' outputs, relative to their scale, for a preset of
    `precision`: the accuracy level of that precision in `compiler.statistics`'s thresholds
    (bf16, fp16; TF32's for fp32, whose convolutions run in TF32 on a GPU by torch's default).
    Kernels differ between batch sizes, so outputs move by their rounding; rows that interact
    move them by far more under the contrasting padding."""
    from compiler.statistics import load_thresholds

    t = load_thresholds()
    return {"bf16": t.accuracy_bf16, "fp16": t.accuracy_fp16}.get(precision or "", t.accuracy_tf32)


def check_ladder(
    model: Callable[..., Any],
    args: tuple,
    kwargs: dict,
    low: int,
    high: int,
    precision: str | None,
    ladder: Callable[[int, int], list[int]] | None = None,
) -> tuple[list[int], PaddingCheck]:
    """A bucket ladder of [`low`, `high`] (`ladder`; by default
    `compiler.serving.traffic.default_buckets`) and the padding check of `model` over it
    (`check_padding` at each bucket's most padding, with the tolerance of `precision`): the
    buckets a plan pads to, and whether it may."""
    from compiler.serving.traffic import default_buckets

    buckets = (ladder or default_buckets)(low, high)
    return buckets, check_padding(
        model, args, kwargs, padding_pairs(buckets, low), padding_tolerance(precision)
    )


def padding_pairs(buckets: list[int], low: int) -> list[tuple[int, int]]:
    """The (size, bucket) pairs a check runs for a bucket plan: for each bucket, the smallest size
    it serves (the most padding it adds), where that pads at all."""
    pairs, lower = [], low - 1
    for b in sorted(buckets):
        smallest = max(lower + 1, low)
        if smallest < b:
            pairs.append((smallest, b))
        lower = b
    return pairs
