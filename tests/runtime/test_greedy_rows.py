"""A batch's greedy bookkeeping over numpy (runtime/greedy_rows.py): the searches end, keep and score exactly what
each row's ``take`` makes of the same tokens, with sources ending by eos, by length and by the runaway guard,
leaving, and joining mid-way."""

from __future__ import annotations

from pathlib import Path

import numpy as np

import runtime.batch
from runtime.backend import OrtBackend
from runtime.batch import Placed
from runtime.greedy_rows import MANY_ROWS, GreedyRows
from runtime.options import EngineSettings, RuntimeOptions
from runtime.search import GreedySearch
from runtime.stops import RepetitionGuard, stop_rules
from tests.conftest import own_sentences

EOS = 3


def test_the_rows_end_and_score_as_each_search_taking_its_tokens_would():
    rng = np.random.default_rng(0)
    rules = stop_rules(4)
    rows, fast, slow = GreedyRows(EOS, rules), {}, {}
    live: list[int] = []
    ended: dict[int, tuple] = {}
    next_key = 0
    for step in range(300):
        while len(live) < 12 + step % 7:  # sources join as others leave, more than FEW_ROWS at once
            limit = int(rng.integers(3, 40))
            fast[next_key], slow[next_key] = (GreedySearch(limit, EOS, rules) for _ in range(2))
            live.append(next_key)
            next_key += 1
        order = list(rng.permutation(live))  # where the layout keeps each source: rows in any order
        placed = [Placed(key, fast[key], i, order.index(key)) for i, key in enumerate(live)]
        for _ in range(int(rng.integers(1, 4))):  # steps with the same placed list
            tokens = rng.choice([EOS, 5, 6, 7, 8, 9], size=(len(live), 1), p=[0.04, 0.4, 0.3, 0.1, 0.1, 0.06])
            tokens[::5] = 7  # some rows repeat one token: the runaway guard ends them
            log_probs = rng.uniform(-3, 0, size=(len(live), 1)).astype(np.float32)
            finished = rows.step(placed, tokens, log_probs)
            expected = [
                p for p in placed if not slow[p.key].take(int(tokens[p.first_row, 0]), float(log_probs[p.first_row, 0]))
            ]
            assert [p.key for p in finished] == [p.key for p in expected]
            for p in finished:
                ended[p.key] = fast[p.key].result()
                assert ended[p.key] == slow[p.key].result()
            if finished:
                break
        gone = {p.key for p in finished}
        live = [key for key in live if key not in gone]
    reasons = {hypothesis.stopped for hypothesis in ended.values()}
    assert reasons == {"eos", "length", "repetition"} and len(ended) > 200
    for key in live:  # the ones still decoding hold what their twins hold
        assert (fast[key].tokens, fast[key].log_prob) == (slow[key].tokens, slow[key].log_prob)


def test_a_rules_test_over_rows_sends_just_the_rows_it_flags_to_take():
    class EndsAfterSeven(RepetitionGuard):
        def may_stop_rows(self, tails: np.ndarray, tokens: np.ndarray) -> np.ndarray:
            return tokens == 7

        def ends(self, tokens):  # noqa: ANN001, ANN201
            return 0 if tokens[-1] == 7 else None

    rules = (EndsAfterSeven(),)
    searches = [GreedySearch(50, EOS, rules) for _ in range(10)]
    placed = [Placed(i, search, i, i) for i, search in enumerate(searches)]
    rows = GreedyRows(EOS, rules)
    tokens = np.array([[5]] * 9 + [[7]])
    finished = rows.step(placed, tokens, np.zeros((10, 1), np.float32))
    assert [p.key for p in finished] == [9] and searches[9].stopped == "repetition"
    assert all(search.tokens == [5] for search in searches[:9])


def test_a_batch_of_many_greedy_rows_decodes_what_each_rows_take_decodes(tiny_export: Path, monkeypatch):
    """Through the running batch, MANY_ROWS sources and more, the runaway guard on, sources joining mid-way: the
    same hypotheses as with the searches' own ``take`` (MANY_ROWS out of reach), on the same steps."""
    engine = OrtBackend(tiny_export, RuntimeOptions(settings=EngineSettings(provider="cpu", intra_op_threads=1)))
    sources = engine.tokenizer.encode_source(own_sentences(MANY_ROWS + 16))

    def decode() -> dict:
        batch = engine.new_batch(engine.decoding(stop_rules(2)))
        first, rest = sources[:MANY_ROWS], sources[MANY_ROWS:]
        batch.add(list(range(MANY_ROWS)), engine.encode_sources(first), [1] * MANY_ROWS, [30] * MANY_ROWS)
        results = dict(batch.step())
        keys = list(range(MANY_ROWS, MANY_ROWS + len(rest)))
        batch.add(keys, engine.encode_sources(rest), [1] * len(rest), [30] * len(rest))
        return results | batch.drain()

    vectorized = decode()
    monkeypatch.setattr(runtime.batch, "MANY_ROWS", 10**6)
    assert decode() == vectorized and len(vectorized) == MANY_ROWS + 16
    assert {hypothesis.stopped for hypothesis in vectorized.values()} >= {"repetition"}
