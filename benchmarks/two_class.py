"""Two GPU classes on one multi-GPU host: a real multi-node Ray cluster, one sweep across both
classes, presets and export per class, a lost node retried on its class, and a nightly whose test
hook slows one class only (issue 24).

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
rehearsal of the mechanics: its GPU jobs fail fast as rows, so give it sweeps that take time, such
as a `python:tests.faulty:hang` model with a short timeout).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shlex
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

HEAD_PORT = 6390
BASE_PORT = 52400  # each node takes ten ports from BASE_PORT + 10 * its index
ACCEL_LABEL = "ray.io/accelerator-type"


@dataclass
class Node:
    name: str
    hw: str
    gpu: int | None
    index: int
    env: dict[str, str] = field(default_factory=dict)
    proc: subprocess.Popen | None = None
    node_id: str | None = None
    killed: str | None = None

    def ports(self) -> list[str]:
        p = BASE_PORT + 10 * self.index
        return [
            f"--dashboard-agent-listen-port={p}",
            f"--node-manager-port={p + 1}",
            f"--object-manager-port={p + 2}",
            f"--runtime-env-agent-port={p + 3}",
            f"--metrics-export-port={p + 4}",
            f"--dashboard-agent-grpc-port={p + 5}",
            f"--min-worker-port={21000 + 1000 * self.index}",
            f"--max-worker-port={21999 + 1000 * self.index}",
        ]

    @property
    def manager_port(self) -> int:
        return BASE_PORT + 10 * self.index + 1


class Cluster:
    def __init__(self, log_dir: Path, cpus: int, fake_gpus: bool):
        self.log_dir = log_dir
        self.cpus = cpus
        self.fake = fake_gpus
        self.nodes: list[Node] = []
        self.address = f"127.0.0.1:{HEAD_PORT}"

    def _ray_start(self, node: Node, args: list[str]) -> None:
        env = {**os.environ, "RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0", **node.env}
        if node.gpu is not None:
            env["CUDA_VISIBLE_DEVICES"] = str(node.gpu)
        log = open(self.log_dir / f"node-{node.name}.log", "ab")  # noqa: SIM115 (the child keeps it)
        cmd = [
            sys.executable,
            "-m",
            "ray.scripts.scripts",
            "start",
            "--block",
            "--disable-usage-stats",
            "--object-store-memory=500000000",
        ]
        node.proc = subprocess.Popen(
            [*cmd, *args, *node.ports()],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def start_head(self) -> None:
        head = Node("head", "", None, 0)
        self._ray_start(
            head,
            ["--head", f"--port={HEAD_PORT}", "--num-cpus=0", "--num-gpus=0", "--include-dashboard=false"],
        )
        self.nodes.append(head)
        self._wait_for(head)

    def add(
        self, name: str, hw: str, gpu: int, cpus: int, relabel: bool, env: dict[str, str] | None = None
    ) -> Node:
        node = Node(name, hw, gpu, len(self.nodes), dict(env or {}))
        if relabel or self.fake:
            node.env["RAY_OVERRIDE_LABELS"] = json.dumps({ACCEL_LABEL: hw})
            node.env["RAY_OVERRIDE_RESOURCES"] = json.dumps({f"accelerator_type:{hw}": 1})
        self._ray_start(node, [f"--address={self.address}", f"--num-cpus={cpus}", "--num-gpus=1"])
        self.nodes.append(node)
        self._wait_for(node)
        return node

    def ray_nodes(self) -> list[dict[str, Any]]:
        code = (
            f"import json, ray; ray.init(address={self.address!r}, logging_level='ERROR', log_to_driver=False); "
            "print('NODES=' + json.dumps(ray.nodes()))"
        )
        env = {**os.environ, "RAY_AUTH_MODE": "disabled"}
        out = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60
        )
        found = [ln for ln in out.stdout.splitlines() if ln.startswith("NODES=")]
        return json.loads(found[-1][len("NODES=") :]) if found else []

    def _wait_for(self, node: Node, timeout: float = 90.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if node.proc and node.proc.poll() is not None:
                raise RuntimeError(
                    f"ray start of node {node.name} exited {node.proc.returncode}: see node-{node.name}.log"
                )
            for n in self.ray_nodes():
                if n.get("Alive") and n.get("NodeManagerPort") == node.manager_port:
                    node.node_id = n["NodeID"]
                    print(
                        f"node {node.name} up: {n['NodeID'][:12]} {n.get('Labels', {}).get(ACCEL_LABEL, '-')} "
                        f"{ {k: v for k, v in n['Resources'].items() if not k.startswith('node:')} }",
                        flush=True,
                    )
                    return
            time.sleep(1.0)
        raise RuntimeError(f"node {node.name} did not join in {timeout:.0f} s: see node-{node.name}.log")

    def raylet(self, node: Node):
        import psutil

        for p in psutil.process_iter(["name", "cmdline"]):
            cmd = p.info.get("cmdline") or []
            if any("raylet" in c for c in cmd[:1]) and f"--node_manager_port={node.manager_port}" in cmd:
                return p
        return None

    def running_job(self, node: Node) -> bool:
        """Whether a job process (`python -m workers.bench`) runs under the node's raylet."""
        import psutil

        raylet = self.raylet(node)
        try:
            kids = raylet.children(recursive=True) if raylet else []
            return any("workers.bench" in " ".join(k.cmdline()) for k in kids)
        except psutil.Error:
            return False

    def kill_node(self, node: Node, how: str) -> None:
        """SIGKILL the node's raylet (a lost machine), then end its `ray start` group."""
        p = self.raylet(node)
        if p is not None:
            p.kill()
        node.killed = how
        print(f"node {node.name} ({node.hw}) killed: {how}", flush=True)
        time.sleep(2.0)
        self._end(node)

    def _end(self, node: Node) -> None:
        if node.proc and node.proc.poll() is None:
            try:
                os.killpg(node.proc.pid, signal.SIGTERM)
                node.proc.wait(timeout=30)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(node.proc.pid, signal.SIGKILL)

    def stop(self) -> None:
        for node in reversed(self.nodes):
            self._end(node)


def gpu_class(fake: bool) -> tuple[str, int]:
    """(the class Ray names GPU 0 by, the GPU count)."""
    if fake:
        return "H100", 2
    from ray._private.accelerators import NvidiaGPUAcceleratorManager as nv

    return nv.get_current_node_accelerator_type() or "GPU", nv.get_current_node_num_accelerators()


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


def main(argv: list[str] | None = None) -> int:
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
    args = ap.parse_args(argv)
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
        cluster.start_head()
        gpu0 = cluster.add("gpu0", first, 0, cpus, relabel=False)
        gpu1a = cluster.add("gpu1-a", second, 1, max(1, cpus // 2), relabel=True)
        gpu1b = cluster.add("gpu1-b", second, 1, max(1, cpus // 2), relabel=True)
        summary["nodes_phase1"] = {
            n.name: {"class": n.hw, "gpu": n.gpu, "node_id": n.node_id} for n in (gpu0, gpu1a, gpu1b)
        }

        # 1. one sweep across both classes; a node of the second class lost mid-sweep
        sweep_out = out / "sweep"
        state: dict[str, Any] = {"dispatched": None}

        def watch(line: str) -> None:
            if state["dispatched"] is None and " jobs planned" in line:
                state["dispatched"] = time.monotonic()

        import threading

        def killer() -> None:
            # once a job process (workers.bench) runs under gpu1-a's raylet, give it --kill-after
            # seconds into its work, then take the node away
            while not state.get("done") and not cluster.running_job(gpu1a):
                time.sleep(0.2)
            if state.get("done"):
                return
            seen = time.monotonic()
            while (
                time.monotonic() - seen < args.kill_after
                and cluster.running_job(gpu1a)
                and not state.get("done")
            ):
                time.sleep(0.2)
            if not state.get("done") and cluster.running_job(gpu1a):
                since = round(time.monotonic() - (state["dispatched"] or seen), 1)
                state["killed_at_s"] = since
                cluster.kill_node(
                    gpu1a, f"raylet SIGKILLed {since} s after dispatch, with a job process running under it"
                )

        sweep_args = ["sweep", args.sweep, "--address", cluster.address, "--out", str(sweep_out)]
        summary["commands"].append(shlex.join(["orchestrate", *sweep_args]))
        th = threading.Thread(target=killer, daemon=True)
        th.start()
        rc = orchestrate(sweep_args, out / "sweep.log", on_line=watch)
        state["done"] = True
        th.join(timeout=5)
        summary["sweep_rc"] = rc
        summary["killed"] = {"node": gpu1a.name, "node_id": gpu1a.node_id, "how": gpu1a.killed}
        summary["checks"].update(check_sweep(sweep_out, cluster, first, second, gpu1a, gpu1b))

        # 2. presets and export per class
        presets_args = ["presets", str(sweep_out)]
        summary["commands"].append(shlex.join(["orchestrate", *presets_args]))
        summary["presets_rc"] = orchestrate(presets_args, out / "presets.log")
        summary["checks"]["presets_per_class"] = presets_per_class(sweep_out)
        if not args.skip_export:
            for hw in (first, second):
                exp = ["export", str(sweep_out), "--hardware", hw, "--dest", str(out / f"export-{hw}")]
                summary["commands"].append(shlex.join(["orchestrate", *exp]))
                rc = orchestrate(exp, out / f"export-{hw}.log")
                summary[f"export_{hw}_rc"] = rc
                summary[f"export_{hw}_says"] = last_lines(out / f"export-{hw}.log", 3)
            summary["checks"]["export_first_class_ok"] = summary[f"export_{first}_rc"] == 0
            summary["checks"]["export_second_class_refused"] = summary[f"export_{second}_rc"] == 2

        # 3. nightlies: one plain, then two with the second class slowed by the test hook
        cluster.kill_node(gpu1b, "stopped before the nightlies (one node per GPU from here)")
        history = out / "nightly"
        nightly_args = [
            "nightly",
            args.nightly_sweep,
            "--history",
            str(history),
            "--address",
            cluster.address,
        ]
        runs = []
        for night in (1, 2, 3):
            if night == 2:
                hook = {"ORCHESTRATE_TEST_SLOWDOWN": f"{second}={args.slowdown}"}
                cluster.add("gpu1-slow", second, 1, cpus, relabel=True, env=hook)
                summary["slowdown_hook"] = (
                    f"ORCHESTRATE_TEST_SLOWDOWN={second}={args.slowdown} on the {second} node only"
                )
            elif night == 1:
                cluster.add("gpu1-c", second, 1, cpus, relabel=True)
            summary["commands"].append(shlex.join(["orchestrate", *nightly_args]))
            rc = orchestrate(nightly_args, out / f"nightly-{night}.log")
            runs.append(rc)
            if night == 1:
                cluster.kill_node(cluster.nodes[-1], "stopped: restarted with the slowdown hook")
            time.sleep(1.1)  # nightly names runs by the second
        summary["nightly_rc"] = runs
        summary["checks"].update(check_nightly(history, first, second))
    finally:
        cluster.stop()
        summary["wall_s"] = round(time.monotonic() - t0, 1)
        (out / "summary.json").write_text(json.dumps(summary, indent=1, default=str))
        (out / "summary.md").write_text(render(summary))
    ok = all(v.get("ok") if isinstance(v, dict) else bool(v) for v in summary["checks"].values())
    print(render(summary))
    return 0 if ok else 1


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
