"""The host caches (runtime/caches.py): rows write their own slots, moves copy only what changed, buffers are reused."""

from __future__ import annotations

import numpy as np
import pytest

from runtime.caches import FEW_ROWS, CachePool, KVCache
from runtime.source_cache import SourceCache


def _write_step(cache: KVCache, value: float) -> None:
    """What a decoder step does: each live row's new entry at its own length, then the lengths advance."""
    rows = np.arange(cache.rows)
    for buffer in cache.keys + cache.values:
        buffer[rows, :, cache.live_lengths] = value
    cache.advance()


def test_cache_rows_of_different_lengths_write_their_own_slots():
    cache = KVCache(layers=1, heads=1, d_cache=2, round_to=4)
    cache.add_rows(1)
    _write_step(cache, 1.0)
    cache.add_rows(1)
    _write_step(cache, 2.0)
    assert cache.live_lengths.tolist() == [2, 1] and cache.capacity == 4
    assert cache.keys[0][0, 0, :2, 0].tolist() == [1.0, 2.0] and cache.keys[0][1, 0, 0].tolist() == [2.0, 2.0]
    for _ in range(2):
        _write_step(cache, 3.0)
    assert cache.capacity == 8  # grown by round_to slots, entries kept
    assert cache.keys[0][0, 0, :4, 0].tolist() == [1.0, 2.0, 3.0, 3.0]


def test_cache_select_moves_only_changed_rows_in_place():
    cache = KVCache(layers=1, heads=1, d_cache=1, round_to=4)
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
    cache = KVCache(layers=2, heads=2, d_cache=3, round_to=4)
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
    first = KVCache(layers=2, heads=1, d_cache=2, round_to=4, pool=pool)
    first.reserve(8, 12)
    first.add_rows(3)
    buffers = first.keys + first.values
    first.clear()  # emptied: its buffers go to the pool
    second = KVCache(layers=2, heads=1, d_cache=2, round_to=4, pool=pool)
    second.reserve(6, 10)  # fits in 8 rows of 12 slots: taken as they are
    assert all(a is b for a, b in zip(second.keys + second.values, buffers, strict=True))
    assert (second.rows_capacity, second.capacity, second.rows) == (8, 12, 0)
    second.add_rows(2)
    assert second.live_lengths.tolist() == [0, 0]  # garbage slots, but nothing cached yet
    third = KVCache(layers=2, heads=1, d_cache=2, round_to=4, pool=pool)
    third.reserve(4, 4)  # the pool gave its one set away
    assert not any(a is b for a, b in zip(third.keys + third.values, buffers, strict=True))
    second.clear()
    fourth = KVCache(layers=2, heads=1, d_cache=2, round_to=4, pool=pool)
    fourth.reserve(9, 4)  # more rows than the kept set has: fresh buffers, the set stays kept
    assert fourth.rows_capacity >= 9 and pool.take(8, 12) is not None


def test_sources_join_and_leave_in_place_and_resize_only_when_out_of_room():
    cache = SourceCache(round_to=4)

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
    grown = cache.k
    assert cache.nbytes == (buffer.nbytes + grown.nbytes) * 2  # k and v, and the pair before, kept for the next
    cache.keep(np.arange(3))
    cache.add(*sources(1, 1, 30.0))  # the longest live source needs 3 of 8 tokens: S shrinks
    assert cache.capacity[1] == 4 and cache.count == 4 and cache.k[0, 3, 0, 0, 0] == 30.0
    assert np.shares_memory(cache.k, buffer)  # into the first buffers again: their pages are written already
    assert cache.k[0, :3, 0, :3, 0].tolist() == [[2.0] * 3, [3.0] * 3, [11.0, 11.0, 0.0]]
    cache.add(*sources(8, 2, 40.0))  # 4 live + 8 > 8 slots: the buffer doubles
    assert cache.capacity == (16, 4) and cache.k[0, :12, 0, 0, 0].tolist() == [2, 3, 11, 30, *range(40, 48)]
    assert np.shares_memory(cache.k, grown)  # as many elements as the (8, 8) buffers held


def test_a_departure_copies_only_the_real_tokens_of_the_source_that_fills_its_slot():
    cache = SourceCache(round_to=4)
    k = np.arange(1, 5, dtype=np.float32)[None, :, None, None, None] * np.ones((1, 4, 1, 4, 2), np.float32)
    mask = np.ones((4, 4), bool)
    mask[3, 2:] = False  # the last source has 2 real tokens of the group's 4
    cache.add(k, k + 100, mask)
    cache.keep(np.array([0, 3, 2]))  # source 1 left: the last fills its slot
    assert cache.count == 3 and cache.lengths[:3].tolist() == [4, 2, 4]
    assert cache.k[0, 1, 0, :, 0].tolist() == [4.0, 4.0, 2.0, 2.0]  # its 2 tokens; the rest, masked, untouched
    assert cache.v[0, 1, 0, :2, 0].tolist() == [104.0, 104.0]
    assert cache.mask[1].tolist() == [True, True, False, False]


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
