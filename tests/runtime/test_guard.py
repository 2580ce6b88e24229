"""The runaway-output guard and the confidence score of a hypothesis, on scripted decoder steps."""

from __future__ import annotations

import math

import numpy as np
import pytest

from runtime.search import BeamSearch, GreedySearch, Hypothesis, RepetitionGuard

GUARD = RepetitionGuard()  # the server's and translate-file's

EOS = 3


@pytest.mark.parametrize(
    ("tokens", "drop"),
    [
        ([7] * 5, 0),  # a token 5 times: within 4 repeats
        ([7] * 6, 5),  # 6 times: all but the first go
        ([5, 8, 9] + [7, 8] * 6, 10),  # a bigram 6 times after other tokens
        ([7, 8, 9, 10] * 5 + [7], 0),  # a 4-gram 5 times (its rotation too)
        ([1, 2, 3, 4] * 6, 20),
        ([1, 2, 3, 4, 5] * 6, 0),  # 5-grams are not checked (RepetitionGuard.ngram)
        ([], 0),
    ],
)
def test_the_guard_counts_what_goes(tokens: list[int], drop: int):
    assert GUARD.excess(tokens) == drop


def script(search, steps: list[tuple[int, float]], eos_log_prob: float = -5.0) -> Hypothesis:
    """Feed one row's chosen (token, log-prob) per step until the search is done."""
    for token, log_prob in steps:
        top_ids = np.array([[token, EOS if token != EOS else 4]])
        top_log_probs = np.array([[log_prob, eos_log_prob]], np.float32)
        search.advance(top_log_probs, top_ids, np.array([eos_log_prob], np.float32))
        if not search.rows:
            return search.result()
    raise AssertionError("the search did not finish")


def test_greedy_stops_a_repetition_loop_and_keeps_the_first_occurrence():
    loop = [(11, -0.5), (12, -0.5)] + [(13, -0.1), (14, -0.1)] * 10
    guarded = script(GreedySearch(100, EOS, guard=GUARD), loop)
    assert guarded.tokens == [11, 12, 13, 14] and guarded.stopped == "repetition"
    generated = 2 + 12  # the bigram's sixth occurrence stops it
    assert guarded.score == pytest.approx((2 * -0.5 + 12 * -0.1) / generated)
    unguarded = script(GreedySearch(30, EOS), loop + [(13, -0.1)] * 20)
    assert unguarded.stopped == "length" and len(unguarded.tokens) == 29


def test_greedy_confidence_is_the_mean_log_probability_with_eos():
    hypothesis = script(GreedySearch(100, EOS, GUARD), [(11, -0.2), (12, -0.4), (EOS, -0.3)])
    assert hypothesis == Hypothesis([11, 12], pytest.approx(-0.3), "eos")
    assert math.exp(hypothesis.score) == pytest.approx(math.exp(-0.3))


def test_beam_search_ends_a_runaway_hypothesis_as_finished():
    search = BeamSearch(2, 100, EOS, alpha=0.0, guard=GUARD)
    steps = 0
    while search.rows and steps < 20:  # every row keeps choosing 7 (best) or 8; eos is never likely
        rows = search.rows
        top_ids = np.tile(np.array([[7, 8, 9, 10]]), (rows, 1))
        top_log_probs = np.tile(np.array([[-0.1, -2.0, -3.0, -4.0]], np.float32), (rows, 1))
        search.advance(top_log_probs, top_ids, np.full(rows, -9.0, np.float32))
        steps += 1
    result = search.result()
    assert result.stopped == "repetition" and result.tokens[-1] == 7
    assert GUARD.excess(result.tokens) == 0 and steps < 15  # long before max_length
    assert -2.0 < result.score < 0
