"""The axes of the report pages' charts (`reports.charts`): a log-scaled axis for ratios (speedups,
gains, latency ratios: 1-2-5 ticks, or finer, at least four, 1x among them) and a linear one from
0 for figures measured once (compile times)."""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass


def _finite(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


LOG_STEPS = (
    (1.0,),
    (1.0, 2.0, 5.0),
    (1.0, 1.5, 2.0, 3.0, 5.0, 7.0),
    (1.0, 1.2, 1.5, 2.0, 2.5, 3.0, 4.0, 5.0, 6.0, 8.0),
)
"""The mantissas of a log axis's ticks, sparsest first: the first that gives four ticks is used;
an axis too narrow for any (within a factor of 3 or so) takes ticks at an even step instead."""
EVEN_STEPS = (0.5, 0.25, 0.2, 0.1, 0.05, 0.025, 0.02, 0.01)
LEAST_TICKS, MOST_TICKS = 4, 12
MIN_SPAN = 1.25
"""A log axis reaches at least 1/1.25x to 1.25x: a chart of figures near 1x keeps a readable scale."""


@dataclass(frozen=True)
class Tick:
    value: float
    x: float
    label: str


@dataclass(frozen=True)
class LogAxis:
    """A log-scaled axis from `low` to `high` over `width` pixels from `left`."""

    low: float
    high: float
    left: float
    width: float

    @classmethod
    def over(cls, values: Iterable[float | None], left: float, width: float) -> LogAxis:
        """The axis over `values` (their positive, finite ones) and 1, at least `MIN_SPAN` either
        side of 1, padded by 4% of its span each side."""
        shown = [float(v) for v in values if _finite(v) and v > 0]
        low, high = min([*shown, 1 / MIN_SPAN]), max([*shown, MIN_SPAN])
        pad = 0.04 * math.log(high / low)
        return cls(low * math.exp(-pad), high * math.exp(pad), left, width)

    def x(self, value: float) -> float:
        value = min(max(value, self.low), self.high)
        return round(self.left + self.width * math.log(value / self.low) / math.log(self.high / self.low), 1)

    def ticks(self, unit: str = "x") -> list[Tick]:
        """At least `LEAST_TICKS` ticks at 1-2-5 (or finer) steps, or at an even step where the
        axis is narrow; 1 among them."""
        decades = range(math.floor(math.log10(self.low)), math.floor(math.log10(self.high)) + 1)
        found: list[float] = []
        for steps in LOG_STEPS:
            found = [
                v
                for e in decades
                for m in steps
                if self.low <= (v := float(f"{m * 10.0**e:.6g}")) <= self.high
            ]
            if len(found) >= LEAST_TICKS:
                break
        else:
            for step in EVEN_STEPS:
                first, last = math.ceil(self.low / step), math.floor(self.high / step)
                found = [float(f"{i * step:.6g}") for i in range(first, last + 1)]
                if len(found) >= LEAST_TICKS:
                    break
        if len(found) > MOST_TICKS:  # thinned, keeping 1x
            every = math.ceil(len(found) / MOST_TICKS)
            one = found.index(1.0) if 1.0 in found else 0
            found = [v for i, v in enumerate(found) if (i - one) % every == 0]
        return [Tick(v, self.x(v), f"{v:g}{unit}") for v in found]


def linear_ticks(top: float, unit: str, left: float, width: float) -> tuple[float, list[Tick]]:
    """A linear axis from 0 to just above `top`: its end and its ticks at a 1-2-5 step."""
    top = top if top > 0 else 1.0
    raw = top / 5
    base = 10.0 ** math.floor(math.log10(raw))
    step = next(m * base for m in (1, 2, 5, 10) if m * base >= raw)
    end = step * math.ceil(top / step)
    values = [float(f"{i * step:.6g}") for i in range(int(round(end / step)) + 1)]
    return end, [Tick(v, round(left + width * v / end, 1), f"{v:g}{unit}") for v in values]
