"""The output lock: a live holder refuses a second driver (named in the message); a killed holder,
a reused pid, a silent holder on another host and an unreadable old lock are taken over. A real
holder process is started and really killed; a real `orchestrate sweep` pair is in
tests/integration/test_damaged_output.py."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from store import lock as locking
from store.lock import LOCK_FILE, OutputLock, OutputLocked

REPO = Path(__file__).resolve().parents[2]

HOLDER = """
import sys, time
from store.lock import OutputLock
OutputLock.acquire(sys.argv[1], ["orchestrate", "sweep", "held.yaml"])
print("held", flush=True)
time.sleep(120)
"""


def test_a_second_driver_is_refused_with_the_holders_name_and_released_after(tmp_path):
    with OutputLock.acquire(tmp_path, ["orchestrate", "sweep", "a.yaml"]) as held:
        record = json.loads((tmp_path / LOCK_FILE).read_text())
        assert record["pid"] == os.getpid() and record["token"] == held.token
        with pytest.raises(OutputLocked) as info:
            OutputLock.acquire(tmp_path, ["orchestrate", "sweep", "b.yaml"])
        message = str(info.value)
        assert f"pid {os.getpid()} on {socket.gethostname()}" in message
        assert "running `orchestrate sweep a.yaml`" in message and "another --out" in message
    assert not (tmp_path / LOCK_FILE).exists()
    OutputLock.acquire(tmp_path).release()  # free again


def test_a_killed_holder_does_not_leave_the_lock_stuck(tmp_path):
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(tmp_path)], cwd=REPO, stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(OutputLocked, match=f"pid {holder.pid} on .*held.yaml"):
            OutputLock.acquire(tmp_path)
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    lock = OutputLock.acquire(tmp_path)
    assert lock.taken_over.startswith(f"took over the lock of pid {holder.pid} on {socket.gethostname()}")
    assert lock.taken_over.endswith(f"pid {holder.pid} is not running")
    lock.release()


def _plant(path: Path, **record) -> None:
    (path / LOCK_FILE).write_text(json.dumps({"token": "theirs", "started_at": "then", **record}))


def test_a_reused_pid_is_not_mistaken_for_the_holder(tmp_path):
    # our parent is alive, but it started long before this (made-up) lock's holder did
    _plant(tmp_path, pid=os.getppid(), pid_started=time.time() + 1000, host=socket.gethostname())
    lock = OutputLock.acquire(tmp_path)
    assert f"pid {os.getppid()} is now another process" in lock.taken_over
    lock.release()


def test_another_hosts_lock_holds_while_its_heartbeat_is_fresh(tmp_path):
    _plant(tmp_path, pid=1, host="node-7", heartbeat=time.time() - 10)
    with pytest.raises(OutputLocked, match="pid 1 on node-7"):
        OutputLock.acquire(tmp_path)
    _plant(tmp_path, pid=1, host="node-7", heartbeat=time.time() - locking.STALE_S - 5)
    lock = OutputLock.acquire(tmp_path)
    assert "no heartbeat for" in lock.taken_over
    lock.release()


def test_an_unreadable_lock_is_judged_by_its_age(tmp_path):
    (tmp_path / LOCK_FILE).write_bytes(b"\x00garbage")
    with pytest.raises(OutputLocked, match="an unreadable lock file"):
        OutputLock.acquire(tmp_path)
    old = time.time() - locking.STALE_S - 5
    os.utime(tmp_path / LOCK_FILE, (old, old))
    OutputLock.acquire(tmp_path).release()


def test_the_heartbeat_is_rewritten_while_the_holder_runs(tmp_path, monkeypatch):
    monkeypatch.setattr(locking, "HEARTBEAT_S", 0.0)
    lock = OutputLock.acquire(tmp_path)
    first = json.loads((tmp_path / LOCK_FILE).read_text())["heartbeat"]
    time.sleep(0.05)
    lock.refresh()
    assert json.loads((tmp_path / LOCK_FILE).read_text())["heartbeat"] > first
    lock.release()


def test_the_lock_works_on_an_object_store(s3_bucket, monkeypatch):
    monkeypatch.setattr(locking, "SETTLE_S", 0.1)
    uri = s3_bucket.uri("run")
    with (
        OutputLock.acquire(uri, ["orchestrate", "sweep", "s3.yaml"]),
        pytest.raises(OutputLocked, match="s3.yaml"),
    ):
        OutputLock.acquire(uri)
    OutputLock.acquire(uri).release()  # released: free again


def test_a_lock_covers_what_lies_inside_except_for_its_own_holder(tmp_path):
    """A tune holds OUT and its per-rung sweeps lock OUT/rung0 inside it: allowed to the holder,
    refused to any other live driver (naming the holder of OUT), free again once OUT is released."""
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(tmp_path / "out")], cwd=REPO, stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(OutputLocked) as info:
            OutputLock.acquire(tmp_path / "out" / "rung0")
        assert str(info.value).startswith(
            f"{tmp_path / 'out' / 'rung0'} lies inside {tmp_path / 'out'}, which is in use by another "
            f"orchestrate driver: pid {holder.pid} on {socket.gethostname()}"
        )
        assert "held.yaml" in str(info.value)
        OutputLock.acquire(tmp_path / "elsewhere").release()  # beside it: free
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    OutputLock.acquire(tmp_path / "out" / "rung0").release()  # a dead holder of OUT blocks nothing

    with OutputLock.acquire(tmp_path / "out"):  # this process's own lock: what is inside is ours
        with OutputLock.acquire(tmp_path / "out" / "rung0") as inner:
            assert (tmp_path / "out" / "rung0" / LOCK_FILE).exists()
            with pytest.raises(OutputLocked):  # the same place twice is refused, even to its holder
                OutputLock.acquire(tmp_path / "out" / "rung0")
        assert not (tmp_path / "out" / "rung0" / LOCK_FILE).exists()
        inner.release()  # twice is harmless
        assert (tmp_path / "out" / LOCK_FILE).exists()
    assert not (tmp_path / "out" / LOCK_FILE).exists()


def test_holding_keeps_the_heartbeat_fresh_and_says_when_it_took_over(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(locking, "HEARTBEAT_S", 0.06)
    _plant(tmp_path, pid=1, host="node-7", heartbeat=time.time() - locking.STALE_S - 5)
    with locking.holding(tmp_path, ["orchestrate", "presets", "x"]) as held:
        assert held.taken_over and "no heartbeat for" in held.taken_over
        first = json.loads((tmp_path / LOCK_FILE).read_text())
        assert first["command"] == "orchestrate presets x"
        time.sleep(0.5)  # nobody calls refresh(): the holding thread does
        assert json.loads((tmp_path / LOCK_FILE).read_text())["heartbeat"] > first["heartbeat"]
    assert not (tmp_path / LOCK_FILE).exists()
    assert f"note: {tmp_path}: took over the lock of pid 1 on node-7" in capsys.readouterr().err
