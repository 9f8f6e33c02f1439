"""reports.vision_doc: the results document of the seed vision benchmark, from a hand-made table."""

from __future__ import annotations

import json
import math
from datetime import datetime, timezone
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from reports import vision_doc
from store.schema import RESULT_COLUMNS, rows_to_table

REFERENCE_CSV = Path(vision_doc.DEFAULT_REFERENCE)

# Fields the measuring code reports that an older results schema may not hold yet: they are added
# as plain columns when the schema lacks them, so the renderer sees them either way.
EXTRA = ("speedup_ci_low", "speedup_ci_high", "warm_compile_s", "recompiles", "triton_version")


def _row(model, config, eager=None, compiled=None, *, bs=1, status="ok", started=1, **extra) -> dict:
    row = {
        "job_id": f"{model}-{bs}-{config}",
        "run_id": "run-1",
        "hardware": "H200",
        "model": model,
        "batch_size": bs,
        "dtype": "fp32",
        "config": config,
        "status": status,
        "eager_ms": eager,
        "compiled_ms": compiled,
        "speedup": eager / compiled if eager and compiled else None,
        "compile_s": 42.0 if status == "ok" else None,
        "eager_peak_mem_bytes": 1024 * 2**20 if status == "ok" else None,
        "peak_mem_bytes": 512 * 2**20 if status == "ok" else None,
        "graph_breaks": 0 if status == "ok" else None,
        "torch_version": "2.13.0",
        "python_version": "3.11.9",
        "started_at": datetime(2026, 1, 1, 0, 0, started, tzinfo=timezone.utc),
        "recompiles": 0 if status == "ok" else None,
        "triton_version": "3.5.0",
    }
    row.update(extra)
    return row


def _table(rows: list[dict]) -> pa.Table:
    """rows_to_table for the schema's columns, plus EXTRA columns the schema does not have."""
    extra = [c for c in EXTRA if c not in RESULT_COLUMNS]
    table = rows_to_table([{k: v for k, v in r.items() if k not in extra} for r in rows])
    for column in extra:
        table = table.append_column(column, pa.array([r.get(column) for r in rows]))
    return table


ROWS = [
    _row("vit", "default", 8.0, 5.0, speedup_ci_low=1.55, speedup_ci_high=1.66, warm_compile_s=3.25),
    _row("vit", "reduce-overhead", 8.0, 4.0, speedup_ci_low=1.9, speedup_ci_high=2.1),
    _row("detr", "default", 30.0, 12.0, speedup_ci_low=2.4, speedup_ci_high=2.6, graph_breaks=3),
    _row(
        "detr",
        "reduce-overhead",
        status="timeout",
        error="job process timed out after 900 s in phase 'compile' | still compiling\n--- last output ---\nx",
    ),
    _row("mlp", "default", 1.0, 0.5),  # in no reference
]

REFERENCE = [
    {"source": "torch-2.0 default", "gpu": "A100", "batch_size": 1, "model": "ViT", "eager_ms": 9.0, "compiled_ms": 6.0},
    {"source": "torch-2.0 default", "gpu": "A100", "batch_size": 1, "model": "DETR", "eager_ms": 32.0, "compiled_ms": 20.0},
    {"source": "torch-2.0 default", "gpu": "V100", "batch_size": 1, "model": "ViT", "eager_ms": 10.0, "compiled_ms": 2.0},
    {"source": "torch-2.0 default", "gpu": "A100", "batch_size": 4, "model": "ViT", "eager_ms": None, "compiled_ms": None},
    {"source": "torch-2.1-nightly reduce-overhead", "gpu": "A100", "batch_size": 1, "model": "ViT", "eager_ms": 10.0, "compiled_ms": 4.0},
]  # fmt: skip


def _render(rows=ROWS, reference=REFERENCE, **kw) -> str:
    kw = {
        "gpu": "H200",
        "command": "orchestrate sweep sweeps/vision.yaml",
        "versions": {"torch": "2.13.0"},
    } | kw
    return vision_doc.render(_table(rows), reference, **kw)


def _line(doc: str, *starts: str) -> str:
    """The first Markdown table row that begins with these cells."""
    prefix = "| " + " | ".join(starts) + " |"
    return next(line for line in doc.splitlines() if line.startswith(prefix))


def test_results_table_speedups_ci_and_failures():
    doc = _render()
    assert doc.startswith("# torch.compile on H200: the seed vision models\n")
    assert "```bash\norchestrate sweep sweeps/vision.yaml\n```" in doc
    assert "| torch | 2.13.0 |" in doc
    assert "## Batch size 1" in doc
    vit = _line(doc, "vit", "default")
    assert f"{8.0 / 5.0:.2f}x [1.55, 1.66]" in vit  # 1.60x
    assert "| 42.0 | 3.2 | 1024 -> 512 | 0 | 0 |" in vit
    assert f"{8.0 / 4.0:.2f}x [1.90, 2.10]" in _line(doc, "vit", "reduce-overhead")
    assert f"{30.0 / 12.0:.2f}x [2.40, 2.60]" in _line(doc, "detr", "default")
    assert "| 2.00x | 42.0 | - |" in _line(doc, "mlp", "default")  # no CI, no warm compile: "-"
    failed = _line(doc, "detr", "reduce-overhead")
    assert "**timeout**: job process timed out after 900 s in phase 'compile' \\| still" in failed
    assert "last output" not in failed
    # sweep order (vit before detr), configs default before reduce-overhead, unknown models last
    order = [doc.index(_line(doc, m, c)) for m, c in [("vit", "default"), ("vit", "reduce-overhead"), ("detr", "default"), ("detr", "reduce-overhead"), ("mlp", "default")]]  # fmt: skip
    assert order == sorted(order)


def test_other_precisions_get_their_own_sections_and_stay_out_of_the_fp32_comparison():
    tf32 = _row("vit", "default", 8.0, 2.0, dtype="tf32", compiled_b2b_ms=1.75, started=9)
    tf32["job_id"] = "vit-1-default-tf32"
    doc = _render(rows=[*ROWS, tf32])
    assert "## Batch size 1, fp32" in doc and "## Batch size 1, tf32" in doc
    tf32_section = doc[doc.index("## Batch size 1, tf32") :]
    assert "| ok | 8.00 | 2.00 | 1.75 | 4.00x |" in _line(tf32_section, "vit", "default")
    comparison = doc[doc.index("## Against the published") :]
    assert _line(comparison, "vit", "1").startswith("| vit | 1 | 1.60x |")  # the fp32 row, not 4.00x


def test_error_line_is_truncated():
    doc = _render(rows=[_row("vit", "default", status="crash", error="E" * 200)])
    cell = _line(doc, "vit", "default").split(" | ")[2]
    assert cell.startswith("**crash**: EEE") and cell.endswith("...") and len(cell) < 100


def test_comparison_with_reference():
    doc = _render()
    comparison = doc[doc.index("## Against the published") :]
    # reference A100 speedups: eager_ms / compiled_ms; V100 rows are not used
    vit = _line(comparison, "vit", "1")
    assert vit == f"| vit | 1 | 1.60x | 2.00x | {9 / 6:.2f}x | - | {10 / 4:.2f}x | 8.00 | 9.00 |"
    assert "5.00x" not in comparison
    detr = _line(comparison, "detr", "1")
    assert detr == f"| detr | 1 | 2.50x | timeout | {32 / 20:.2f}x | - | - | 30.00 | 32.00 |"
    assert "| mlp |" not in comparison  # absent from the reference: no comparison row, no crash
    ours, theirs = math.sqrt(1.6 * 2.5), math.sqrt(1.5 * 1.6)
    assert (
        f"ours default vs HF 2.0 default: geometric mean {ours:.2f}x vs {theirs:.2f}x over the same 2 cells"
        in doc
    )
    assert (
        "ours reduce-overhead vs HF 2.1-nightly reduce-overhead: geometric mean 2.00x vs 2.50x over the same 1 cell"
        in doc
    )
    assert "ours default vs HF 2.1-nightly default" not in doc  # no cell in common


def test_no_common_cell_and_statuses_and_notes():
    doc = _render(rows=[_row("mlp", "default", 1.0, 0.5)], notes="Ran on a *quiet* node.\n")
    assert "No cell of these results is in the reference." in doc
    assert doc.endswith("## Notes\n\nRan on a *quiet* node.\n")
    full = _render()
    statuses = full[full.index("## Statuses") :]
    assert "Statuses: 4 ok, 1 timeout" in statuses
    assert "- detr bs1 reduce-overhead: timeout: job process timed out after 900 s" in statuses
    assert "## Notes" not in full


def test_reference_csv(tmp_path):
    path = tmp_path / "ref.csv"
    path.write_text(
        "source,gpu,batch_size,task,model,eager_ms,compiled_ms\n"
        "torch-2.0 default,A100,1,image-classification,ViT,9.325,7.584\n"
        "torch-2.0 default,T4,16,object-detection,DETR,OOM,OOM\n"
    )
    vit, detr = vision_doc.load_reference(path)
    assert (vit["batch_size"], vit["eager_ms"], vit["compiled_ms"]) == (1, 9.325, 7.584)
    assert detr["eager_ms"] is None and detr["compiled_ms"] is None


def test_every_reference_name_is_in_the_published_csv():
    # the default reference is part of the repository, so a fresh clone renders the comparison
    assert REFERENCE_CSV.is_relative_to(Path(__file__).resolve().parents[1]) and REFERENCE_CSV.is_file()
    names = {r["model"] for r in vision_doc.load_reference(REFERENCE_CSV)}
    assert set(vision_doc.REFERENCE_NAMES.values()) == names


def test_cli_merges_files_and_keeps_last_row_per_job(tmp_path):
    first = _table(ROWS)
    rerun = _table([_row("vit", "default", 9.0, 3.0, started=30)])  # same job_id, later
    stale = _table([_row("detr", "default", 99.0, 1.0, started=0)])  # same job_id, earlier
    pq.write_table(first, tmp_path / "a.parquet")
    pq.write_table(pa.concat_tables([rerun, stale]), tmp_path / "b.parquet")
    run = {"versions": {"transformers": "4.57.1", "torch": "2.99"}, "spec": {"measure": {"iterations": 50}}}
    (tmp_path / "run.json").write_text(json.dumps({"runs": [run]}))
    (tmp_path / "notes.md").write_text("hello\n")
    out = tmp_path / "docs" / "h200-vision.md"
    argv = [str(tmp_path / "a.parquet"), str(tmp_path / "b.parquet"), "--gpu", "H200", "--out", str(out)]
    argv += ["--command", "orchestrate sweep sweeps/vision.yaml", "--notes-file", str(tmp_path / "notes.md")]
    argv += ["--reference", str(tmp_path / "ref.csv")]
    (tmp_path / "ref.csv").write_text("source,gpu,batch_size,task,model,eager_ms,compiled_ms\n")
    assert vision_doc.main(argv) == 0
    doc = out.read_text()
    assert "| 9.00 | 3.00 | - | 3.00x |" in _line(doc, "vit", "default")
    assert "| 30.00 | 12.00 | - | 2.50x" in _line(doc, "detr", "default")
    assert "Statuses: 4 ok, 1 timeout" in doc  # 5 jobs, not 7 rows
    # versions: the rows' values win over run.json's, which fills what the rows lack
    assert "| torch | 2.13.0 |" in doc and "| triton | 3.5.0 |" in doc
    assert "| transformers | 4.57.1 |" in doc and "| python | 3.11.9 |" in doc
    assert "median of 50 timed calls" in doc
    assert doc.endswith("## Notes\n\nhello\n")


def test_cli_reads_a_sweep_output_dir(tmp_path):
    part = tmp_path / "results" / "hardware=H200"
    part.mkdir(parents=True)
    rows = [r for r in ROWS if r["model"] == "vit"]
    pq.write_table(
        rows_to_table([{k: v for k, v in r.items() if k in RESULT_COLUMNS} for r in rows]).drop(["hardware"]),
        part / "part-0.parquet",
    )
    (tmp_path / "ref.csv").write_text("source,gpu,batch_size,task,model,eager_ms,compiled_ms\n")
    out = tmp_path / "doc.md"
    vision_doc.main([str(tmp_path), "--gpu", "H200", "--command", "c", "--out", str(out), "--reference", str(tmp_path / "ref.csv")])  # fmt: skip
    assert "| vit | default | ok | 8.00 | 5.00 | - | 1.60x" in out.read_text()
