"""How longer lanes keep moving (server/scheduling/fairness.py): their OS priority by size, and the pause a shorter
lane owes them while they decode, decided from the lanes without changing them; no scheduler, no threads."""

from __future__ import annotations

import pytest

from server.scheduling.decisions import Pause
from server.scheduling.fairness import PAUSE_AT_LEAST_SECONDS, LongerLanes, pause_owed
from server.scheduling.jobs import QueuedSentence
from server.scheduling.lanes import Lane
from tests.server.fake_engine import FakeEngine, fake_job


def test_each_longer_size_runs_a_step_lower():
    assert [LongerLanes(niceness_step=10, share=0.5).niceness(size) for size in range(3)] == [0, 10, 20]
    assert [LongerLanes(niceness_step=0, share=0.5).niceness(size) for size in range(3)] == [0, 0, 0]


def _decoding(lane: Lane) -> Lane:
    """``lane`` with a sentence in its batch."""
    engine = FakeEngine()
    job = fake_job(engine, ["A dog runs."])
    lane.join(QueuedSentence(job, job.specs[0], max_length=16))
    return lane


def test_a_lane_owes_a_pause_only_while_longer_lanes_decode_and_pays_it_in_pieces():
    fairness = LongerLanes(niceness_step=10, share=0.5)  # a half share: a second of pause per second busy
    lane, longer = Lane(0, "1-16", "m", fairness.niceness(0)), Lane(1, "17+", "m", fairness.niceness(1))
    lanes = [lane, longer]
    assert fairness.pause(lane, lanes, busy=0.004, now=1.0) == Pause(0.0, 0.0, 1.0)  # the longer lane is idle
    _decoding(longer)
    first = fairness.pause(lane, lanes, busy=0.002, now=1.0)
    assert first == Pause(owed_seconds=0.002, seconds=0.0, at=1.0)  # under PAUSE_AT_LEAST_SECONDS: not yet
    assert (lane.owed_seconds, lane.off_cpu_since) == (0.0, 0.0)  # deciding changes nothing
    lane.owe(first)
    assert (lane.owed_seconds, lane.off_cpu_since) == (0.002, 1.0)
    second = fairness.pause(lane, lanes, busy=0.004, now=1.004)  # no time off the CPU between
    assert second.seconds == pytest.approx(0.006) and second.seconds >= PAUSE_AT_LEAST_SECONDS
    lane.owe(second)
    lane.paused(until=1.010)
    assert (lane.owed_seconds, lane.off_cpu_since) == (0.0, 1.010)
    assert fairness.pause(longer, lanes, busy=0.004, now=1.014) == Pause(0.0, 0.0, 1.014)  # nobody is longer
    assert LongerLanes(10, share=0.0).pause(lane, lanes, busy=0.004, now=1.014) == Pause(0.0, 0.0, 1.014)


def test_a_longer_lane_of_another_model_is_owed_its_share_too():
    """The OS starves a long lane for every busier lane of higher priority, whichever model it serves."""
    fairness = LongerLanes(niceness_step=10, share=0.5)
    short, other_models_long = Lane(0, "1-16", "en-de", 0), _decoding(Lane(3, "17+", "de-en", fairness.niceness(1)))
    assert fairness.pause(short, [short, other_models_long], busy=0.006, now=1.0).seconds == pytest.approx(0.006)


def test_a_saturated_lane_owes_longer_lanes_their_share_and_time_off_the_cpu_pays_it():
    share, step = 0.3, 0.002
    owed, paused, busy = 0.0, 0.0, 0.0
    for _ in range(1000):  # never idle: it pauses whenever it owes PAUSE_AT_LEAST_SECONDS
        owed = pause_owed(owed, 0.0, step, share)
        busy += step
        if owed >= PAUSE_AT_LEAST_SECONDS:
            paused, owed = paused + owed, 0.0
    assert paused / (paused + busy) == pytest.approx(share, abs=0.01)
    assert pause_owed(0.004, 0.010, step, share) == pytest.approx(step * share / (1 - share))  # idle paid it
    assert pause_owed(0.004, 0.0, step, 0.0) == 0.004
