"""The committed results document of the seed vision benchmark: `docs/results/<gpu>-vision.md`.

Renders one sweep of `sweeps/vision.yaml` (every cell, failures included) next to the published
Hugging Face numbers (`reports/data/hf_vision_published.csv`; its source: `reports/data/README.md`).
Usage: `python -m reports.vision_doc RESULTS... --gpu H200 --command "..." --out
docs/results/h200-vision.md`.
Columns a results table lacks (an older schema) render as "-".
"""

from __future__ import annotations

import argparse
import csv
import json
import math
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from compiler.precision import PRECISIONS
from store.schema import read_results
from store.storage import Location, Target, resolve

# Our model name (the `model` column, in the order of sweeps/vision.yaml) -> the reference's.
REFERENCE_NAMES: dict[str, str] = {
    "vit": "ViT",
    "beit": "BeiT",
    "convnext": "ConvNeXT",
    "resnet-50": "ResNet",
    "segformer": "Segformer",
    "mask2former": "Mask2former",
    "maskformer": "Maskformer",
    "mobilenet": "MobileNet",
    "owlvit": "OwlViT",
    "detr": "DETR",
    "detr-101": "Resnet-101",
    "conditional-detr": "Conditional-DETR",
}
CONFIGS = ("default", "reduce-overhead", "max-autotune")
REFERENCE_GPU = "A100"
# (source in the CSV, column label, our config it is compared with)
REFERENCE_SOURCES = (
    ("torch-2.0 default", "HF 2.0 default", "default"),
    ("torch-2.1-nightly default", "HF 2.1-nightly default", "default"),
    ("torch-2.1-nightly reduce-overhead", "HF 2.1-nightly reduce-overhead", "reduce-overhead"),
)
VERSION_COLUMNS = (
    ("device", "device_name"),
    ("torch", "torch_version"),
    ("triton", "triton_version"),
    ("CUDA", "cuda_version"),
    ("driver", "driver_version"),
    ("python", "python_version"),
)
ERROR_CHARS = 80
RESULT_HEADER = (
    "model | config | status | eager ms | compiled ms | compiled ms back-to-back | speedup [95% CI] | cold compile s | "
    "warm compile s | peak mem MiB (eager -> compiled) | graph breaks | recompiles"
)
# The published Hugging Face torch.compile vision benchmark (source: reports/data/README.md).
DEFAULT_REFERENCE = Path(__file__).resolve().parent / "data" / "hf_vision_published.csv"


def load_reference(csv_path: str | Path) -> list[dict]:
    """Rows of the reference CSV; batch_size int, eager_ms/compiled_ms float (None for "OOM")."""
    rows = []
    with open(csv_path, newline="") as f:
        for row in csv.DictReader(f):
            row["batch_size"] = int(row["batch_size"])
            for key in ("eager_ms", "compiled_ms"):
                try:
                    row[key] = float(row[key])
                except ValueError:
                    row[key] = None
            rows.append(row)
    return rows


def _source_key(source: str) -> str:
    # "torch-2.1 nightly default" and "torch-2.1-nightly default" name the same source
    return source.lower().replace(" ", "-")


def _num(value: Any, fmt: str) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return format(value, fmt)


def _first_line(text: str | None, limit: int = ERROR_CHARS) -> str:
    line = (text or "").strip().splitlines()[0] if (text or "").strip() else ""
    line = line if len(line) <= limit else line[: limit - 3] + "..."
    return line.replace("|", "\\|")


def _speedup(row: dict) -> float | None:
    if row.get("speedup") is not None:
        return row["speedup"]
    e, c = row.get("eager_ms"), row.get("compiled_ms")
    return e / c if e and c else None


def _order(row: dict) -> tuple:
    names, model, config = list(REFERENCE_NAMES), row["model"], row["config"]
    model_key = names.index(model) if model in names else len(names)
    config_key = CONFIGS.index(config) if config in CONFIGS else len(CONFIGS)
    return (model_key, model, config_key, config, str(row.get("started_at") or ""))


def _table(header: list[str], body: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in body])


def _result_cells(row: dict) -> list[str]:
    if row["status"] != "ok":
        return [f"**{row['status']}**: {_first_line(row.get('error'))}"] + [""] * 9
    ci = [_num(row.get(k), ".2f") for k in ("speedup_ci_low", "speedup_ci_high")]
    speedup = _num(_speedup(row), ".2f") + "x" + (f" [{ci[0]}, {ci[1]}]" if "-" not in ci else "")
    mem = [_num(row.get(k) and row[k] / 2**20, ".0f") for k in ("eager_peak_mem_bytes", "peak_mem_bytes")]
    cells = ["ok", _num(row.get("eager_ms"), ".2f"), _num(row.get("compiled_ms"), ".2f")]
    cells += [_num(row.get("compiled_b2b_ms"), ".2f"), speedup]
    cells += [_num(row.get("compile_s"), ".1f"), _num(row.get("warm_compile_s"), ".1f"), " -> ".join(mem)]
    return cells + [_num(row.get("graph_breaks"), "d"), _num(row.get("recompiles"), "d")]


def _results_sections(rows: list[dict]) -> list[str]:
    header = RESULT_HEADER.split(" | ")
    known = list(PRECISIONS)  # the strict and stock fp32 first, then the faster policies
    groups = sorted(
        {(r["batch_size"], r.get("dtype")) for r in rows},
        key=lambda g: (g[0], known.index(g[1]) if g[1] in known else len(known), str(g[1])),
    )
    parts = []
    for bs, dtype in groups:
        body = [r for r in sorted(rows, key=_order) if (r["batch_size"], r.get("dtype")) == (bs, dtype)]
        title = f"## Batch size {bs}" + (f", {dtype}" if len({d for _, d in groups}) > 1 else "")
        parts += [title, _table(header, [[r["model"], r["config"], *_result_cells(r)] for r in body])]
    return parts


def _reference_speedups(reference: list[dict]) -> dict[tuple[str, str, int], tuple[float, float]]:
    """(source key, reference model, batch) -> (speedup, eager ms), A100 rows with numbers."""
    out = {}
    for r in reference:
        if r["gpu"] == REFERENCE_GPU and r["eager_ms"] and r["compiled_ms"]:
            key = (_source_key(r["source"]), r["model"], r["batch_size"])
            out[key] = (r["eager_ms"] / r["compiled_ms"], r["eager_ms"])
    return out


def _geomean(values: list[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values))


def _speedup_cell(row: dict | None) -> str:
    if row is None:
        return "-"
    return row["status"] if row["status"] != "ok" else _num(_speedup(row), ".2f") + "x"


def _comparison_cells(ours: dict, ref: dict) -> list[tuple[str, int]]:
    """(model, batch) of our results that the reference has for at least one source."""
    cells = sorted(
        {(m, bs) for m, bs, _ in ours}, key=lambda c: (_order({"model": c[0], "config": ""}), c[1])
    )
    sources = [_source_key(s) for s, *_ in REFERENCE_SOURCES]
    return [(m, bs) for m, bs in cells if any((s, REFERENCE_NAMES.get(m), bs) in ref for s in sources)]


def _comparison_section(rows: list[dict], reference: list[dict]) -> list[str]:
    ref = _reference_speedups(reference)
    fp32 = [r for r in rows if r.get("dtype") in (None, "fp32", "fp32-strict")]  # the reference ran fp32
    ours = {(r["model"], r["batch_size"], r["config"]): r for r in sorted(fp32, key=_order)}
    header = ["model", "batch", "ours default", "ours reduce-overhead"]
    header += [label for _, label, _ in REFERENCE_SOURCES]
    header += ["our eager ms", f"HF 2.0 {REFERENCE_GPU} eager ms"]
    body, pairs = [], {source: [] for source, *_ in REFERENCE_SOURCES}
    for model, bs in _comparison_cells(ours, ref):
        name = REFERENCE_NAMES[model]
        line = [model, str(bs), _speedup_cell(ours.get((model, bs, "default")))]
        line.append(_speedup_cell(ours.get((model, bs, "reduce-overhead"))))
        for source, _, config in REFERENCE_SOURCES:
            hit, row = ref.get((_source_key(source), name, bs)), ours.get((model, bs, config))
            line.append(f"{hit[0]:.2f}x" if hit else "-")
            if hit and row and row["status"] == "ok" and _speedup(row):
                pairs[source].append((_speedup(row), hit[0]))
        eager = [ours.get((model, bs, c)) or {} for c in CONFIGS]
        eager = [r["eager_ms"] for r in eager if r.get("status") == "ok" and r.get("eager_ms")]
        ref_eager = ref.get((_source_key(REFERENCE_SOURCES[0][0]), name, bs))
        line += [_num(eager[0] if eager else None, ".2f"), _num(ref_eager and ref_eager[1], ".2f")]
        body.append(line)
    parts = [f"## Against the published Hugging Face numbers ({REFERENCE_GPU})"]
    parts.append(
        f"Reference speedup = eager_ms / compiled_ms of the reference's {REFERENCE_GPU} rows; "
        "our eager ms is the eager median of the default cell (another ok config where it failed)."
    )
    parts.append(_table(header, body) if body else "No cell of these results is in the reference.")
    return parts + _geomean_lines(pairs)


def _geomean_lines(pairs: dict[str, list[tuple[float, float]]]) -> list[str]:
    lines = []
    for source, label, config in REFERENCE_SOURCES:
        got = pairs[source]
        if got:
            ours, theirs = _geomean([a for a, _ in got]), _geomean([b for _, b in got])
            lines.append(
                f"- ours {config} vs {label}: geometric mean {ours:.2f}x vs {theirs:.2f}x "
                f"over the same {len(got)} cell{'s' if len(got) > 1 else ''}"
            )
    return ["\n".join(lines)] if lines else []


def _cell_name(row: dict) -> str:
    return f"{row['model']} bs{row['batch_size']} {row['config']}"


def _status_section(rows: list[dict]) -> list[str]:
    counts = sorted(Counter(r["status"] for r in rows).items())
    parts = ["## Statuses", "Statuses: " + (", ".join(f"{n} {s}" for s, n in counts) or "no rows")]
    failed = [r for r in sorted(rows, key=lambda r: (r["batch_size"], _order(r))) if r["status"] != "ok"]
    lines = [f"- {_cell_name(r)}: {r['status']}: {_first_line(r.get('error'))}" for r in failed]
    return parts + ["\n".join(lines)] if lines else parts


def _method(iterations: int | None, repeats: int | None = None) -> str:
    n = f"{iterations} timed calls" if iterations else "the timed calls"
    if repeats and repeats > 1:
        where = (
            f"in {repeats} fresh processes per cell (the first compiles cold in its own Inductor and "
            "Triton caches, the others warm against them)"
        )
        ci = (
            "The 95% intervals come from a hierarchical bootstrap over processes and then calls "
            "(`compiler/statistics/`), so they include the spread between processes; warm compile "
            "is the median of the later processes' compiles."
        )
    else:
        where = "in a fresh process with its own Inductor and Triton caches"
        ci = (
            "The speedup CI is a percentile-bootstrap 95% interval of the ratio of the medians over "
            "the calls of that one process: a rerun in another process need not fall inside it. Warm "
            "compile is a second process against the filled cache."
        )
    return (
        f"Method: every cell runs {where}. Eager and compiled are timed interleaved in rounds in the "
        f"same process, with CUDA events, on inputs rotated call by call; latency is the median of {n} "
        f"of each. {ci} Cold compile is the first compiled call in a fresh cache. Accuracy is checked "
        "against an fp64 reference with the PyTorch benchmark harness rule; peak memory is from the "
        "CUDA caching allocator."
    )


def _select_gpu(rows: list[dict], gpu: str) -> list[dict]:
    mine = [r for r in rows if str(r.get("hardware") or "").lower() == gpu.lower()] or rows
    classes = sorted({str(r.get("hardware")) for r in mine})
    if len(classes) > 1:
        raise ValueError(f"results hold several hardware classes {classes}; name one with gpu")
    return mine


def render(
    table: pa.Table,
    reference: list[dict],
    *,
    gpu: str,
    command: str,
    versions: dict[str, str],
    notes: str = "",
    iterations: int | None = None,
    repeats: int | None = None,
) -> str:
    """The results document as Markdown."""
    rows = _select_gpu(table.to_pylist(), gpu)
    parts = [f"# torch.compile on {gpu}: the seed vision models", f"```bash\n{command}\n```"]
    parts.append(_table(["component", "version"], [[k, str(v)] for k, v in versions.items()]))
    parts.append(_method(iterations, repeats))
    parts += _results_sections(rows)
    parts += _comparison_section(rows, reference)
    parts += _status_section(rows)
    if notes:
        parts += ["## Notes", notes.rstrip("\n")]
    return "\n\n".join(parts) + "\n"


# --- the command line -----------------------------------------------------------------------------


def _read_parquet(path: Location) -> pa.Table:
    table = pq.read_table(path.path, filesystem=path.fs)
    if "hardware" not in table.column_names:  # a file of a hive partition: hardware=<class>/part-*.parquet
        hw = next((p.split("=", 1)[1] for p in Path(path.path).parts if p.startswith("hardware=")), None)
        table = table.append_column("hardware", pa.array([hw] * table.num_rows, pa.string()))
    return table


def _run_json(folder: Location) -> Location | None:
    for candidate in [folder, *folder.parents()][:4]:
        run_file = candidate.join("run.json")
        if run_file.is_file():
            return run_file
    return None


def _identity(loc: Location) -> str:
    return str(loc.local_path.resolve()) if loc.is_local else loc.path


def load_results(paths: list[Target]) -> tuple[pa.Table, list[dict]]:
    """Merge sweep output dirs and .parquet files (local paths or URIs), one row per job_id (the
    last started); also return the run.json entries found beside them."""
    tables, runs, seen = [], [], set()
    for loc in map(resolve, paths):
        is_dir = loc.is_dir()
        tables.append(read_results(loc) if is_dir else _read_parquet(loc))
        run_file = _run_json(loc if is_dir else loc.parents()[0])
        if run_file and _identity(run_file) not in seen:
            seen.add(_identity(run_file))
            runs += json.loads(run_file.read_text()).get("runs", [])
    merged = pa.concat_tables(tables, promote_options="permissive")
    latest: dict[str, tuple[tuple, dict]] = {}
    for row in merged.to_pylist():
        key = (row.get("started_at") is not None, row.get("started_at") or 0)
        if row["job_id"] not in latest or key >= latest[row["job_id"]][0]:
            latest[row["job_id"]] = (key, row)
    rows = [row for _, row in latest.values()]
    return pa.Table.from_pylist(rows, schema=merged.schema), runs


def collect_versions(table: pa.Table, runs: list[dict]) -> dict[str, str]:
    """The most common value of each version column of the rows; run.json fills the rest."""
    versions = {}
    for label, column in VERSION_COLUMNS:
        values = [v for v in table.column(column).to_pylist() if v] if column in table.column_names else []
        if values:
            versions[label] = Counter(values).most_common(1)[0][0]
    for run in runs:
        for key, value in (run.get("versions") or {}).items():
            if key in ("torch", "triton", "python", "transformers") and value not in (None, "absent"):
                versions.setdefault(key, value)
    return versions


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m reports.vision_doc", description=__doc__.split("\n")[0])
    parser.add_argument(
        "results", nargs="+", help="sweep output dirs and/or .parquet files, paths or URIs (merged)"
    )
    parser.add_argument("--gpu", required=True, help="GPU name for the title, e.g. H200")
    parser.add_argument("--command", required=True, help="the exact command that ran the sweep")
    parser.add_argument("--out", required=True, help="where to write the Markdown")
    parser.add_argument("--reference", default=str(DEFAULT_REFERENCE), help="reference CSV")
    parser.add_argument("--notes-file", help="Markdown appended under ## Notes")
    args = parser.parse_args(argv)
    table, runs = load_results(args.results)
    measures = [(r.get("spec") or {}).get("measure") or {} for r in runs]
    iterations = next((m["iterations"] for m in reversed(measures) if m.get("iterations")), None)
    repeats = next((m["repeats"] for m in reversed(measures) if m.get("repeats")), None)
    notes = Path(args.notes_file).read_text() if args.notes_file else ""
    versions = collect_versions(table, runs)
    kw = {
        "gpu": args.gpu,
        "command": args.command,
        "notes": notes,
        "iterations": iterations,
        "repeats": repeats,
    }
    text = render(table, load_reference(args.reference), versions=versions, **kw)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    print(f"wrote {out} ({table.num_rows} rows)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
