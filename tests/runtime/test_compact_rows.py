"""A batch's rows packed (runtime/compact_rows.py): a source that leaves frees its rows, the last takes its place."""

from __future__ import annotations

import torch

from model.transformer import Transformer
from model.translate import TorchTranslator
from runtime.caches import FEW_ROWS, KVCache
from runtime.layout import step_layout
from tests.runtime.torch_steps import SOURCES, encode, torch_batch


def test_removed_source_frees_its_rows(tiny_model: Transformer):
    translator = TorchTranslator(tiny_model, tokenizer=None, max_output_tokens=12)
    batch = torch_batch(tiny_model, translator)
    with torch.inference_mode():
        batch.add([0, 1], encode(tiny_model, SOURCES[:2]), [2, 2], [12, 12])
        batch.step()
        rows_before, removed_rows = batch.rows, batch.layout.searches[0].rows
        batch.remove(0)
    assert removed_rows == 2 and batch.rows == rows_before - removed_rows
    assert list(batch.layout.searches) == [1]
    assert batch.layout.cache.rows == batch.rows == len(batch.layout.cache.views()[0])


def test_a_leaving_source_takes_one_source_from_the_end_into_its_place(tiny_model: Transformer, monkeypatch):
    translator = TorchTranslator(tiny_model, tokenizer=None, max_output_tokens=12)
    batch = torch_batch(tiny_model, translator)
    moves = []
    move = KVCache._move
    record = lambda self, o, t, n: moves.append((list(map(int, o)), list(map(int, t)))) or move(self, o, t, n)  # noqa: E731
    monkeypatch.setattr(KVCache, "_move", record)
    with torch.inference_mode():
        batch.add([0, 1, 2, 3], encode(tiny_model, SOURCES[:4]), [2] * 4, [12] * 4)
        batch.step()  # each source's one row becomes two
        assert batch.rows == 8
        moves.clear()
        tokens = batch.layout.tokens.copy()
        batch.remove(1)
    assert list(batch.layout.searches) == [0, 3, 2]  # the last source took the place of the one that left
    assert moves == [([6, 7], [2, 3])]  # its two rows alone moved: source 2's stayed where they were
    assert batch.layout.tokens.tolist() == [*tokens[:2], *tokens[6:], *tokens[4:6]]
    assert batch.layout.sources.lengths[:3].tolist() == [4, 5, 2]  # SOURCES[0], [3] and [2] with eos, in that order


def test_small_and_greedy_step_layouts_are_kept(tiny_model: Transformer):
    """A batch of a few rows, or of greedy rows (one layout per size), takes the kept layout; a larger beam batch
    builds its own, so the cache stays small."""
    translator = TorchTranslator(tiny_model, tokenizer=None, max_output_tokens=12)
    for sources, beam, kept in ((2, 1, True), (FEW_ROWS + 1, 1, True), (FEW_ROWS + 1, 2, False)):
        batch = torch_batch(tiny_model, translator)
        with torch.inference_mode():
            batch.add(
                list(range(sources)), encode(tiny_model, (SOURCES * 4)[:sources]), [beam] * sources, [12] * sources
            )
        wanted = tuple(search.top_k for search in batch.layout.searches.values())
        assert (batch.layout.groups is step_layout((1,) * sources, wanted)[0]) is kept
