"""The multi-node Ray cluster of `benchmarks/two_class.py`, on one host: a head without CPUs or
GPUs, and GPU nodes started one at a time, each a `ray start --block` process group with ports of
its own (several raylets on one host must not share the dashboard agent's or the object manager's
port), a node relabelled as another class through Ray's autoscaler overrides where asked; a node
is lost by SIGKILLing its raylet."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

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
        # on SIGTERM, `ray start --block` drains the node for up to 30 s first (for Serve); a node
        # stopped here has nothing to drain
        env["RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S"] = "0"
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

    def _start(self, node: Node, args: list[str]) -> None:
        """`ray start` the node and wait for it to join, started again where `ray start` timed out
        during startup (its raylet not registered with the GCS within the 30 s Ray waits: a busy
        host) as a sweep's local Ray is (`orchestrator.fleet.ray_tasks.start_local`), each failed
        start's process group ended before the next."""
        from orchestrator.fleet.ray_tasks import start_local

        log = self.log_dir / f"node-{node.name}.log"

        def start() -> None:
            offset = log.stat().st_size if log.exists() else 0
            self._ray_start(node, args)
            try:
                self._wait_for(node)
            except RuntimeError as exc:  # with what `ray start` said, which start_local reads
                said = log.read_bytes()[offset:].decode(errors="replace") if log.exists() else ""
                raise RuntimeError(f"{exc}: {said[-1000:]}") from None

        def end_failed() -> None:  # the failed start's survivors left our process tree: its group
            with contextlib.suppress(ProcessLookupError):
                os.killpg(node.proc.pid, signal.SIGKILL)
            node.proc.wait()

        start_local(start, end_failed=end_failed)

    def start_head(self) -> None:
        head = Node("head", "", None, 0)
        self.nodes.append(head)
        self._start(
            head,
            ["--head", f"--port={HEAD_PORT}", "--num-cpus=0", "--num-gpus=0", "--include-dashboard=false"],
        )

    def add(
        self, name: str, hw: str, gpu: int, cpus: int, relabel: bool, env: dict[str, str] | None = None
    ) -> Node:
        node = Node(name, hw, gpu, len(self.nodes), dict(env or {}))
        if relabel or self.fake:
            node.env["RAY_OVERRIDE_LABELS"] = json.dumps({ACCEL_LABEL: hw})
            node.env["RAY_OVERRIDE_RESOURCES"] = json.dumps({f"accelerator_type:{hw}": 1})
        self.nodes.append(node)
        self._start(node, [f"--address={self.address}", f"--num-cpus={cpus}", "--num-gpus=1"])
        return node

    def ray_nodes(self, until_port: int | None = None, within: float = 0.0) -> list[dict[str, Any]]:
        """`ray.nodes()` of the cluster, from a driver of its own in a fresh process (none in this
        one); with `until_port`, that driver asks again every 0.2 s, for up to `within` seconds,
        until the node of that node-manager port is alive (one interpreter start and connection a
        wait, not one a poll)."""
        code = (
            "import json, time, ray\n"
            f"ray.init(address={self.address!r}, logging_level='ERROR', log_to_driver=False)\n"
            f"end = time.monotonic() + {within}\n"
            "while True:\n"
            "    nodes = ray.nodes()\n"
            f"    if time.monotonic() >= end or any(n.get('Alive') and n.get('NodeManagerPort') == {until_port}"
            " for n in nodes):\n"
            "        break\n"
            "    time.sleep(0.2)\n"
            "print('NODES=' + json.dumps(nodes))\n"
        )
        env = {**os.environ, "RAY_AUTH_MODE": "disabled"}
        out = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60 + within
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
            within = max(0.0, min(10.0, deadline - time.monotonic()))
            for n in self.ray_nodes(node.manager_port, within):
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
        self._reap(self._term(node))

    @staticmethod
    def _term(node: Node) -> Node | None:
        """SIGTERM the node's `ray start` group if it still runs; the node, or None if it did not."""
        if node.proc and node.proc.poll() is None:
            try:
                os.killpg(node.proc.pid, signal.SIGTERM)
                return node
            except ProcessLookupError:
                pass
        return None

    @staticmethod
    def _reap(node: Node | None) -> None:
        """Wait up to 30 s for a node `_term` signalled to end, then SIGKILL its group."""
        if node is None or node.proc is None:
            return
        try:
            node.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(node.proc.pid, signal.SIGKILL)

    def stop(self) -> None:
        """End every node still running: the GPU nodes all at once, then the head."""
        head, *gpu_nodes = self.nodes or [None]
        for node in [self._term(n) for n in reversed(gpu_nodes)]:
            self._reap(node)
        if head is not None:
            self._end(head)


def gpu_class(fake: bool) -> tuple[str, int]:
    """(the class Ray names GPU 0 by, the GPU count)."""
    if fake:
        return "H100", 2
    from ray._private.accelerators import NvidiaGPUAcceleratorManager as nv

    return nv.get_current_node_accelerator_type() or "GPU", nv.get_current_node_num_accelerators()
