"""workers.affinity: node-wide core reservations (real flock-ed files, real processes)."""

from __future__ import annotations

import ast
import os
import signal
import subprocess
import sys
import time

import pytest

from workers import affinity
from workers.affinity import format_cpus, parse_cpus, reserve_cores

CPUS = sorted(os.sched_getaffinity(0))


@pytest.mark.parametrize(
    ("cpus", "text"), [([0], "0"), ([0, 1, 2, 3], "0-3"), ([0, 1, 2, 3, 8], "0-3,8"), ([5, 1, 3, 2], "1-3,5")]
)
def test_format_and_parse_round_trip(cpus, text):
    assert format_cpus(cpus) == text
    assert parse_cpus(text) == set(cpus)


@pytest.mark.parametrize("bad", ["a", "3-1", "-1", "1-x"])
def test_parse_rejects_nonsense(bad):
    with pytest.raises(ValueError):
        parse_cpus(bad)


def test_two_jobs_get_different_cores_and_a_third_is_told_why_not(lock_dir):
    half = max(1, len(CPUS) // 2)
    first = reserve_cores(half)
    second = reserve_cores(len(CPUS) - half)
    try:
        assert first.pinned and second.pinned
        assert not set(first.cpus) & set(second.cpus)
        third = reserve_cores(1)
        assert not third.pinned and "were free" in third.note
    finally:
        first.release()
        second.release()
    again = reserve_cores(len(CPUS))
    assert again.cpus == tuple(CPUS)  # released locks are free again
    again.release()


def test_preferred_cores_come_first(lock_dir):
    lease = reserve_cores(1, prefer=[CPUS[-1]])
    try:
        assert lease.cpus == (CPUS[-1],)
    finally:
        lease.release()


def test_more_cores_than_the_node_has_is_not_pinned(lock_dir):
    lease = reserve_cores(len(CPUS) + 1)
    assert not lease.pinned and f"may use {len(CPUS)}" in lease.note


def test_a_killed_holder_frees_its_cores(lock_dir):
    code = (
        "import sys, time; from workers.affinity import reserve_cores\n"
        f"lease = reserve_cores({len(CPUS)}); print(lease.cpus, flush=True); time.sleep(60)"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == str(tuple(CPUS))
        assert not reserve_cores(1).pinned  # all held by the other process
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
        deadline = time.monotonic() + 5
        while not (lease := reserve_cores(1)).pinned and time.monotonic() < deadline:
            time.sleep(0.05)
        assert lease.pinned
        lease.release()
    finally:
        proc.kill()


def test_job_process_pins_itself_from_the_environment():
    code = "from workers.affinity import pin_from_environment; print(pin_from_environment())"
    env = {**os.environ, affinity.AFFINITY_ENV: str(CPUS[-1])}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == repr((str(CPUS[-1]), True, None))
    env[affinity.AFFINITY_ENV] = "999999"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    affinity_text, pinned, note = ast.literal_eval(out.stdout.strip())
    assert affinity_text == format_cpus(CPUS) and pinned is False and "could not pin to cores 999999" in note


@pytest.mark.skipif(len(CPUS) < 2, reason="needs two cores to pin to fewer than it may use")
def test_a_pinned_process_unpins_itself_onto_every_core_it_may_use():
    """A helper that stands in for a serving process (`--serving-prepare`) inherits the job's
    pinning from its parent; `unpin` widens it again, to what this (unpinned) test runs on."""
    code = (
        "import os; from workers.affinity import unpin; "
        f"os.sched_setaffinity(0, {{{CPUS[-1]}}}); print(len(os.sched_getaffinity(0)), unpin())"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    before, after = out.stdout.split()
    assert before == "1" and parse_cpus(after) >= set(CPUS), out.stdout
    # a helper marked to unpin does so where a job process pins itself, whatever cores it names
    code = (
        "import os; from workers.affinity import pin_from_environment; "
        f"os.sched_setaffinity(0, {{{CPUS[-1]}}}); print(pin_from_environment())"
    )
    env = {**os.environ, affinity.UNPIN_ENV: "1", affinity.AFFINITY_ENV: str(CPUS[-1])}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    cpus, pinned, note = ast.literal_eval(out.stdout.strip())
    assert parse_cpus(cpus) >= set(CPUS) and pinned is False and note is None, out.stdout


@pytest.mark.skipif(len(CPUS) < 2, reason="needs two cores for a runner on fewer than the node's")
def test_a_helper_unpins_onto_its_runners_cores_not_the_whole_node(tmp_path):
    """A sweep started on part of a node (`taskset`, beside another sweep on the rest) keeps its
    serving stand-ins there: the runner names its own cores (`NODE_CPUS_ENV`, set by
    `workers.runner._pin` from its affinity) and a helper marked to unpin goes back to those."""
    from workers.runner import _pin

    runner_cpus = {CPUS[0]}
    code = (
        "import os; from workers.runner import _pin; from workers.affinity import CoreLease; "
        f"os.sched_setaffinity(0, {runner_cpus!r}); env = {{}}; _pin(env, CoreLease(())); print(env)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert ast.literal_eval(out.stdout.strip()) == {affinity.NODE_CPUS_ENV: str(CPUS[0])}, out.stdout
    code = (
        "import os; from workers.affinity import pin_from_environment; "
        f"os.sched_setaffinity(0, {{{CPUS[-1]}}}); print(pin_from_environment())"
    )
    env = {**os.environ, affinity.UNPIN_ENV: "1", affinity.NODE_CPUS_ENV: str(CPUS[0])}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    cpus, pinned, _ = ast.literal_eval(out.stdout.strip())
    assert parse_cpus(cpus) == runner_cpus and pinned is False, out.stdout
    env = {k: v for k, v in env.items() if k != affinity.NODE_CPUS_ENV}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert parse_cpus(ast.literal_eval(out.stdout.strip())[0]) >= set(CPUS), out.stdout  # unset: every core
    env = {**os.environ}
    _pin(env, affinity.CoreLease((CPUS[-1],)))  # a pinned job's environment names both
    assert env[affinity.AFFINITY_ENV] == str(CPUS[-1])
    assert parse_cpus(env[affinity.NODE_CPUS_ENV]) == set(CPUS)


def test_held_cores_counts_the_cores_another_holder_has_locked(lock_dir):
    """What a sweep checks at its start: cores another sweep's jobs hold; checking takes no lock."""
    assert affinity.held_cores(lock_dir) == (0, len(os.sched_getaffinity(0)))
    holder = reserve_cores(1, directory=lock_dir)  # another job's lease, held by its descriptors
    try:
        assert affinity.held_cores(lock_dir) == (1, len(os.sched_getaffinity(0)))
        again = reserve_cores(len(os.sched_getaffinity(0)) - 1, directory=lock_dir)
        assert again.pinned  # the check left every free core free
        again.release()
    finally:
        holder.release()
    assert affinity.held_cores(lock_dir)[0] == 0
