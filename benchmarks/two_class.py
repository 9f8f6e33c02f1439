"""Two GPU classes on one multi-GPU host: a real multi-node Ray cluster, one sweep across both
classes, presets and export per class, a lost node retried on its class, and a nightly whose test
hook slows one class only.

    python3 benchmarks/two_class.py --out runs/two-class            # on a host with 2 GPUs
    python3 benchmarks/two_class.py --out /tmp/tc --fake-gpus       # rehearsal on a CPU-only host

What it starts, one `ray start --block` process group each (started one at a time, each node with
its own ports: several raylets on one host must not share the dashboard agent's or the object
manager's port):

- a head without CPUs or GPUs (it runs no job);
- node `gpu0`: GPU 0 (`CUDA_VISIBLE_DEVICES=0`), the class Ray detects (H100 or H200);
- nodes `gpu1-a` and `gpu1-b`: GPU 1, both labelled as the second class (`--second-class`,
  A100 by default) through Ray's autoscaler overrides (`RAY_OVERRIDE_LABELS` for the
  `ray.io/accelerator-type` label, which `ray start --labels` refuses, and
  `RAY_OVERRIDE_RESOURCES` for `accelerator_type:<class>`), as KubeRay or the cluster launcher
  would set them. Ray still adds the resource of the GPU it detects on those nodes, so they
  offer the first class's resource too: placement by label keeps the first class's jobs off
  them. The second class has two nodes on one GPU so that it survives the loss of one.

Then, each an `orchestrate` command against that cluster (`--address`):

1. `sweep SWEEP` (`sweeps/two-class-gpu.yaml`) into OUT/sweep; once a job process has run for
   `--kill-after` seconds under node `gpu1-a`, that node's raylet is SIGKILLed (a lost node), so
   its running job must be retried on `gpu1-b`;
2. `presets OUT/sweep`, `export OUT/sweep --hardware <first class>` (this host is of that class),
   and `export ... --hardware <second class>`, which must be refused (the GPU is not of that class);
3. `gpu1-b` is stopped, and `nightly NIGHTLY_SWEEP --history OUT/nightly` runs once; the second
   class's node is then restarted with `ORCHESTRATE_TEST_SLOWDOWN=<second>=<--slowdown>` (the
   report's test hook: that class's compiled samples multiplied) and the nightly runs twice more,
   so that the third run's history rule (a step change counts on its second night) can call it.

OUT/summary.json and OUT/summary.md say what each check found (placement per row, rows and presets
per class, the lost node's retried jobs, the nightly verdicts per class), with every command run.
The exit status is 0 when every check held. `--fake-gpus` claims GPUs that are not there (a CPU
rehearsal of the mechanics: every GPU job fails at once as a row, in its imports, so the cluster,
the placement per class and the nightlies run for real while the lost node's retry, the presets and
the export need GPUs; tests/test_benchmarks.py runs it so with one-job sweeps of the toy MLP).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from two_class_cluster import Cluster, Node, gpu_class  # noqa: E402  (beside this script)


def orchestrate(args: list[str], log: Path, env: dict[str, str] | None = None, on_line=None) -> int:
    cmd = [sys.executable, "-m", "orchestrator", *args]
    print(f"$ {shlex.join(['orchestrate', *args])}", flush=True)
    full_env = {**os.environ, "RAY_AUTH_MODE": "disabled", **(env or {})}
    with open(log, "w") as fh:
        proc = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=full_env, cwd=ROOT
        )
        assert proc.stdout is not None
        for line in proc.stdout:
            fh.write(line)
            fh.flush()
            print("  " + line.rstrip(), flush=True)
            if on_line:
                on_line(line)
        return proc.wait()


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--out", type=Path, default=ROOT / "runs" / "two-class", help="where everything is written"
    )
    ap.add_argument(
        "--second-class", default="A100", help="the class GPU 1's nodes are labelled as (default A100)"
    )
    ap.add_argument("--sweep", default="sweeps/two-class-gpu.yaml", help="the sweep with the lost node")
    ap.add_argument("--nightly-sweep", default="sweeps/two-class-nightly.yaml", help="the nightly's sweep")
    ap.add_argument("--slowdown", type=float, default=1.15, help="the test hook's factor on the second class")
    ap.add_argument(
        "--kill-after",
        type=float,
        default=8.0,
        help="seconds into a job process on node gpu1-a to kill the node",
    )
    ap.add_argument("--cpus", type=int, default=0, help="cores per GPU (default: all cores / GPUs)")
    ap.add_argument(
        "--fake-gpus", action="store_true", help="CPU rehearsal: nodes claim GPUs that are not there"
    )
    ap.add_argument("--skip-export", action="store_true", help="leave out the export step")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Check the host (an empty --out, two GPUs, a second class other than GPU 0's), run the three
    steps on a fresh cluster, and always stop it and write the summary, whatever was found."""
    args = parse_args(argv)
    # `timeout` (or a scheduler's time limit) sends SIGTERM: end as on Ctrl-C, so the nodes are stopped
    # and summary.json is written with what was found so far
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))

    out: Path = args.out.resolve()
    if out.exists() and any(out.iterdir()):
        print(f"error: {out} is not empty; give a new --out", file=sys.stderr)
        return 2
    out.mkdir(parents=True, exist_ok=True)
    first, gpus = gpu_class(args.fake_gpus)
    second = args.second_class
    if gpus < 2:
        print(f"error: this machine has {gpus} GPU(s); the run needs 2", file=sys.stderr)
        return 2
    if second == first:
        print(f"error: --second-class {second} is GPU 0's own class; name another", file=sys.stderr)
        return 2
    cpus = args.cpus or max(1, (os.cpu_count() or 2) // gpus)
    summary: dict[str, Any] = {"first_class": first, "second_class": second, "commands": [], "checks": {}}
    t0 = time.monotonic()
    cluster = Cluster(out, cpus, args.fake_gpus)
    try:
        run_steps(args, out, cluster, first, second, summary)
    finally:
        cluster.stop()
        summary["wall_s"] = round(time.monotonic() - t0, 1)
        (out / "summary.json").write_text(json.dumps(summary, indent=1, default=str))
        (out / "summary.md").write_text(render(summary))
    ok = all(v.get("ok") if isinstance(v, dict) else bool(v) for v in summary["checks"].values())
    print(render(summary))
    return 0 if ok else 1


def run_steps(
    args: argparse.Namespace, out: Path, cluster: Cluster, first: str, second: str, summary: dict[str, Any]
) -> None:
    """Bring the nodes up, then the three steps, each adding its commands, exit codes and checks
    to `summary`."""
    cluster.start_head()
    gpu0 = cluster.add("gpu0", first, 0, cluster.cpus, relabel=False)
    gpu1a = cluster.add("gpu1-a", second, 1, max(1, cluster.cpus // 2), relabel=True)
    gpu1b = cluster.add("gpu1-b", second, 1, max(1, cluster.cpus // 2), relabel=True)
    summary["nodes_phase1"] = {
        n.name: {"class": n.hw, "gpu": n.gpu, "node_id": n.node_id} for n in (gpu0, gpu1a, gpu1b)
    }
    sweep_out = out / "sweep"
    sweep_with_a_lost_node(args, out, sweep_out, cluster, gpu1a, summary)
    summary["checks"].update(check_sweep(sweep_out, cluster, first, second, gpu1a, gpu1b))
    presets_and_export(args, out, sweep_out, first, second, summary)
    cluster.kill_node(gpu1b, "stopped before the nightlies (one node per GPU from here)")
    nightlies(args, out, cluster, second, summary)
    summary["checks"].update(check_nightly(out / "nightly", first, second))


def sweep_with_a_lost_node(
    args: argparse.Namespace,
    out: Path,
    sweep_out: Path,
    cluster: Cluster,
    lost: Node,
    summary: dict[str, Any],
) -> None:
    """Step 1: one sweep across both classes into `sweep_out`; a node of the second class (`lost`)
    lost mid-sweep, with a job running under it."""
    state: dict[str, Any] = {"dispatched": None}

    def watch(line: str) -> None:
        if state["dispatched"] is None and " jobs planned" in line:
            state["dispatched"] = time.monotonic()

    sweep_args = ["sweep", args.sweep, "--address", cluster.address, "--out", str(sweep_out)]
    summary["commands"].append(shlex.join(["orchestrate", *sweep_args]))
    th = threading.Thread(target=kill_when_busy, args=(cluster, lost, args.kill_after, state), daemon=True)
    th.start()
    rc = orchestrate(sweep_args, out / "sweep.log", on_line=watch)
    state["done"] = True
    th.join(timeout=5)
    summary["sweep_rc"] = rc
    summary["killed"] = {"node": lost.name, "node_id": lost.node_id, "how": lost.killed}


def kill_when_busy(cluster: Cluster, node: Node, kill_after: float, state: dict[str, Any]) -> None:
    """Once a job process (workers.bench) runs under `node`'s raylet, give it `kill_after` seconds
    into its work, then take the node away; nothing once `state["done"]` (the sweep ended)."""
    while not state.get("done") and not cluster.running_job(node):
        time.sleep(0.2)
    if state.get("done"):
        return
    seen = time.monotonic()
    while time.monotonic() - seen < kill_after and cluster.running_job(node) and not state.get("done"):
        time.sleep(0.2)
    if not state.get("done") and cluster.running_job(node):
        since = round(time.monotonic() - (state["dispatched"] or seen), 1)
        state["killed_at_s"] = since
        cluster.kill_node(
            node, f"raylet SIGKILLed {since} s after dispatch, with a job process running under it"
        )


def presets_and_export(
    args: argparse.Namespace, out: Path, sweep_out: Path, first: str, second: str, summary: dict[str, Any]
) -> None:
    """Step 2: presets of the sweep, one class's each; an export per class (unless --skip-export):
    the first class's must succeed on this host, the second's must be refused."""
    presets_args = ["presets", str(sweep_out)]
    summary["commands"].append(shlex.join(["orchestrate", *presets_args]))
    summary["presets_rc"] = orchestrate(presets_args, out / "presets.log")
    summary["checks"]["presets_per_class"] = presets_per_class(sweep_out)
    if args.skip_export:
        return
    for hw in (first, second):
        exp = ["export", str(sweep_out), "--hardware", hw, "--dest", str(out / f"export-{hw}")]
        summary["commands"].append(shlex.join(["orchestrate", *exp]))
        rc = orchestrate(exp, out / f"export-{hw}.log")
        summary[f"export_{hw}_rc"] = rc
        summary[f"export_{hw}_says"] = last_lines(out / f"export-{hw}.log", 3)
    summary["checks"]["export_first_class_ok"] = summary[f"export_{first}_rc"] == 0
    summary["checks"]["export_second_class_refused"] = summary[f"export_{second}_rc"] == 2


def nightlies(
    args: argparse.Namespace, out: Path, cluster: Cluster, second: str, summary: dict[str, Any]
) -> None:
    """Step 3: three nightlies into OUT/nightly, one GPU-1 node each: the first plain, the next two
    with the second class slowed by the report's test hook."""
    nightly_args = [
        "nightly",
        args.nightly_sweep,
        "--history",
        str(out / "nightly"),
        "--address",
        cluster.address,
    ]
    runs = []
    for night in (1, 2, 3):
        if night == 2:
            hook = {"ORCHESTRATE_TEST_SLOWDOWN": f"{second}={args.slowdown}"}
            cluster.add("gpu1-slow", second, 1, cluster.cpus, relabel=True, env=hook)
            summary["slowdown_hook"] = (
                f"ORCHESTRATE_TEST_SLOWDOWN={second}={args.slowdown} on the {second} node only"
            )
        elif night == 1:
            cluster.add("gpu1-c", second, 1, cluster.cpus, relabel=True)
        summary["commands"].append(shlex.join(["orchestrate", *nightly_args]))
        rc = orchestrate(nightly_args, out / f"nightly-{night}.log")
        runs.append(rc)
        if night == 1:
            cluster.kill_node(cluster.nodes[-1], "stopped: restarted with the slowdown hook")
        if night < 3:
            time.sleep(1.1)  # nightly names runs by the second: the next one's must differ
    summary["nightly_rc"] = runs


def check_sweep(out: Path, cluster: Cluster, first: str, second: str, lost, spare) -> dict[str, Any]:
    from store.schema import read_results

    rows = read_results(out).to_pylist()
    ids = {first: set(), second: set()}
    for n in cluster.nodes:
        if n.hw in ids and n.node_id:
            ids[n.hw].add(n.node_id)
    misplaced = [
        r["job_name"] for r in rows if r["node_id"] and r["node_id"] not in ids.get(r["hardware"], set())
    ]
    per_class: dict[str, dict[str, int]] = {}
    for r in rows:
        per_class.setdefault(r["hardware"], {}).setdefault(r["status"], 0)
        per_class[r["hardware"]][r["status"]] += 1
    retried = [
        {
            "job": r["job_name"],
            "attempt": r["attempt"],
            "node": "gpu1-b" if r["node_id"] == spare.node_id else r["node_id"],
            "status": r["status"],
        }
        for r in rows
        if (r["attempt"] or 1) > 1
    ]
    return {
        "placement": {"ok": bool(rows) and not misplaced, "rows": len(rows), "misplaced": misplaced},
        "rows_per_class": {"ok": set(per_class) == {first, second}, "statuses": per_class},
        "lost_node_retried_on_its_class": {
            "ok": bool(retried)
            and all(x["node"] == "gpu1-b" and x["job"].startswith(second + "/") for x in retried),
            "retried": retried,
        },
        "one_row_per_job": {"ok": len({r["job_id"] for r in rows}) == len(rows)},
    }


def presets_per_class(out: Path) -> dict[str, Any]:
    path = out / "presets.json"
    if not path.is_file():
        return {"ok": False, "why": "no presets.json"}
    data = json.loads(path.read_text())
    classes: dict[str, list[str]] = {}
    for e in data.get("presets", []):
        classes.setdefault(e["hardware"], []).append(f"{e['model']}/bs{e['batch_size']}: {e['config']}")
    return {"ok": len(classes) == 2, "classes": classes}


def check_nightly(history: Path, first: str, second: str) -> dict[str, Any]:
    runs = sorted(p for p in history.iterdir() if p.is_dir())
    found: dict[str, Any] = {"runs": [p.name for p in runs]}
    verdicts: dict[str, dict[str, str]] = {}
    for p in runs[1:]:
        rep = p / "regression.json"
        if rep.is_file():
            cells = json.loads(rep.read_text())["cells"]
            verdicts[p.name] = {c["name"]: c["verdict"] for c in cells}
    found["verdicts"] = verdicts
    last = verdicts.get(runs[-1].name, {}) if runs else {}
    flagged = {name.split("/")[0] for name, v in last.items() if v == "regression"}
    found["ok"] = (
        len(runs) == 3
        and flagged == {second}
        and all(v != "regression" for name, v in last.items() if name.startswith(first + "/"))
    )
    found["flagged_classes_last_night"] = sorted(flagged)
    return {"nightly_flags_one_class": found}


def last_lines(path: Path, n: int) -> list[str]:
    return [ln for ln in path.read_text().splitlines() if ln.strip()][-n:] if path.is_file() else []


def render(summary: dict[str, Any]) -> str:
    lines = [f"# Two GPU classes on one host: {summary['first_class']} and {summary['second_class']}", ""]
    lines += ["| check | held | detail |", "|---|---|---|"]
    for name, v in summary["checks"].items():
        held = v.get("ok") if isinstance(v, dict) else bool(v)
        detail = {k: x for k, x in v.items() if k != "ok"} if isinstance(v, dict) else ""
        lines.append(
            f"| {name} | {'yes' if held else '**no**'} | `{json.dumps(detail, default=str)[:400]}` |"
        )
    lines += [
        "",
        "Commands:",
        "",
        "```bash",
        *summary["commands"],
        "```",
        "",
        f"wall {summary.get('wall_s')} s",
    ]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
