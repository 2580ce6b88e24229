"""The scheduler's decisions as values (server/scheduling/decisions.py): who leaves a lane, decided from its jobs
without changing them, and each decision applied in one call (``Scheduler.apply``); no inference threads."""

from __future__ import annotations

import dataclasses
import threading
import time
from pathlib import Path

import pytest

from server.errors import Cancelled, DeadlineExceeded
from server.operations.metrics import Metrics
from server.scheduling import scheduler as scheduler_module
from server.scheduling.decisions import Leaving, Pause, leaving
from server.scheduling.scheduler import Scheduler
from testkit.servers import server_config
from tests.server.fake_engine import FakeEngine, fake_job


def _unstarted(max_batch_size: int = 64) -> tuple[FakeEngine, Scheduler]:
    engine = FakeEngine()
    config = server_config(
        Path("unused"), scheduler="continuous", lanes=(16,), lane_replicas=1, max_batch_size=max_batch_size
    )
    return engine, Scheduler([engine], config, Metrics())  # not started: the test applies decisions itself


def test_jobs_leave_a_lane_when_answered_elsewhere_cancelled_or_past_their_deadline():
    engine = FakeEngine()
    answered, cancelled, late, on_time, open_ended = (fake_job(engine, ["A dog runs."]) for _ in range(5))
    answered.finished = answered.cancelled = True  # ended on another lane first: its error stands
    cancelled.cancelled = True
    late.deadline, on_time.deadline = 10.0, 30.0
    decision = leaving([answered, cancelled, late, on_time, open_ended], now=20.0)
    assert decision.answered == (answered,)
    assert [(job, type(error)) for job, error in decision.ending] == [(cancelled, Cancelled), (late, DeadlineExceeded)]
    assert not cancelled.finished and not late.finished  # deciding answers nobody
    assert leaving([on_time, open_ended], now=20.0) == Leaving()
    with pytest.raises(dataclasses.FrozenInstanceError):
        decision.answered = ()


def test_applying_leaving_answers_the_job_and_frees_its_rows_and_queue_places():
    engine, scheduler = _unstarted(max_batch_size=1)
    lane = scheduler.lanes[0]
    lane.load(engine)
    errors = []
    job = fake_job(engine, ["A dog runs.", "A cat sleeps."], on_done=errors.append)
    scheduler.submit(job)
    scheduler._encode_and_join(lane, scheduler._admit(lane))  # one decodes, one waits
    assert lane.batch.rows == 1 and scheduler.waiting == 1
    job.cancelled = True
    decision = leaving([job], time.monotonic())
    assert lane.batch.rows == 1 and not errors  # decided, not yet applied
    scheduler.apply(lane, decision)
    assert [type(error) for error in errors] == [Cancelled]
    assert lane.batch.rows == 0 and scheduler.running == 0 and scheduler.waiting == 0
    assert scheduler.memory.reserved_bytes == 0


class SleepingClock:
    """The scheduler's clock, still but for the sleeps it is asked for, which it records."""

    def __init__(self, now: float) -> None:
        self.now, self.slept = now, []

    def perf_counter(self) -> float:
        return self.now

    monotonic = perf_counter

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


def test_applying_a_pause_sleeps_it_counts_it_and_the_lane_owes_nothing_after(monkeypatch):
    engine, scheduler = _unstarted()
    lane = scheduler.lanes[0]
    paused = scheduler.metrics.lane_paused.labels(engine.name, lane.name)
    before = paused._value.get()
    clock = SleepingClock(5.0)
    monkeypatch.setattr(scheduler_module, "time", clock)
    scheduler.apply(lane, Pause(owed_seconds=0.003, seconds=0.0, at=5.0))  # owed, not paid yet
    assert (lane.owed_seconds, lane.off_cpu_since) == (0.003, 5.0) and paused._value.get() == before
    assert clock.slept == []
    scheduler.apply(lane, Pause(owed_seconds=0.01, seconds=0.01, at=5.0))
    assert clock.slept == [0.01]
    assert paused._value.get() - before == pytest.approx(0.01)
    assert lane.owed_seconds == 0.0 and lane.off_cpu_since == pytest.approx(5.01)  # off the CPU until it woke


def test_a_step_takes_the_schedulers_lock_once_on_each_path():
    """A plain lock: a path that took it twice would hang here (and in every server test), not pass."""
    engine, scheduler = _unstarted(max_batch_size=1)
    assert type(scheduler.lock) is type(threading.Lock())
    lane = scheduler.lanes[0]
    lane.load(engine)
    job = fake_job(engine, ["A dog runs.", "A cat sleeps."])
    scheduler.submit(job)
    admitted = scheduler._admit(lane)  # decided and applied under one acquisition
    assert len(admitted) == 1 and scheduler.waiting == 1 and not scheduler.lock.locked()
    job.cancelled = True
    scheduler.apply(lane, leaving([job], time.monotonic()))
    assert scheduler.waiting == 0 and not scheduler.lock.locked()
