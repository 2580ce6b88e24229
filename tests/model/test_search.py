"""The running batch: sources join mid-way and leave early without changing any result."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from model.search import DecodeBatch, KVCache, default_max_output, new_search, pad_sources
from model.transformer import Transformer
from model.translate import TorchTranslator

SOURCES = [[5, 6, 7], [8, 9, 10, 11, 12, 13, 14], [15], [16, 17, 18, 19], [20, 21]]


def encode(model: Transformer, sources: list[list[int]]):
    c = model.config
    src, mask = pad_sources(sources, c.pad_id, c.eos_id)
    with torch.no_grad():
        cross_k, cross_v = model.cross_kv(model.encode(torch.from_numpy(src), torch.from_numpy(mask)))
    return cross_k.numpy(), cross_v.numpy(), mask


@pytest.mark.parametrize("beam", [1, 3])
def test_joining_and_leaving_do_not_change_translations(tiny_model: Transformer, beam: int):
    c = tiny_model.config
    translator = TorchTranslator(tiny_model, tokenizer=None, max_output_tokens=12)
    alone = [translator.translate_ids([s], beam)[0] for s in SOURCES]
    batch = DecodeBatch(translator._step, c.n_decoder_layers, c.n_heads, c.d_head, c.decoder_start_id)
    results: dict[int, list[int]] = {}
    arrivals = {0: [0], 2: [1, 2], 3: [3], 6: [4]}  # step -> sources joining then
    step = 0
    while len(batch) or step <= max(arrivals):
        if step in arrivals:
            keys = arrivals[step]
            searches = [new_search(beam, default_max_output(len(SOURCES[k]) + 1, 12), c.eos_id) for k in keys]
            with torch.inference_mode():
                batch.add(keys, searches, *encode(tiny_model, [SOURCES[k] for k in keys]))
        if len(batch):
            with torch.inference_mode():
                results.update(batch.step())
            assert batch.cache.k.shape[1] == batch.rows == len(batch.source_index)
        step += 1
    assert [results[k] for k in range(len(SOURCES))] == alone


def test_removed_source_frees_its_rows(tiny_model: Transformer):
    c = tiny_model.config
    translator = TorchTranslator(tiny_model, tokenizer=None, max_output_tokens=12)
    batch = DecodeBatch(translator._step, c.n_decoder_layers, c.n_heads, c.d_head, c.decoder_start_id)
    searches = [new_search(2, 12, c.eos_id) for _ in SOURCES[:2]]
    with torch.inference_mode():
        batch.add([0, 1], searches, *encode(tiny_model, SOURCES[:2]))
        batch.step()
        rows_before, removed_rows = batch.rows, searches[0].rows
        batch.remove(0)
    assert removed_rows == 2 and batch.rows == rows_before - removed_rows
    assert list(batch.searches) == [1]
    assert batch.cache.k.shape[1] == batch.rows


def test_cache_rows_of_different_lengths_write_their_own_slots():
    cache = KVCache.empty(layers=1, rows=1, heads=1, d_head=2, chunk=4)
    cache.append(np.ones((1, 1, 1, 1, 2)), np.ones((1, 1, 1, 1, 2)))
    cache.add_empty_rows(1)
    cache.append(np.full((1, 2, 1, 1, 2), 2.0), np.full((1, 2, 1, 1, 2), 2.0))
    assert cache.lengths.tolist() == [2, 1]
    assert cache.mask.tolist() == [[True, True, False, False], [True, False, False, False]]
    assert cache.k[0, 1, 0, 0].tolist() == [2.0, 2.0] and cache.k[0, 0, 0, 1].tolist() == [2.0, 2.0]
