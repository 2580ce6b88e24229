"""Stop rules (runtime/stops.py): the runaway-output guard, rules asked as a list, and the confidence score of a
hypothesis they end, on scripted decoder steps."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pytest

from runtime.search import BeamSearch, GreedySearch, Hypothesis
from runtime.stops import RepetitionGuard, stop_rules

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
    guarded = script(GreedySearch(100, EOS, stop_rules=(GUARD,)), loop)
    assert guarded.tokens == [11, 12, 13, 14] and guarded.stopped == "repetition"
    generated = 2 + 12  # the bigram's sixth occurrence stops it
    assert guarded.score == pytest.approx((2 * -0.5 + 12 * -0.1) / generated)
    unguarded = script(GreedySearch(30, EOS), loop + [(13, -0.1)] * 20)
    assert unguarded.stopped == "length" and len(unguarded.tokens) == 29


def test_greedy_confidence_is_the_mean_log_probability_with_eos():
    hypothesis = script(GreedySearch(100, EOS, (GUARD,)), [(11, -0.2), (12, -0.4), (EOS, -0.3)])
    assert hypothesis == Hypothesis([11, 12], pytest.approx(-0.3), "eos")
    assert math.exp(hypothesis.score) == pytest.approx(math.exp(-0.3))


def test_beam_search_ends_a_runaway_hypothesis_as_finished():
    search = BeamSearch(2, 100, EOS, alpha=0.0, stop_rules=(GUARD,))
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


@dataclass(frozen=True)
class StopAfter:
    """A stop rule of another kind: a hypothesis ends after ``token``, which it keeps."""

    token: int
    reason: str = "stop token"
    window: int = 1

    def may_stop(self, tail: Sequence[int], token: int) -> bool:
        return token == self.token

    def may_stop_rows(self, tails: np.ndarray, tokens: np.ndarray) -> np.ndarray:
        return tokens == self.token

    def ends(self, tokens: Sequence[int]) -> int | None:
        return 0 if tokens[-1] == self.token else None  # it ends keeping every token


def test_the_searches_ask_each_rule_of_the_list_in_order():
    steps = [(11, -0.5), (12, -0.5), (21, -0.1), (13, -0.1)] + [(14, -0.1)] * 10
    rules = (*stop_rules(4), StopAfter(21))
    greedy = script(GreedySearch(100, EOS, stop_rules=rules), steps)
    assert greedy.tokens == [11, 12, 21] and greedy.stopped == "stop token"
    assert script(GreedySearch(100, EOS, stop_rules=rules[:1]), steps).stopped == "repetition"
    beam = BeamSearch(2, 100, EOS, alpha=0.0, stop_rules=rules)
    for step in range(3):
        rows = beam.rows
        best = 21 if step == 2 else 11 + step
        top_ids = np.tile(np.array([[best, 30, 31, 32]]), (rows, 1))
        top_log_probs = np.tile(np.array([[-0.1, -2.0, -3.0, -4.0]], np.float32), (rows, 1))
        beam.advance(top_log_probs, top_ids, np.full(rows, -9.0, np.float32))
    assert any(h.stopped == "stop token" and h.tokens[-1] == 21 for _, h in beam.finished)
    assert stop_rules(0) == ()
