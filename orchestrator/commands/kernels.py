"""`kernels`: which kernel autotuning chose per op and input shape."""

from __future__ import annotations

import json
import sys

from orchestrator.commands.common import EXIT_BAD_INPUT
from store.location_forms import arg as location_arg


def add_parsers(sub) -> None:
    p = sub.add_parser(
        "kernels",
        help="print which kernel autotuning chose per op and input shape (the kernel_choices table)",
        description="One line per hardware class, op, input shapes and dtype from a sweep's kernel_choices "
        "table (written by jobs whose config autotunes: max-autotune, or max_autotune with freezing on CPU): "
        "candidates timed, the winner with its tiles, and the fastest extern and template times. A job whose "
        "compile timed out, crashed or was cancelled mid-autotune keeps the ops it finished, marked partial.",
    )
    p.add_argument(
        "out", type=location_arg, help="sweep output directory: a path or a URI such as s3://BUCKET/PREFIX"
    )
    p.add_argument("--hardware", help="only this hardware class (e.g. H100)")
    p.set_defaults(func=cmd_kernels)


def cmd_kernels(args) -> int:
    from reports.kernels import autotuned_ops, load, render, summarize
    from store.storage import StorageError, checked

    try:
        rows = load(checked(args.out)).to_pylist()
    except StorageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    rows = [r for r in rows if not args.hardware or r["hardware"] == args.hardware]
    if not rows:
        where = f" for hardware {args.hardware!r}" if args.hardware else ""
        print(
            f"error: no kernel_choices rows{where} in {args.out}; they come from jobs whose config autotunes "
            "(mode: max-autotune), written op by op as the compile times them"
            + _unfinished_compiles(args.out, args.hardware),
            file=sys.stderr,
        )
        return EXIT_BAD_INPUT
    print(render(summarize(rows)))
    ops = autotuned_ops(rows)
    partial = [o for o in ops if o[0].get("partial")]
    if partial:
        jobs = len({(o[0]["job_id"], o[0]["run_id"]) for o in partial})
        print(
            f"{len(partial)} of {len(ops)} autotuned ops come from {jobs} compile(s) that did not finish (the "
            "job timed out, crashed or was cancelled; rows marked `partial`): each op was timed whole, but no "
            "code was emitted"
        )
    known = [o for o in ops if any(r.get("emitted") is not None for r in o)]
    differ = sum(1 for o in known if any(r.get("emitted") and not r["is_winner"] for r in o))
    if known:
        benchmarked = sum(1 for o in known if any(r.get("fusion_benchmarked") for r in o))
        print(
            f"{benchmarked} of {len(known)} autotuned ops went through Inductor's epilogue-fusion "
            f"benchmarking; {differ} of them emitted another kernel than the fastest"
        )
    return 0


def _unfinished_compiles(out: str, hardware: str | None) -> str:
    """For `kernels` with no rows: the jobs whose compile never finished (so a config that does
    autotune may have none yet), as a clause; '' when there are none or results cannot be read."""
    from store.schema import read_results

    try:
        results = read_results(out, ["hardware", "status", "error", "mode", "options"]).to_pylist()
    except Exception:  # only a hint: the error above stands without it
        return ""

    def autotunes(r: dict) -> bool:
        options = json.loads(r["options"] or "{}")
        return (r["mode"] or "").startswith("max-autotune") or any(
            options.get(k) for k in ("max_autotune", "max_autotune_gemm")
        )

    stopped = [
        r
        for r in results
        if (not hardware or r["hardware"] == hardware)
        and autotunes(r)
        and (
            r["status"] == "compile_error"
            or (r["status"] in ("timeout", "crash") and "phase 'compile'" in (r["error"] or ""))
        )
    ]
    if not stopped:
        return ""
    return (
        f"; {len(stopped)} job(s) ended in their compile before autotuning finished an op "
        "(a longer timeout, or a smaller model, would let them keep some)"
    )
