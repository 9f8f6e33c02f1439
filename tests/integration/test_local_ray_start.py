"""A sweep's private local Ray on a busy host: where its raylet does not register with its GCS
within the 30 s `ray.init` waits, the start fails with "timed out during startup"; the sweep ends
that start's processes and starts Ray again (`orchestrator.fleet.ray_tasks.start_local`), and
gives up after its tries with an error that says what to do.

The delay is Ray's own: its GCS holds each RegisterNode request for 40 s
(`RAY_testing_asio_delay_us`, read by the GCS process at its start), as an overloaded GCS would."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

CHILD = textwrap.dedent(
    """
    import json, logging, os, sys, time
    import psutil, ray
    from orchestrator.fleet.ray_tasks import start_local

    DELAY = "NodeInfoGcsService.grpc_server.RegisterNode=40000000:40000000"
    me = psutil.Process()

    def ray_children():
        return sorted(p.name() for p in me.children(recursive=True) if p.name() in ("gcs_server", "raylet"))

    def init_delayed(slow_starts):
        calls = []
        def init():
            calls.append(time.monotonic())
            if len(calls) <= slow_starts:
                os.environ["RAY_testing_asio_delay_us"] = DELAY
            else:
                os.environ.pop("RAY_testing_asio_delay_us", None)
            ray.init(address="local", num_cpus=1, include_dashboard=False, logging_level=logging.ERROR)
        return init, calls

    out = {}
    # every start slow, one try: the error, and nothing of the start left running
    init, calls = init_delayed(1)
    try:
        start_local(init, tries=1)
        out["gave_up"] = None
    except RuntimeError as exc:
        out["gave_up"] = str(exc)
    out["gave_up_calls"], out["after_giving_up"] = len(calls), ray_children()

    # the first start slow, the second not: Ray runs, with one GCS and one raylet
    init, calls = init_delayed(1)
    start_local(init, tries=3)
    out["calls"], out["running"] = len(calls), ray_children()
    out["cpus"] = ray.cluster_resources().get("CPU")
    ray.shutdown()
    print("RESULT=" + json.dumps(out))
    """
)


@pytest.mark.slow  # a tier of its own, after the default one (docs/testing.md): two 30 s waits of Ray's
def test_a_local_ray_that_times_out_during_startup_is_started_again_with_the_first_starts_processes_ended():
    done = subprocess.run(
        [sys.executable, "-c", CHILD],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert done.returncode == 0, done.stderr[-3000:]
    line = [ln for ln in done.stdout.splitlines() if ln.startswith("RESULT=")][-1]
    got = json.loads(line[len("RESULT=") :])

    assert got["gave_up_calls"] == 1, got
    assert "did not start (tries: 1)" in got["gave_up"] and "--address" in got["gave_up"], got
    assert "timed out during startup" in got["gave_up"], got
    assert got["after_giving_up"] == [], got  # the failed start's GCS and raylet were ended

    assert got["calls"] == 2, got  # started again once, and then it ran
    assert got["running"] == ["gcs_server", "raylet"], got  # the first start's were ended
    assert got["cpus"] == 1.0, got
    assert "starting it again, try 2 of 3" in done.stderr, done.stderr[-2000:]
