"""`validate` and `plan`: check a sweep file, show its job matrix; nothing runs."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from orchestrator.commands.common import EXIT_BAD_INPUT, add_only, load_sweep, whole


def _classes(text: str) -> str:
    """An argparse type: comma-separated hardware class names, each as a sweep file's `hardware:`
    allows (they become folder and job names: a control character planned jobs named with it)."""
    from orchestrator.spec.checks import NAME_RE

    names = [h.strip() for h in text.split(",") if h.strip()]
    bad = [n for n in names if not NAME_RE.match(n)]
    if not names or bad:
        raise argparse.ArgumentTypeError(
            f"expected classes such as H100,cpu (1-100 letters, digits and _ . + -), got {text[:100]!r}"
        )
    return text


def add_parsers(sub) -> None:
    p = sub.add_parser("validate", help="check a sweep file; exit 2 listing every problem with file:line")
    p.add_argument("sweep", type=Path, help="sweep YAML file")
    p.set_defaults(func=cmd_validate)

    p = sub.add_parser("plan", help="print the job matrix of a sweep and its job count; runs nothing")
    p.add_argument("sweep", type=Path, help="sweep YAML file")
    p.add_argument(
        "--hardware",
        type=_classes,
        metavar="CLASSES",
        help="comma-separated hardware classes to plan for when the sweep says `hardware: auto` "
        "(default: what this machine has, e.g. cpu or H100)",
    )
    p.add_argument(
        "--cpus-per-job", type=whole(1), metavar="N", help="as for `sweep` (changes the slot counts shown)"
    )
    add_only(p)
    p.set_defaults(func=cmd_plan)


def cmd_validate(args) -> int:
    spec = load_sweep(args.sweep)
    if spec is None:
        return EXIT_BAD_INPUT
    print(
        f"{args.sweep}: ok ({len(spec.models)} models x {len(spec.batch_sizes)} batch sizes x "
        f"{len(spec.dtypes)} dtypes x {len(spec.configs)} configs per hardware class)"
    )
    return 0


def cmd_plan(args) -> int:
    from orchestrator.fleet.driver import plan_jobs
    from orchestrator.fleet.inventory import CPU_CLASS, HardwareClass, MissingHardwareError, local_classes
    from orchestrator.fleet.support import triage
    from orchestrator.spec.matrix import NoJobMatches

    spec = load_sweep(args.sweep)
    if spec is None:
        return EXIT_BAD_INPUT
    if args.hardware:
        names = [h.strip() for h in args.hardware.split(",") if h.strip()]
        classes = {n: HardwareClass(n, "cpu" if n == CPU_CLASS else "cuda", slots=1) for n in names}
    elif spec.hardware != "auto":
        classes = {n: HardwareClass(n, "cpu" if n == CPU_CLASS else "cuda", slots=1) for n in spec.hardware}
    else:
        classes = local_classes(args.cpus_per_job)
    try:
        jobs = plan_jobs(spec, classes, args.only)
    except (MissingHardwareError, NoJobMatches) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    checked = triage(jobs)
    why = {job.job_id: reason for job, reason in checked.unsupported}
    ruled_out = f" ({len(why)} unsupported)" if why else ""
    print(f"sweep {spec.name!r} from {args.sweep}: {len(jobs)} jobs{ruled_out}")
    print(
        f"hardware: {', '.join(sorted({j.hardware for j in jobs})) or 'none'}"
        + (" (auto: this machine)" if spec.hardware == "auto" and not args.hardware else "")
    )
    width = max((len(j.name) for j in jobs), default=4)
    print(f"{'#':>4}  {'job':<{width}}  {'job_id':<20}  timeout")
    for i, job in enumerate(jobs, 1):
        mark = "  unsupported" if job.job_id in why else ""
        print(f"{i:>4}  {job.name:<{width}}  {job.job_id:<20}  {job.timeout_s:g}s{mark}")
    _print_support(checked)
    print_policies(spec, sorted({j.hardware for j in jobs}))
    print_serving(spec)
    print(f"{len(jobs)} jobs" + (f": {len(checked.runnable)} to run, {len(why)} unsupported" if why else ""))
    return 0


def print_policies(spec, classes: list[str], restrict=None, stream=None) -> None:
    """Per hardware class and accuracy budget: the precision policies it searches and why the others
    are out (nothing for a sweep without budgets)."""
    from orchestrator.spec.matrix import class_policies

    if not spec.accuracy:
        return
    print(
        f"precision policies per class (accuracy: {', '.join(b.name for b in spec.accuracy)}):", file=stream
    )
    for hw in classes:
        for budget, choices in class_policies(spec, hw, restrict).items():
            used = ", ".join(c.policy for c in choices if c.searched)
            print(f"  {hw}, {budget} budget: searches {used}", file=stream)
            for c in choices:
                print(f"    {'+' if c.searched else '-'} {c.policy}: {c.why}", file=stream)


def print_serving(spec, stream=None) -> None:
    """The traffic each model's presets are to serve (nothing for a sweep without `serving:`)."""
    if not spec.serving:
        return
    print("serving profiles (the traffic each model's presets serve):", file=stream)
    for model in spec.models:
        profile = spec.serving.get(model.name)
        print(
            f"  {model.name}: {profile.describe() if profile else 'the tuned batch sizes only'}", file=stream
        )


def _print_support(checked) -> None:
    """Why the unsupported jobs cannot run, what the others run without, and which classes the
    capability table does not know."""
    from compiler.known_gpus import TABLE_VERSION

    if checked.unsupported:
        print(f"unsupported: {len(checked.unsupported)} jobs (capability table v{TABLE_VERSION}); not run")
        for reason, n in checked.reason_counts():
            print(f"  {n:>4} x {reason}")
    for _, notes in sorted(checked.notes.items()):
        for note in notes:
            print(f"note: {note}")
    for name in checked.unknown:
        if name != "GPU":
            print(
                f"note: {name}: not in the capability table v{TABLE_VERSION}; its jobs check their device when they start"
            )
