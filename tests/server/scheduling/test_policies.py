"""The scheduler's parts that need no engine: the memory budget and the two admission policies, on fake
sentences and sizes (no ONNX Runtime, no threads)."""

from __future__ import annotations

from dataclasses import dataclass

from server.scheduling.budget import INITIAL_TARGET_RATIO, PREDICTION_MARGIN, PREDICTION_SLACK_TOKENS, MemoryBudget
from server.scheduling.policies import (
    STARVATION_SECONDS,
    Continuous,
    Static,
    admit_in_order,
    admit_static,
    join_later,
    length_groups,
)


class Sizes:
    """100 bytes per source token, 10 per target token and beam row; scores 1 byte per sentence·token²."""

    def sequence_bytes(self, source_tokens: int, target_tokens: int, beam: int) -> int:
        return 100 * source_tokens + 10 * target_tokens * beam

    def encoder_scores_bytes(self, sentences: int, longest: int) -> int:
        return sentences * longest * longest


@dataclass(eq=False)
class Sentence:
    source_tokens: int
    enqueued_at: float = 0.0
    lane: int = 0
    job: object = None


def test_the_estimate_predicts_from_the_learned_ratio_and_caps_at_the_longest_output():
    budget = MemoryBudget(10_000, {"m": Sizes()})
    predicted = int(INITIAL_TARGET_RATIO * 20 * PREDICTION_MARGIN) + PREDICTION_SLACK_TOKENS
    assert budget.estimate("m", 20, 2, 256) == (100 * 20 + 10 * predicted * 2, predicted)
    assert budget.estimate("m", 20, 1, 12)[1] == 12  # never past the sentence's longest output
    for _ in range(500):  # outputs as long as their sources: the ratio moves to 1
        budget.learn("m", 20, 20)
    assert abs(budget.target_ratio["m"] - 1.0) < 1e-3
    assert budget.estimate("m", 20, 1, 256)[1] == int(20 * PREDICTION_MARGIN) + PREDICTION_SLACK_TOKENS


def test_fits_counts_reservations_and_the_encoder_scores_of_the_group():
    budget = MemoryBudget(1_000, {"m": Sizes()})
    assert not budget.fits("m", [500, 400], 10)  # 900 + 2·10² scores > 1,000
    assert budget.fits("m", [500, 300], 10)  # 800 + 200 = 1,000
    budget.reserve(100)
    assert not budget.fits("m", [500, 300], 10)
    assert budget.fits("m", [500, 300], 0)
    budget.release(100)
    assert budget.reserved_bytes == 0
    assert budget.peak_bytes("m", 300, 10) == 400


def test_static_takes_the_oldest_bucket_first_then_the_nearest_that_fit():
    long_one, short_old, short_new, middle = Sentence(300, 0.0), Sentence(10, 1.0), Sentence(12, 2.0), Sentence(40, 3.0)
    admitted = admit_static([short_old, long_one, short_new, middle], lambda group: len(group) <= 3)
    assert admitted == [short_old, short_new, middle]  # bucket 1-16 first, then 33-64; the long one waits


def test_continuous_admits_in_order_until_one_does_not_fit_and_a_long_wait_starves_other_lanes():
    first, second, big = Sentence(10), Sentence(10), Sentence(500)
    fits = lambda group: sum(s.source_tokens for s in group) <= 100  # noqa: E731
    assert admit_in_order([first, big, second], fits, 0, None, now=0.5) == ([first], None)  # in order: stops at big
    admitted, starving = admit_in_order([big, second], fits, 0, None, now=STARVATION_SECONDS + 0.1)
    assert (admitted, starving) == ([], big)
    other = Sentence(5, lane=1)
    assert admit_in_order([other], fits, 1, starving, now=2.0) == ([], big)  # nobody else admits meanwhile
    assert admit_in_order([big], lambda group: True, 0, big, now=2.0) == ([big], None)  # it fits: over


def test_a_busy_lane_gathers_arrivals_until_their_wait_pays_for_the_join():
    arrivals = [Sentence(10, enqueued_at=0.0), Sentence(10, enqueued_at=0.01)]
    assert join_later(arrivals, rows=30, join_seconds=0.002, now=0.02)  # waited 0.03 s < 30 rows · 2 ms
    assert not join_later(arrivals, rows=30, join_seconds=0.002, now=0.05)  # 0.09 s ≥ 0.06 s
    assert not join_later(arrivals, rows=0, join_seconds=0.002, now=0.01)  # an idle lane takes them at once


def test_the_largest_peak_is_the_sentence_whose_reservation_and_scores_need_most():
    budget = MemoryBudget(10_000, {"m": Sizes()})
    assert budget.largest_peak("m", [(500, 10), (400, 20), (100, 5)]) == (1, 400 + 20 * 20)


def test_static_admits_only_into_an_empty_batch_and_never_splits_lanes():
    policy = Static()
    waiting = [Sentence(5, enqueued_at=0.0)]
    assert not policy.splits_lanes
    assert policy.joins_now(waiting, rows=0, join_seconds=1.0, now=0.0)
    assert not policy.joins_now(waiting, rows=3, join_seconds=0.0, now=100.0)  # however long they waited


def test_continuous_joins_a_busy_batch_once_the_wait_pays_and_a_starving_sentence_holds_other_lanes():
    policy = Continuous()
    waiting = [Sentence(50, enqueued_at=0.0, lane=1)]
    assert policy.splits_lanes and policy.joins_now(waiting, rows=0, join_seconds=1.0, now=0.0)
    assert not policy.joins_now(waiting, rows=4, join_seconds=0.01, now=0.02)  # 0.02 s waited < 4 × 0.01
    assert policy.joins_now(waiting, rows=4, join_seconds=0.01, now=0.05)
    nothing_fits = lambda group: False  # noqa: E731
    assert policy.choose(waiting, nothing_fits, 1, None, now=STARVATION_SECONDS + 1) == ([], waiting[0])
    short = Sentence(3)
    assert policy.choose([short], lambda group: True, 0, waiting[0], now=0.0) == ([], waiting[0])  # others wait


def test_length_groups_cut_sorted_sentences_where_the_length_class_changes():
    sentences = [Sentence(n) for n in (3, 10, 16, 17, 30, 200)]
    assert [[s.source_tokens for s in g] for g in length_groups(sentences)] == [[3, 10, 16], [17, 30], [200]]
