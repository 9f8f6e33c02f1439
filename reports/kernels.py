"""Which kernel autotuning chose, per op signature, from the `kernel_choices` table.

One line per (hardware class, op, input shapes, input dtypes): how many times the compiled
graphs autotuned that signature, how many candidates were timed, the winner (its kind, name and
tile configuration) and its time, the fastest extern (ATen/library) and the fastest template
candidate, how much faster the winner was than the fastest extern kernel, and the kernel emitted
into the generated code where epilogue-fusion benchmarking chose another than the winner (`=`
where it is the winner; `-` for rows written before `emitted` was recorded). Autotune-cache
hits (`from_cache`) reuse the first timing of a signature, so the times are the first fresh
benchmark's where there is one. Rows kept from a compile that did not finish (a job that timed
out, crashed or was cancelled mid-autotune: `partial`) count like the others, since each of their ops was
timed whole, and are marked: `times tuned` says how many were partial, and `emitted` says
`partial compile` where the line's op never got as far as generated code.

    python -m reports.kernels OUT_OR_PARQUET [--hardware H100] [--out FILE.md]
    orchestrate kernels OUT [--hardware H100]
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

Row = dict[str, Any]

TILE_KEYS = ("BLOCK_M", "BLOCK_N", "BLOCK_K", "num_warps", "num_stages", "GROUP_M")
HEADER = [
    "hardware",
    "op",
    "input shapes",
    "dtype",
    "times tuned",
    "candidates",
    "winner",
    "tiles",
    "winner ms",
    "best extern ms",
    "best template ms",
    "extern / winner",
    "emitted",
]


def tiles(config: str | None) -> str:
    """The tile shape of a template candidate's config JSON, e.g. `64x64x32 w4 s3`."""
    try:
        info = json.loads(config or "{}")
    except ValueError:
        return ""
    if not isinstance(info, dict):
        return ""
    blocks = "x".join(str(info[k]) for k in TILE_KEYS[:3] if k in info)
    rest = [f"{p}{info[k]}" for p, k in (("w", "num_warps"), ("s", "num_stages")) if k in info]
    return " ".join(x for x in [blocks, *rest] if x)


def _best(rows: list[Row], template: bool) -> float | None:
    times = [r["time_ms"] for r in rows if r["time_ms"] is not None and (r["kind"] != "extern") == template]
    return min(times) if times else None


def _sort_key(item: tuple[tuple, Any]) -> tuple:
    """A signature's order, whatever is null in it (a null column sorts as 'None', no TypeError)."""
    hardware, op, shapes, dtypes = item[0]
    return (str(hardware), str(op), tuple(map(str, shapes)), tuple(map(str, dtypes)))


def autotuned_ops(rows: list[Row]) -> list[list[Row]]:
    """The rows of each op one compile autotuned: per (job_id, run_id, op_index), since a job that
    ran twice (cancelled, then resumed; rerun after its results part was quarantined) has the
    same op indexes in both runs, and its candidates must not be counted as one op's."""
    ops: dict[tuple, list[Row]] = defaultdict(list)
    for r in rows:
        ops[(r["job_id"], r.get("run_id"), r["op_index"])].append(r)
    return list(ops.values())


def summarize(rows: list[Row]) -> list[Row]:
    """One entry per (hardware, op, shapes, dtypes), from the first autotuning of each signature
    (a fresh benchmark where there is one)."""
    signatures: dict[tuple, list[list[Row]]] = defaultdict(list)
    for op_rows in autotuned_ops(rows):
        first = op_rows[0]
        key = (
            first["hardware"],
            first["op"],
            tuple(first["input_shapes"] or ()),
            tuple(first["input_dtypes"] or ()),
        )
        signatures[key].append(op_rows)
    out = []
    for (hardware, op, shapes, dtypes), instances in sorted(signatures.items(), key=_sort_key):
        fresh = [i for i in instances if not i[0]["from_cache"]]
        # a finished compile's benchmark where there is one: only it knows the kernel emitted
        whole = [i for i in fresh if not i[0].get("partial")]
        op_rows = (whole or fresh or instances)[0]
        winners = [r for r in op_rows if r["is_winner"]]
        winner = winners[0] if winners else None
        emitted = [r for r in op_rows if r.get("emitted")]
        extern = _best(op_rows, template=False)
        out.append(
            {
                "hardware": hardware,
                "op": op,
                "input_shapes": list(shapes),
                "input_dtypes": sorted({d for d in dtypes if d}),
                "times_tuned": len(instances),
                "partial_instances": sum(1 for i in instances if i[0].get("partial")),
                "partial": bool(op_rows[0].get("partial")),
                "candidates": len(op_rows),
                "winner": winner,
                "winner_ms": winner["time_ms"] if winner else None,
                "best_extern_ms": extern,
                "best_template_ms": _best(op_rows, template=True),
                "extern_over_winner": extern / winner["time_ms"]
                if winner and extern and winner["time_ms"]
                else None,
                "emitted": emitted[0] if emitted else None,
            }
        )
    return out


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v:.4f}"


def _emitted(s: Row) -> str:
    e, w = s.get("emitted"), s["winner"]
    if s.get("partial"):
        return "none (partial compile)"
    if e is None:
        return "-"
    if w is not None and e["choice"] == w["choice"]:
        return "="
    return f"{e['kind']}: {e['choice']} (epilogue fusion)"


def render(summary: list[Row]) -> str:
    lines = ["| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
    for s in summary:
        w = s["winner"]
        cells = [
            str(s["hardware"]),
            str(s["op"]),
            " , ".join(x or "?" for x in s["input_shapes"] or ()),
            ",".join(x or "?" for x in s["input_dtypes"] or ()),
            str(s["times_tuned"])
            + (f" ({s['partial_instances']} partial)" if s.get("partial_instances") else ""),
            str(s["candidates"]),
            f"{w['kind']}: {w['choice']}" if w else "none",
            tiles(w["config"]) if w else "",
            _ms(s["winner_ms"]),
            _ms(s["best_extern_ms"]),
            _ms(s["best_template_ms"]),
            "-" if s["extern_over_winner"] is None else f"{s['extern_over_winner']:.2f}x",
            _emitted(s),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def load(source: Any) -> pa.Table:
    """A sweep output directory (a path, a URI or a storage location: its `kernel_choices` table)
    or one packed Parquet file."""
    if isinstance(source, str) and source.endswith(".parquet") and Path(source).is_file():
        return pq.read_table(source)
    from store.schema import read_results, read_table

    read_results(source, ["job_id"])  # the strict reader: a damaged output is named, not half-read
    return read_table(source, "kernel_choices")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "source", help="a sweep output directory (path or URI) or a packed kernel_choices .parquet"
    )
    p.add_argument("--hardware", help="only this hardware class")
    p.add_argument("--out", type=Path, help="also write the table to this Markdown file")
    args = p.parse_args(argv)
    rows = load(args.source).to_pylist()
    if args.hardware:
        rows = [r for r in rows if r["hardware"] == args.hardware]
    if not rows:
        print(f"no kernel_choices rows in {args.source}: run a sweep with a max-autotune config first")
        return 2
    text = render(summarize(rows))
    if args.out:
        args.out.write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
