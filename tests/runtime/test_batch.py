"""The running batch: sources join mid-way and leave early without changing any result."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from model.transformer import Transformer
from model.translate import TorchTranslator
from runtime.batch import DecodeBatch, EncodedSources, pad_sources
from runtime.caches import FEW_ROWS, CachePool, KVCache, SourceCache
from runtime.layout import gap_filling_order, row_groups, step_layout
from runtime.search import BeamSearch, Decoding, GreedySearch, Hypothesis, default_max_output, in_place_order
from testkit.arrivals import decode_arriving

SOURCES = [[5, 6, 7], [8, 9, 10, 11, 12, 13, 14], [15], [16, 17, 18, 19], [20, 21]]


def encode(model: Transformer, sources: list[list[int]]) -> EncodedSources:
    c = model.config
    src, mask = pad_sources(sources, c.pad_id, c.eos_id)
    with torch.no_grad():
        cross_k, cross_v = model.cross_kv(model.encode(torch.from_numpy(src), torch.from_numpy(mask)))
    return EncodedSources(cross_k.numpy(), cross_v.numpy(), mask)


def torch_batch(model: Transformer, translator: TorchTranslator) -> DecodeBatch:
    """A running batch over PyTorch's cached decoder step."""
    c = model.config
    return DecodeBatch(
        translator._step, c.n_decoder_layers, c.n_heads, c.d_head, c.decoder_start_id, Decoding(c.eos_id)
    )


@pytest.mark.parametrize("beam", [1, 3])
def test_joining_and_leaving_do_not_change_translations(tiny_model: Transformer, beam: int):
    translator = TorchTranslator(tiny_model, tokenizer=None, max_output_tokens=12)
    alone = [translator.translate_ids([s], beam)[0] for s in SOURCES]
    arrivals = {0: [0], 2: [1, 2], 3: [3], 6: [4]}  # step -> sources joining then

    def rows_agree(batch: DecodeBatch) -> None:
        assert batch.cache.rows == batch.rows == len(batch.source_index) == len(batch.tokens)

    with torch.inference_mode():
        decoded = decode_arriving(
            torch_batch(tiny_model, translator),
            {step: [(key, beam) for key in keys] for step, keys in arrivals.items()},
            lambda keys: encode(tiny_model, [SOURCES[key] for key in keys]),
            lambda key: default_max_output(len(SOURCES[key]), 12),
            stepped=rows_agree,
        )
    assert decoded.tokens(range(len(SOURCES))) == alone


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


def test_removed_source_frees_its_rows(tiny_model: Transformer):
    translator = TorchTranslator(tiny_model, tokenizer=None, max_output_tokens=12)
    batch = torch_batch(tiny_model, translator)
    with torch.inference_mode():
        batch.add([0, 1], encode(tiny_model, SOURCES[:2]), [2, 2], [12, 12])
        batch.step()
        rows_before, removed_rows = batch.rows, batch.searches[0].rows
        batch.remove(0)
    assert removed_rows == 2 and batch.rows == rows_before - removed_rows
    assert list(batch.searches) == [1]
    assert batch.cache.rows == batch.rows == len(batch.cache.views()[0])


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
        tokens = batch.tokens.copy()
        batch.remove(1)
    assert list(batch.searches) == [0, 3, 2]  # the last source took the place of the one that left
    assert moves == [([6, 7], [2, 3])]  # its two rows alone moved: source 2's stayed where they were
    assert batch.tokens.tolist() == [*tokens[:2], *tokens[6:], *tokens[4:6]]
    assert batch.sources.lengths[:3].tolist() == [4, 5, 2]  # SOURCES[0], [3] and [2] with eos, in that order


def test_new_orders_keep_what_can_stay_in_place():
    assert gap_filling_order([0, 1, 2]) == [0, 1, 2]  # nobody left
    assert gap_filling_order([0, 2, 3]) == [0, 2, 1]  # 1 left: 3 takes its place, 2 stays
    assert gap_filling_order([2, 5, 7]) == [1, 2, 0]  # 0, 1: 5 and 7 fill them, 2 stays
    # Beam search: each origin's first child stays on the origin's row, the rest fill the rows left.
    assert in_place_order([0, 0, 1, 2]) == [0, 2, 3, 1]
    assert in_place_order([3, 3, 3]) == [0, 1, 2]  # origin 3 has no row among three: rank order
    assert in_place_order([2, 0]) == [1, 0]


def _write_step(cache: KVCache, value: float) -> None:
    """What a decoder step does: each live row's new entry at its own length, then the lengths advance."""
    rows = np.arange(cache.rows)
    for buffer in cache.keys + cache.values:
        buffer[rows, :, cache.live_lengths] = value
    cache.advance()


def test_cache_rows_of_different_lengths_write_their_own_slots():
    cache = KVCache(layers=1, heads=1, d_cache=2, chunk=4)
    cache.add_rows(1)
    _write_step(cache, 1.0)
    cache.add_rows(1)
    _write_step(cache, 2.0)
    assert cache.live_lengths.tolist() == [2, 1] and cache.capacity == 4
    assert cache.keys[0][0, 0, :2, 0].tolist() == [1.0, 2.0] and cache.keys[0][1, 0, 0].tolist() == [2.0, 2.0]
    for _ in range(2):
        _write_step(cache, 3.0)
    assert cache.capacity == 8  # grown in a chunk, entries kept
    assert cache.keys[0][0, 0, :4, 0].tolist() == [1.0, 2.0, 3.0, 3.0]


def test_cache_select_moves_only_changed_rows_in_place():
    cache = KVCache(layers=1, heads=1, d_cache=1, chunk=4)
    cache.add_rows(4)
    for row in range(4):
        cache.keys[0][row, 0, 0, 0] = row
    cache.lengths[:4], cache.longest = [1, 2, 3, 4], 4
    buffer = cache.keys[0]
    cache.select(np.array([1, 3]))  # sources left: the rest move down in place
    assert cache.keys[0] is buffer and cache.keys[0][:2, 0, 0, 0].tolist() == [1, 3]
    assert cache.live_lengths.tolist() == [2, 4]
    version = cache.version
    cache.select(np.array([1, 1, 0]))  # beam search: rows repeat and swap (origins read before any write)
    assert cache.keys[0] is buffer and cache.keys[0][:3, 0, 0, 0].tolist() == [3, 3, 1]
    assert cache.live_lengths.tolist() == [4, 4, 2] and cache.version != version
    assert cache.nbytes == 2 * buffer.nbytes  # keys and values: no spare buffers


@pytest.mark.parametrize("rows", [4, FEW_ROWS, 3 * FEW_ROWS])
def test_cache_select_is_a_gather_of_the_live_slots_in_python_or_numpy(rows: int):
    """Few rows are selected in Python, more with numpy: both keep exactly the chosen rows' live slots."""
    rng = np.random.default_rng(rows)
    cache = KVCache(layers=2, heads=2, d_cache=3, chunk=4)
    cache.add_rows(rows)
    for buffer in cache.keys + cache.values:
        buffer[:] = rng.standard_normal(buffer.shape)
    cache.lengths[:rows], cache.longest = 5, 5
    before = [buffer[:, :, :5].copy() for buffer in cache.keys + cache.values]
    # Beams' usual step (origins and targets apart), a rotation, a draw with repeats, departures.
    selections = (
        np.arange(rows) // 2 * 2,
        np.roll(np.arange(rows), 1),
        rng.integers(0, rows, rows),
        np.arange(rows)[::2],
    )
    for selection in selections:
        cache.select(selection.tolist())
        for buffer, old in zip(cache.keys + cache.values, before, strict=True):
            np.testing.assert_array_equal(buffer[: len(selection), :, :5], old[selection])
        assert cache.rows == len(selection) and cache.live_lengths.tolist() == [5] * len(selection)
        before = [buffer[:, :, :5].copy() for buffer in cache.keys + cache.values]


def test_an_emptied_cache_gives_its_buffers_to_the_next_one_they_fit():
    pool = CachePool()
    first = KVCache(layers=2, heads=1, d_cache=2, chunk=4, pool=pool)
    first.reserve(8, 12)
    first.add_rows(3)
    buffers = first.keys + first.values
    first.clear()  # emptied: its buffers go to the pool
    second = KVCache(layers=2, heads=1, d_cache=2, chunk=4, pool=pool)
    second.reserve(6, 10)  # fits in 8 rows of 12 slots: taken as they are
    assert all(a is b for a, b in zip(second.keys + second.values, buffers, strict=True))
    assert (second.rows_capacity, second.capacity, second.rows) == (8, 12, 0)
    second.add_rows(2)
    assert second.live_lengths.tolist() == [0, 0]  # garbage slots, but nothing cached yet
    third = KVCache(layers=2, heads=1, d_cache=2, chunk=4, pool=pool)
    third.reserve(4, 4)  # the pool gave its one set away
    assert not any(a is b for a, b in zip(third.keys + third.values, buffers, strict=True))
    second.clear()
    fourth = KVCache(layers=2, heads=1, d_cache=2, chunk=4, pool=pool)
    fourth.reserve(9, 4)  # more rows than the kept set has: fresh buffers, the set stays kept
    assert fourth.rows_capacity >= 9 and pool.take(8, 12) is not None


def test_sources_join_and_leave_in_place_and_resize_only_when_out_of_room():
    cache = SourceCache(chunk=4)

    def sources(count: int, length: int, value: float):
        k = np.full((1, count, 1, length, 2), value, np.float32) + np.arange(count)[None, :, None, None, None]
        return k, k + 100, np.ones((count, length), bool)

    cache.add(*sources(3, 3, 1.0))  # values 1, 2, 3
    buffer = cache.k
    assert cache.capacity == (8, 4) and cache.count == 3
    cache.add(*sources(2, 2, 10.0))  # 10, 11
    assert cache.k is buffer and cache.count == 5  # written in place: the live sources were not copied
    assert cache.mask[3].tolist() == [True, True, False, False]
    cache.keep(np.array([1, 2, 4]))  # sources 0 and 3 left: the rest close up, in order, in place
    assert cache.k is buffer and cache.k[0, :3, 0, 0, 0].tolist() == [2.0, 3.0, 11.0]
    assert cache.v[0, 2, 0, 0, 0] == 111.0 and cache.lengths[:3].tolist() == [3, 3, 2]
    assert cache.mask[2].tolist() == [True, True, False, False]
    keys, mask = cache.step_inputs()
    assert keys[0].shape == (3, 1, 4, 2) and keys[0].flags.c_contiguous and mask.shape == (3, 4)
    cache.keep(np.array([2, 0, 1]))  # any order: only the slots that change are copied
    assert cache.k[0, :3, 0, 0, 0].tolist() == [11.0, 2.0, 3.0] and cache.lengths[:3].tolist() == [2, 3, 3]
    cache.keep(np.array([1, 2, 0]))
    cache.add(*sources(4, 6, 20.0))  # longer than S: a new buffer, the live sources copied (zero-padded)
    assert cache.k is not buffer and cache.capacity == (8, 8) and cache.count == 7
    assert cache.k[0, 2, 0, :, 0].tolist() == [11.0, 11.0, 0, 0, 0, 0, 0, 0]
    assert cache.lengths[:7].tolist() == [3, 3, 2, 6, 6, 6, 6]
    cache.keep(np.arange(3))
    cache.add(*sources(1, 1, 30.0))  # the longest live source needs 3 of 8 tokens: S shrinks
    assert cache.capacity[1] == 4 and cache.count == 4 and cache.k[0, 3, 0, 0, 0] == 30.0
    cache.add(*sources(8, 2, 40.0))  # 4 live + 8 > 8 slots: the buffer doubles
    assert cache.capacity == (16, 4) and cache.k[0, :12, 0, 0, 0].tolist() == [2, 3, 11, 30, *range(40, 48)]


def test_placed_buffers_are_refreshed_only_when_sources_change():
    placed = []
    cache = SourceCache(place=lambda array: placed.append(array) or array.copy())
    k = np.ones((1, 2, 1, 3, 2), np.float32)
    cache.add(k, k, np.ones((2, 3), bool))
    steps = [cache.step_inputs() for _ in range(3)]
    assert len(placed) == 2 and steps[0][0][0] is steps[2][0][0]  # k and v placed once, reused by every step
    assert steps[0][1].dtype == np.int32 and steps[0][1][:2, :4].tolist() == [[1, 1, 1, 0]] * 2
    cache.add(k, k, np.ones((2, 3), bool))
    assert cache.step_inputs()[0][0] is not steps[0][0][0] and len(placed) == 4


def test_a_step_layout_is_kept_for_its_shape_and_read_only():
    """Greedy and beam sources in one batch: each takes its own number of candidates; the layout of a shape that
    comes back is the same arrays, which nobody may write (batches bind them)."""
    groups, row_position, source_index, bias, k = step_layout((2, 1), (4, 1))  # a beam of 2 and a greedy source
    assert k == 4 and groups.tolist() == [[0, 1], [2, 2]] and source_index.tolist() == [0, 0, 1]
    assert (bias[0] == 0).all()  # both rows of the beam, all four candidates
    assert (bias[1, 0] == [0, -np.inf, -np.inf, -np.inf]).all() and (bias[1, 1] == -np.inf).all()  # one, once
    assert step_layout((2, 1), (4, 1))[0] is groups
    with pytest.raises(ValueError, match="read-only"):
        groups[0, 0] = 1


def test_only_small_step_layouts_are_kept(tiny_model: Transformer):
    """A batch of a few rows takes the kept layout; a larger one builds its own, so the cache stays small."""
    translator = TorchTranslator(tiny_model, tokenizer=None, max_output_tokens=12)
    for sources, kept in ((2, True), (FEW_ROWS + 1, False)):
        batch = torch_batch(tiny_model, translator)
        with torch.inference_mode():
            batch.add(list(range(sources)), encode(tiny_model, (SOURCES * 4)[:sources]), [1] * sources, [12] * sources)
        assert (batch.groups is step_layout((1,) * sources, (1,) * sources)[0]) is kept


def test_row_groups_put_each_sources_rows_in_one_block():
    groups, row_position, source_index = row_groups(np.array([2, 1, 3]))  # rows 0-1, 2, 3-5
    assert groups.tolist() == [[0, 1, 1], [2, 2, 2], [3, 4, 5]]  # a source with fewer rows repeats its last
    assert source_index.tolist() == [0, 0, 1, 2, 2, 2]
    assert groups.reshape(-1)[row_position].tolist() == list(range(6))  # each row finds itself in the blocks
    groups, row_position, _ = row_groups(np.zeros(0, np.int64))
    assert groups.shape == (0, 1) and row_position.shape == (0,)
