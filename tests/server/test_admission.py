"""Who joins a lane's batch (server/admission.py): an ``Admission`` decided from the lanes' queues without
changing them, then applied at once; no inference threads (tests/server/test_scheduler.py has the lanes
running)."""

from __future__ import annotations

import time
from pathlib import Path

from server.decisions import Admission, Leaving
from server.errors import Cancelled
from server.metrics import Metrics
from server.policies import BACKLOG_AFTER_SECONDS, STARVATION_SECONDS
from server.scheduler import Scheduler
from testkit.sentences import own_sentences
from testkit.servers import server_config
from tests.server.fake_engine import FakeEngine, fake_job


def _unstarted(max_batch_size: int) -> tuple[FakeEngine, Scheduler]:
    engine = FakeEngine()
    config = server_config(
        Path("unused"), scheduler="continuous", lanes=(16,), max_batch_size=max_batch_size, first_lane_replicas=1
    )
    return engine, Scheduler([engine], config, Metrics())  # not started: the test decides and applies itself


def test_an_admission_is_decided_without_changing_the_queues_and_applied_at_once():
    engine, scheduler = _unstarted(max_batch_size=2)
    lane = scheduler.lanes[0]
    jobs = [fake_job(engine, ["A dog runs."]) for _ in range(3)]
    for job in jobs:
        scheduler.submit(job)
    decision = scheduler.admissions.decide(lane, time.monotonic())
    assert decision == Admission(joining=(jobs[0].segments[0], jobs[1].segments[0]))  # max_batch_size
    assert len(lane.waiting) == 3 and scheduler.memory.reserved_bytes == 0  # deciding changed nothing
    assert scheduler.admissions.decide(lane, time.monotonic()) == decision
    scheduler.apply(lane, decision)
    assert list(lane.waiting) == jobs[2].segments
    assert scheduler.memory.reserved_bytes == sum(s.reserved_bytes for s in decision.admitted)


def test_backlog_moves_to_the_shorter_lane_when_the_admission_is_applied():
    engine, scheduler = _unstarted(max_batch_size=2)
    short_lane, long_lane = scheduler.lanes
    document = fake_job(engine, own_sentences(5))  # over 16 tokens in all: the long lane's
    scheduler.submit(document)
    for segment in document.segments:
        segment.enqueued_at -= BACKLOG_AFTER_SECONDS
    decision = scheduler.admissions.decide(short_lane, time.monotonic())
    # beyond the long lane's room of 2, at most half of the short lane's 2 rows
    assert decision == Admission(moving=(document.segments[2],))
    assert [s.lane for s in document.segments] == [1] * 5 and not any(s.moved for s in document.segments)
    moved = scheduler.metrics.backlog_moved.labels(engine.name, short_lane.name)
    before = moved._value.get()
    scheduler.apply(short_lane, decision)
    assert [s.lane for s in document.segments] == [1, 1, 0, 1, 1]
    assert [s.moved for s in document.segments] == [False, False, True, False, False]
    assert document.segments[2] not in long_lane.waiting and moved._value.get() - before == 1


def test_a_starving_sentence_is_part_of_the_decision_and_leaves_with_its_job():
    engine, scheduler = _unstarted(max_batch_size=8)
    short_lane, long_lane = scheduler.lanes
    document = fake_job(engine, [" ".join(own_sentences(4))])  # one long sentence
    scheduler.submit(document)
    long = document.segments[0]
    long.enqueued_at -= STARVATION_SECONDS + 0.1
    scheduler.memory.reserved_bytes = scheduler.memory.budget_bytes  # others hold all the room
    decision = scheduler.admissions.decide(long_lane, time.monotonic())
    assert decision == Admission(starving=long) and scheduler.admissions.starving is None
    scheduler.apply(long_lane, decision)
    assert scheduler.admissions.starving is long
    short = fake_job(engine, ["A cat sleeps."])
    scheduler.submit(short)
    scheduler.memory.reserved_bytes = 0
    assert scheduler.admissions.decide(short_lane, time.monotonic()) == Admission(starving=long)  # it waits
    scheduler.apply(long_lane, Leaving(ending=((document, Cancelled("the request was cancelled")),)))
    assert scheduler.admissions.starving is None and scheduler.waiting == 1
    assert scheduler.admissions.decide(short_lane, time.monotonic()) == Admission(joining=tuple(short.segments))
