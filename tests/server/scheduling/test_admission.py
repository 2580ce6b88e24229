"""Who joins a lane's batch (server/scheduling/admission.py): an ``Admission`` decided from the lanes' queues without
changing them, then applied at once; no inference threads (tests/server/scheduling/test_scheduler.py has the lanes
running)."""

from __future__ import annotations

import time
from pathlib import Path

from server.errors import Cancelled
from server.operations.metrics import Metrics
from server.scheduling.decisions import Admission, Leaving
from server.scheduling.jobs import QueuedSentence
from server.scheduling.policies import STARVATION_SECONDS
from server.scheduling.scheduler import Scheduler
from testkit.sentences import own_sentences
from testkit.servers import server_config
from tests.server.fake_engine import FakeEngine, fake_job


def _unstarted(max_batch_size: int, lane_replicas: int = 1) -> tuple[FakeEngine, Scheduler]:
    engine = FakeEngine()
    config = server_config(
        Path("unused"), scheduler="continuous", lanes=(16,), lane_replicas=lane_replicas, max_batch_size=max_batch_size
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
    with scheduler.lock:  # an admission is applied under the lock it was decided under
        scheduler.apply(lane, decision)
    assert list(lane.waiting) == jobs[2].segments
    decoding = sum(s.reserved_bytes for s in decision.admitted)
    encoding = engine.memory.encoder_scores_bytes(2, max(s.source_tokens for s in decision.admitted))
    assert scheduler.memory.reserved_bytes == decoding + encoding  # the encoder's scores, while it runs
    with scheduler.lock:
        scheduler.admissions.encoded(lane, decision.admitted)
    assert scheduler.memory.reserved_bytes == decoding


def test_two_replicas_do_not_both_count_on_the_room_for_their_encoders():
    """A long sentence's encoder call holds its scores from admission to its end: another lane that would need
    the same room for its own waits until then, instead of both encoding at once over the budget."""
    engine, scheduler = _unstarted(max_batch_size=8, lane_replicas=2)
    long = " ".join(own_sentences(3))
    first, second = (fake_job(engine, [long]) for _ in range(2))
    scheduler.submit(first)
    scheduler.submit(second)
    decoding, tokens = first.segments[0].reserved_bytes, first.segments[0].source_tokens
    encoding = engine.memory.encoder_scores_bytes(1, tokens)
    scheduler.memory.budget_bytes = 2 * decoding + encoding + encoding // 2  # both decode, one encodes at a time
    lanes = [scheduler.lanes[s.lane] for s in first.segments + second.segments]
    assert lanes[0] is not lanes[1] and lanes[0].size_class == lanes[1].size_class  # two replicas
    with scheduler.lock:
        scheduler.apply(lanes[0], scheduler.admissions.decide(lanes[0], time.monotonic()))
        assert scheduler.admissions.decide(lanes[1], time.monotonic()) == Admission()  # the first still encodes
        scheduler.admissions.encoded(lanes[0], first.segments)
        assert scheduler.admissions.decide(lanes[1], time.monotonic()) == Admission(joining=tuple(second.segments))


def test_a_replica_out_of_work_takes_what_another_has_no_room_for_when_the_admission_is_applied():
    engine, scheduler = _unstarted(max_batch_size=2, lane_replicas=2)
    busy, idle = scheduler.lanes[:2]
    jobs = [fake_job(engine, ["A dog runs."]) for _ in range(3)]
    for job in jobs:
        job.segments = [QueuedSentence(job, job.specs[0], max_length=16, lane=busy.index)]
        busy.waiting.extend(job.segments)
    decision = scheduler.admissions.decide(idle, time.monotonic())
    assert decision == Admission(joining=(jobs[2].segments[0],))  # beyond the busy replica's room of 2
    assert jobs[2].segments[0].lane == busy.index  # deciding changed nothing
    with scheduler.lock:
        scheduler.apply(idle, decision)
    assert jobs[2].segments[0].lane == idle.index and list(busy.waiting) == jobs[0].segments + jobs[1].segments


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
    with scheduler.lock:
        scheduler.apply(long_lane, decision)
    assert scheduler.admissions.starving is long
    short = fake_job(engine, ["A cat sleeps."])
    scheduler.submit(short)
    scheduler.memory.reserved_bytes = 0
    assert scheduler.admissions.decide(short_lane, time.monotonic()) == Admission(starving=long)  # it waits
    scheduler.apply(long_lane, Leaving(ending=((document, Cancelled("the request was cancelled")),)))
    assert scheduler.admissions.starving is None and scheduler.waiting == 1
    assert scheduler.admissions.decide(short_lane, time.monotonic()) == Admission(joining=tuple(short.segments))
