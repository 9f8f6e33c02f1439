"""The dispatch loop's own logic, driven by a stand-in for the three Ray calls it makes (remote,
wait, get), so that the order of events is exact. Real Ray runs it in the integration tier."""

from __future__ import annotations

import itertools

import pytest

from compiler.config import CompileConfig
from compiler.job import Job, MeasureSpec, ModelSpec
from orchestrator.fleet import scheduler as scheduler_module
from orchestrator.fleet.inventory import HardwareClass
from orchestrator.fleet.scheduler import Scheduler


class InstantRay:
    """Every task is done as soon as it is submitted."""

    class exceptions:  # noqa: N801 - mirrors ray.exceptions
        RayTaskError = RuntimeError

    def __init__(self):
        self.ids = itertools.count()

    def remote(self, job_dict, threads, *args):
        return ("ref", next(self.ids))

    def wait(self, refs, num_returns, timeout):
        return list(refs)[: max(num_returns, 0) or len(refs)], []

    def get(self, ref):
        return {"status": "ok", "eager_ms": 1.0, "compiled_ms": 1.0, "subprocess_s": 0.0}


def _jobs(n: int) -> list[Job]:
    return [
        Job(
            sweep="s",
            hardware="cpu",
            device="cpu",
            model=ModelSpec(id="python:workers.toy:mlp", name="mlp"),
            batch_size=i + 1,
            dtype="fp32",
            config=CompileConfig(name="default"),
            measure=MeasureSpec(),
            timeout_s=60,
        )
        for i in range(n)
    ]


@pytest.mark.parametrize("slots", [1, 2])
def test_a_free_slot_is_refilled_at_once_without_sleeping(monkeypatch, slots):
    ray = InstantRay()
    sleeps = []
    monkeypatch.setattr(scheduler_module.time, "sleep", sleeps.append)
    rows = []
    sched = Scheduler(
        classes={"cpu": HardwareClass("cpu", "cpu", ["n1"], slots=slots)},
        remotes={"cpu": ray},
        task_args=(),
        run_id="r",
        emit=lambda row, job, wall, tables=None: rows.append(row),
        inventory=lambda: {"cpu": HardwareClass("cpu", "cpu", ["n1"], slots=slots)},
    )
    sched.add(_jobs(10))
    sched.run(ray, started=lambda: None, tick=lambda: None)
    assert len(rows) == 10 and {r["status"] for r in rows} == {"ok"}
    assert sleeps == []  # every job finished with the queue non-empty: the loop must not idle


def test_a_class_with_no_free_slot_waits_between_checks(monkeypatch):
    ray = InstantRay()
    sleeps = []
    classes = {"cpu": HardwareClass("cpu", "cpu", ["n1"], slots=0)}

    def sleep(seconds):
        sleeps.append(seconds)
        classes["cpu"].slots = 1  # a node frees up

    monkeypatch.setattr(scheduler_module.time, "sleep", sleep)
    sched = Scheduler(
        classes=classes,
        remotes={"cpu": ray},
        task_args=(),
        run_id="r",
        emit=lambda row, job, wall, tables=None: None,
        inventory=lambda: classes,
    )
    sched.add(_jobs(2))
    sched.run(ray, started=lambda: None, tick=lambda: None)
    assert sleeps == [scheduler_module.WAIT_S]
