"""What each setting gained: the answer a user wants first from a tune or a sweep.

Two configs of one cell that differ in exactly one setting (a tuner knob such as
`cudnn_benchmark` or `freezing`, or torch's mode) measure that setting's effect there:
`gain` = the other config's compiled median / this one's (above 1: the setting made the cell
faster), with the interval of `compiler.statistics.ratio_interval` over the two rows' samples
(unpaired: the rows come from different processes). Per hardware class the effects are summed
up across the suite: in how many cells a setting helped (its interval lies above 1, the
project's one "faster than" rule `statistics.beats`), hurt (below 1), gained nothing (at most
the regression report's `latency_change`) or could not be told apart (too noisy), its
geometric-mean gain, and which models it helped and hurt, so a setting that helps
one model family and hurts another says so.

A setting measured in every cell of a class to gain nothing or to hurt is marked `drop`. Where
it is a tuner knob, `orchestrate tune --prune-from PREVIOUS` leaves it out of that class's next
search, and the tune's `tune.json` says why; a mode is never pruned.

Not compiling is a setting too (`EAGER_SETTING`, added by `orchestrator.tune.eager.add_effects`):
its gain is the compiled preset's time / eager's, in the cells where the preset's row timed both.
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from compiler import runtime
from compiler import statistics as cstats
from compiler.config import CompileConfig, inductor_modes, is_eager_preset, preset_runtime
from compiler.precision import POLICIES
from workers.runner import plural

EAGER_SETTING = "eager (do not compile)"
"""The setting of an eager preset (`orchestrator.tune.eager`) in the "what won" table."""


def row_settings(row: dict[str, Any]) -> dict[str, Any]:
    """Everything a results row's config compiled and ran with, as flat key -> value (the mode
    written out as its Inductor options)."""
    from orchestrator.tune.space import expanded_options

    config = CompileConfig("row", mode=row.get("mode"), options=json.loads(row.get("options") or "{}"))
    flat: dict[str, Any] = {f"options.{k}": v for k, v in expanded_options(config).items()}
    flat.update(
        backend=row.get("backend"),
        fullgraph=bool(row.get("fullgraph")),
        dynamic=row.get("dynamic"),
        freezing=bool(row.get("freezing")),
        channels_last=bool(row.get("channels_last")),
        precision=row.get("dtype"),
    )
    flat.update({f"runtime.{k}": v for k, v in runtime.from_json(row.get("runtime")).items()})
    return flat


def _knob_label(diff: dict[str, Any]) -> str | None:
    """The tuner knob whose settings are exactly `diff`, if one is."""
    from orchestrator.tune.space import KNOBS

    for knob in KNOBS:
        want = {f"options.{k}": v for k, v in knob.options.items()}
        want.update({f"runtime.{k}": v for k, v in knob.runtime.items()})
        if knob.freezing:
            want["freezing"] = True
        if knob.channels_last:
            want["channels_last"] = True
        if want == diff:
            return knob.name
    return None


def setting_label(base: dict[str, Any], other: dict[str, Any], other_mode: str | None) -> str | None:
    """What `other` turns on relative to `base` when it is one setting: a knob's name, `mode X`
    (the options of torch's mode X on top of the base's, and nothing else), or `key=value`;
    None when they differ in more than that, or `other` turns something off that is not a knob's
    own setting (a knob such as `no_epilogue_fusion` turns an Inductor default off)."""
    keys = set(base) | set(other)
    if any(k in base and k not in other for k in keys):
        return None  # other drops a setting of the base: not "the base plus one setting"
    diff = {k: other[k] for k in keys if base.get(k) != other.get(k)}
    if not diff:
        return None
    turns_off = any(other.get(k) is False for k in diff)
    if not turns_off and all(k.startswith("options.") for k in diff):
        # exactly one of torch's modes: named as the mode (as `preset_settings` names it), even
        # where a knob sets the same options (reduce-overhead is the `cudagraphs` knob's option)
        for name, mode_opts in sorted(inductor_modes().items()):
            if mode_opts and {f"options.{k}": v for k, v in mode_opts.items()} == diff:
                return f"mode {name}"
    knob = _knob_label(diff)
    if knob and not (turns_off and any(k in base for k in diff)):
        # a knob may turn an Inductor default off (no_epilogue_fusion, no_shape_padding): its
        # settings added to a base that did not set them are its effect
        return knob
    if turns_off:
        return None  # turning a flag off is the base's setting measured the other way round
    if other_mode not in (None, "default") and all(k.startswith("options.") for k in diff):
        mode_opts = {f"options.{k}": v for k, v in inductor_modes().get(other_mode, {}).items()}
        if all(mode_opts.get(k) == v for k, v in diff.items()):
            return f"mode {other_mode}"
    if len(diff) == 1:
        ((k, v),) = diff.items()
        return f"{k.removeprefix('options.')}={json.dumps(v)}"
    return None


@dataclass
class CellEffect:
    """One comparison: two configs of `cell` that differ in just the setting. A cell holds as many
    as it has such pairs (a tune's cell: the setting turned on each base, and in rung 1 again)."""

    cell: str
    model: str
    base_config: str
    config: str
    gain: float
    low: float
    high: float
    verdict: str
    """helps, hurts, same (no gain beyond the project's `latency_change`) or unclear (an
    interval too wide to tell: one short process per side on a noisy host)."""

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass
class SettingEffect:
    hardware: str
    setting: str
    cells: list[CellEffect] = field(default_factory=list)

    @property
    def geomean(self) -> float:
        return math.exp(sum(math.log(c.gain) for c in self.cells) / len(self.cells))

    @property
    def cell_count(self) -> int:
        """The cells its comparisons (`cells`) are in."""
        return len({c.cell for c in self.cells})

    @property
    def measured_in(self) -> str:
        """What it was measured over, e.g. "3 comparisons in 1 cell"."""
        return f"{plural(len(self.cells), 'comparison')} in {plural(self.cell_count, 'cell')}"

    def models(self, verdict: str) -> list[str]:
        return sorted({c.model for c in self.cells if c.verdict == verdict})

    @property
    def verdict(self) -> str:
        """drop (measured in every cell to gain nothing or to hurt: no cell faster, none unclear)
        or keep (it helped somewhere, or the figures are too noisy to rule a gain out)."""
        return "drop" if all(c.verdict in ("hurts", "same") for c in self.cells) else "keep"

    def to_dict(self) -> dict[str, Any]:
        return {
            "cells": len(self.cells),
            "geomean_gain": self.geomean,
            "helped": sum(c.verdict == "helps" for c in self.cells),
            "hurt": sum(c.verdict == "hurts" for c in self.cells),
            "helps_models": self.models("helps"),
            "hurts_models": self.models("hurts"),
            "verdict": self.verdict,
            "why": self.why,
            "per_cell": [c.to_dict() for c in self.cells],
        }

    @property
    def why(self) -> str:
        helped, hurt = self.models("helps"), self.models("hurts")
        text = f"{self.measured_in}, geomean gain {self.geomean:.3f}x"
        if helped:
            text += f"; faster on {', '.join(helped)}"
        if hurt:
            text += f"; slower on {', '.join(hurt)}"
        unclear = sum(c.verdict == "unclear" for c in self.cells)
        if unclear:
            text += f"; {plural(unclear, 'comparison')} too noisy to tell"
        if self.verdict == "drop":
            from orchestrator.tune.space import KNOB_NAMES

            text += "; no gain on any cell"
            if self.setting in KNOB_NAMES:  # what `dropped_knobs` leaves out; modes are never pruned
                text += ": dropped from this class's next search"
        return text


VERDICTS = {"faster": "helps", "slower": "hurts", "no gain": "same", "unclear": "unclear"}


def _verdict(iv: cstats.Interval, thresholds: cstats.Thresholds) -> str:
    """helps, hurts, same (gains at most the project's `latency_change`) or unclear (too noisy)."""
    return VERDICTS[cstats.gain_verdict(iv, thresholds)]


def setting_effects(rows: list[dict[str, Any]]) -> dict[str, dict[str, SettingEffect]]:
    """hardware class -> setting -> its effect in every cell where two ok rows differ in just it
    (each row is compared with every row of its cell that is it minus one setting)."""
    cells: dict[tuple, list[dict[str, Any]]] = defaultdict(list)
    for r in rows:  # a precision is a setting too: a cell's rows of every precision compare
        if r.get("status") == "ok" and r.get("compiled_ms") and not r.get("baseline_config"):
            cells[(r["hardware"], r["model"], r["batch_size"])].append(r)
    found: dict[str, dict[str, SettingEffect]] = defaultdict(dict)
    thresholds = cstats.load_thresholds()  # read once, not per pair of rows
    for (hw, model, bs), cell_rows in sorted(cells.items(), key=lambda kv: tuple(map(str, kv[0]))):
        flat = [(r, row_settings(r)) for r in cell_rows]
        own = min((r["dtype"] for r in cell_rows), key=lambda d: POLICIES[d].rank if d in POLICIES else -1)
        for base, base_flat in flat:
            for other, other_flat in flat:
                if other is base or (other["dtype"] != base["dtype"] and base["dtype"] != own):
                    continue  # a precision's effect: from the cell's own precision, the stock user's
                label = setting_label(base_flat, other_flat, other.get("mode"))
                if label is None:
                    continue
                b, o = cstats.row_groups(base, "compiled"), cstats.row_groups(other, "compiled")
                if b and o:
                    iv = cstats.ratio_interval(b, o, paired=False)
                    gain, low, high = iv.estimate, iv.low, iv.high
                    verdict = _verdict(iv, thresholds)
                else:  # no samples: the medians, without an interval
                    gain = base["compiled_ms"] / other["compiled_ms"]
                    low = high = math.nan
                    verdict = "unclear"
                effect = found[hw].setdefault(label, SettingEffect(hw, label))
                effect.cells.append(
                    CellEffect(
                        f"{hw}/{model}/bs{bs}/{base['dtype']}",
                        model,
                        base["config"],
                        other["config"],
                        gain,
                        low,
                        high,
                        verdict,
                    )
                )
    return dict(found)


def effects_document(effects: dict[str, dict[str, SettingEffect]]) -> dict[str, Any]:
    return {hw: {s: e.to_dict() for s, e in sorted(by.items())} for hw, by in sorted(effects.items())}


def dropped_knobs(document: dict[str, Any]) -> dict[str, dict[str, str]]:
    """hardware class -> knob -> why, for the knobs an earlier tune's `setting_effects` (as in its
    tune.json) measured to gain nothing or to hurt on every cell of that class."""
    from orchestrator.tune.space import KNOB_NAMES

    return {
        hw: {s: e["why"] for s, e in by.items() if s in KNOB_NAMES and e.get("verdict") == "drop"}
        for hw, by in document.items()
    }


def what_won(
    presets: list[dict[str, Any]], effects: dict[str, dict[str, SettingEffect]]
) -> list[dict[str, Any]]:
    """Per hardware class and setting: how many presets use it, and what it gained where it was
    measured against the same config without it. Sorted by class, then presets using it."""
    used: dict[tuple[str, str], int] = defaultdict(int)
    cells: dict[str, int] = defaultdict(int)
    for p in presets:
        cells[p["hardware"]] += 1
        for s in preset_settings(p):
            used[p["hardware"], s] += 1
    table = []
    for hw in sorted(set(cells) | set(effects)):
        names = {s for h, s in used if h == hw} | set(effects.get(hw, {}))
        for s in names:
            e = effects.get(hw, {}).get(s)
            table.append(
                {
                    "hardware": hw,
                    "setting": s,
                    "presets": used.get((hw, s), 0),
                    "of_presets": cells.get(hw, 0),
                    "comparisons": len(e.cells) if e else 0,
                    "cells_measured": e.cell_count if e else 0,
                    "measured_in": e.measured_in if e else None,
                    "geomean_gain": e.geomean if e else None,
                    "helped": sum(c.verdict == "helps" for c in e.cells) if e else 0,
                    "hurt": sum(c.verdict == "hurts" for c in e.cells) if e else 0,
                    "helps_models": e.models("helps") if e else [],
                    "hurts_models": e.models("hurts") if e else [],
                }
            )
    table.sort(key=lambda r: (r["hardware"], -r["presets"], -(r["geomean_gain"] or 0)))
    return table


def preset_settings(preset: dict[str, Any]) -> list[str]:
    """The settings a preset turns on, in the labels of `setting_effects`: its mode (`mode X`),
    its knobs, and its precision where it is not the cell's; an eager preset: `EAGER_SETTING` and
    its runtime settings."""
    from orchestrator.tune.space import KNOBS

    compile_ = preset.get("compile") or {}
    found = [EAGER_SETTING] if is_eager_preset(preset) else []
    mode = compile_.get("mode")
    options = dict(compile_.get("options") or {})
    if mode not in (None, "default"):
        found.append(f"mode {mode}")
    else:  # a tuned config writes its mode out as options: name the mode whose options it holds
        for name, mode_opts in sorted(inductor_modes().items(), key=lambda kv: -len(kv[1])):
            if mode_opts and all(options.get(k) == v for k, v in mode_opts.items()):
                found.append(f"mode {name}")
                options = {k: v for k, v in options.items() if k not in mode_opts}
                break
    rt = preset_runtime(preset)
    for knob in KNOBS:
        opts_match = knob.options and all(options.get(k) == v for k, v in knob.options.items())
        rt_match = knob.runtime and all(rt.get(k) == v for k, v in knob.runtime.items())
        if (
            opts_match
            or rt_match
            or (knob.freezing and compile_.get("freezing"))
            or (knob.channels_last and compile_.get("channels_last"))
        ):
            found.append(knob.name)
    if preset.get("precision") and preset.get("precision") != preset.get("dtype"):
        found.append(f"precision={json.dumps(preset['precision'])}")
    return found


def what_won_markdown(table: list[dict[str, Any]]) -> str:
    """The per-class "what won" table as Markdown."""
    lines = [
        "| class | setting | presets using it | gain where measured (geomean) | comparisons faster / slower | faster on | slower on |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in table:
        gain = (
            f"{r['geomean_gain']:.3f}x over {r['measured_in']}" if r["geomean_gain"] else "not measured alone"
        )
        lines.append(
            f"| {r['hardware']} | {r['setting']} | {r['presets']} of {r['of_presets']} | {gain} | "
            f"{r['helped']} / {r['hurt']} | {', '.join(r['helps_models']) or '-'} | {', '.join(r['hurts_models']) or '-'} |"
        )
    return "\n".join(lines) + "\n"
