"""The searches of one source (runtime/search.py): what they answer besides the best output."""

from __future__ import annotations

import numpy as np

from runtime.search import BeamSearch, Decoding, GreedySearch, Hypothesis, OneRowSearch, RankedSearch, Search


def test_beam_search_gives_its_other_outputs_as_alternatives_best_first_each_once():
    search = BeamSearch(beam=4, max_length=10, eos_id=2, alpha=0.0)
    search.finished = [
        (-1.0, Hypothesis([5], -1.0, "eos")),
        (-0.5, Hypothesis([6], -0.5, "eos")),
        (-0.7, Hypothesis([6], -0.7, "repetition")),  # the same output, scored lower: not an alternative
        (-0.9, Hypothesis([7, 8], -0.9, "eos")),
    ]
    best = search.result()
    assert best.tokens == [6] and best.score == -0.5
    assert [(a.tokens, a.score) for a in best.alternatives] == [([7, 8], -0.9), ([5], -1.0)]
    assert all(a.alternatives == () for a in best.alternatives)


def test_greedy_search_has_no_alternatives():
    search = GreedySearch(max_length=10, eos_id=2)
    search.advance(np.array([[-0.1]]), np.array([[2]]), np.array([-0.1]))
    assert search.rows == 0 and search.result().alternatives == ()


def test_each_search_has_what_the_batch_asks_of_its_width():
    greedy, beam = Decoding(eos_id=2).search(1, 10), Decoding(eos_id=2).search(4, 10)
    assert isinstance(greedy, GreedySearch) and isinstance(beam, BeamSearch)
    assert isinstance(greedy, OneRowSearch) and not isinstance(greedy, RankedSearch)
    assert isinstance(beam, RankedSearch) and not isinstance(beam, OneRowSearch)
    assert all(isinstance(search, Search) and len(search.scores) == search.rows == 1 for search in (greedy, beam))
