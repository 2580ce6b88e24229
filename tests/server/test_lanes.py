"""A lane on its own (server/lanes.py): the engines it opens as the thread plan says, the room it gives to and
takes from other lanes' backlog, and the pause it owes longer lanes; no scheduler, no inference threads."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from server.decisions import Pause
from server.jobs import QueuedSentence
from server.lanes import Lane
from server.policies import PAUSE_AT_LEAST_SECONDS
from server.threads import LaneThreads, ThreadPlan
from testkit.sentences import own_sentences
from tests.server.fake_engine import FakeEngine, fake_job


class WarmedEngine(FakeEngine):
    """Counts warm-ups by the threads of the replica warmed (a replica shares ``warmed``)."""

    def __init__(self) -> None:
        super().__init__()
        self.warmed: list[int | None] = []

    def warmup(self) -> None:
        self.warmed.append(self.intra_op_threads)


def _opened(threads: LaneThreads, model: FakeEngine) -> Lane:
    lane = Lane(1, "65+", "m", 10, size_class=1)
    thread = threading.Thread(target=lane.open, args=(model, threads, True))
    thread.start()
    thread.join()
    assert lane.error is None and lane.ready.is_set()
    return lane


def test_a_longer_lane_holds_its_own_replica_and_a_narrow_one_both_warmed_up_on_its_thread():
    model = WarmedEngine()
    lane = _opened(LaneThreads(own=2, narrow=1, encode_apart=False), model)
    assert lane.engine is not model and lane.engine.intra_op_threads == 2
    assert lane.narrow is not None and lane.narrow.intra_op_threads == 1
    assert sorted(model.warmed) == [1, 2] and lane.encoder is None
    first = _opened(LaneThreads(own=None, narrow=None, encode_apart=True), model)
    assert first.engine is model and first.narrow is None and first.encoder is not None
    assert sorted(model.warmed) == [1, 2]  # the model's engine is warmed by the server, not by its lanes
    first.close()


def test_the_thread_plan_gives_narrow_replicas_and_an_encoder_thread_only_on_the_cpu():
    plan = ThreadPlan(first_lane=1, first_lane_small_batches=1, other_lanes=2, encode_apart=True, other_lanes_narrow=1)
    assert plan.for_lane(0, "cpu") == LaneThreads(own=None, narrow=None, encode_apart=True)
    assert plan.for_lane(1, "cpu") == LaneThreads(own=2, narrow=1, encode_apart=False)
    # provider auto that found CUDA: one replica per longer lane, and every lane encodes inline
    assert plan.for_lane(0, "cuda") == LaneThreads(own=None, narrow=None, encode_apart=False)
    assert plan.for_lane(2, "cuda") == LaneThreads(own=2, narrow=None, encode_apart=False)


@pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="thread names are read from /proc (Linux)")
def test_a_lane_names_its_thread_for_the_os():
    """top -H and /proc show which lane burns the CPU (benchmarks/service_overhead.py reads them)."""
    lane = Lane(3, "65+", "m", 0)
    names = []

    def run() -> None:
        lane.open(FakeEngine(), LaneThreads(own=None, narrow=None, encode_apart=False), warmup=False)
        names.append(Path(f"/proc/self/task/{threading.get_native_id()}/comm").read_text().strip())

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    assert names == ["lane3 65+"] and lane.batch is not None


def _queued(engine: FakeEngine, sentences: list[str], beam: int = 1) -> list[QueuedSentence]:
    """The sentences of a job, as the scheduler queues them."""
    job = fake_job(engine, sentences, beam)
    return [QueuedSentence(job, spec, max_length=16) for spec in job.specs]


def test_a_lane_counts_its_own_rows_apart_from_the_backlog_it_took_and_the_room_left_for_more():
    engine = FakeEngine()
    lane = Lane(0, "1-16", "m", 0)
    lane.batch = engine.new_batch()
    own, taken = _queued(engine, ["A dog runs."], beam=3), _queued(engine, own_sentences(2), beam=2)
    for segment in taken:
        segment.moved = True
    for segment in own + taken:
        lane.running[segment] = None
        lane.batch.add([segment], engine.encode([segment.spec.ids]), [segment.job.options.beam], [16])
    assert lane.batch.rows == 3 + 2 * 2 and lane.own_rows() == 3
    assert lane.backlog_room(4) == 1 and lane.backlog_room(4, admitted=own) == 0
    assert lane.backlog_room(2) == 0  # never below none


def test_a_lane_overflows_with_what_its_batch_has_no_room_for():
    engine = FakeEngine()
    lane = Lane(1, "17+", "m", 10, size_class=1)
    document = _queued(engine, own_sentences(5))
    lane.waiting.extend(document[1:])
    lane.running[document[0]] = None
    assert list(lane.overflow(3)) == document[3:]  # 1 running, 2 waiting fit in a room of 3
    assert list(lane.overflow(1)) == document[1:]


def test_a_lane_owes_a_pause_only_while_longer_lanes_decode_long_work_and_pays_it_in_pieces():
    lane = Lane(0, "1-16", "m", 0)
    first = lane.pause_after(busy=0.002, now=1.0, share=0.5, long_work=True)  # a half share: a second per second
    assert first == Pause(owed_seconds=0.002, seconds=0.0, at=1.0)  # under PAUSE_AT_LEAST_SECONDS: not yet
    assert (lane.owed_seconds, lane.off_cpu_since) == (0.0, 0.0)  # deciding changes nothing
    lane.owe(first)
    assert (lane.owed_seconds, lane.off_cpu_since) == (0.002, 1.0)
    second = lane.pause_after(busy=0.004, now=1.004, share=0.5, long_work=True)  # no time off the CPU between
    assert second.seconds == pytest.approx(0.006) and second.seconds >= PAUSE_AT_LEAST_SECONDS
    lane.owe(second)
    lane.paused(until=1.010)
    assert (lane.owed_seconds, lane.off_cpu_since) == (0.0, 1.010)
    assert lane.pause_after(busy=0.004, now=1.014, share=0.5, long_work=False) == Pause(0.0, 0.0, 1.014)
    assert lane.pause_after(busy=0.004, now=1.014, share=0.0, long_work=True) == Pause(0.0, 0.0, 1.014)
