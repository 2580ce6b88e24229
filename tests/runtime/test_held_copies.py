import numpy as np
import pytest

from runtime.held_copies import HELD_BYTES, HELD_RUNS, copy_slots


def _expected(target, source, slots, axis, length):
    """What numpy's assignment makes of ``copy_slots([target], [source], slots, axis, length)``."""
    expected = target.copy()
    for to, at in slots:
        into, out_of = [slice(None)] * target.ndim, [slice(None)] * source.ndim
        into[axis], out_of[axis] = to, at
        into[-2] = out_of[-2] = slice(0, length)
        expected[tuple(into)] = (expected if source is target else source)[tuple(out_of)]
    return expected


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("axis", [0, 1])
def test_slots_moved_within_arrays_are_what_numpy_assigns(dtype, axis: int):
    """Departures (KVCache rows on axis 0, SourceCache sources on axis 1): only the slots' first ``length``
    positions change, every layer and head of them, in every array."""
    rng = np.random.default_rng(axis)
    arrays = [rng.standard_normal((6, 6, 4, 10, 8)).astype(dtype) for _ in range(3)]
    slots = [(1, 4), (2, 5)]
    expected = [_expected(array, array, slots, axis, 7) for array in arrays]
    copy_slots(arrays, arrays, slots, axis, 7)
    for array, wanted in zip(arrays, expected, strict=True):
        np.testing.assert_array_equal(array, wanted)


def test_slots_written_from_other_arrays_of_fewer_positions():
    """A join: the encoder's (L, n, H, s, d) keys and values into caches of (L, N, H, S, d), S > s, after their
    live slots."""
    rng = np.random.default_rng(1)
    caches = [rng.standard_normal((3, 8, 4, 16, 8)).astype(np.float32) for _ in range(2)]
    encoded = [rng.standard_normal((3, 2, 4, 9, 8)).astype(np.float32) for _ in range(2)]
    slots = [(5, 0), (6, 1)]
    expected = [_expected(cache, new, slots, 1, 9) for cache, new in zip(caches, encoded, strict=True)]
    copy_slots(caches, encoded, slots, 1, 9)
    for cache, wanted in zip(caches, expected, strict=True):
        np.testing.assert_array_equal(cache, wanted)


def test_a_length_past_the_positions_copies_what_there_is_as_numpy_slices_do():
    array = np.arange(3 * 3 * 4 * 2, dtype=np.float32).reshape(3, 3, 4, 2)
    expected = _expected(array, array, [(0, 2)], 0, 4)
    copy_slots([array], [array], [(0, 2)], 0, 99)
    np.testing.assert_array_equal(array, expected)
    before = array.copy()
    copy_slots([array], [array], [(0, 2)], 0, 0)
    np.testing.assert_array_equal(array, before)


def test_a_copy_too_large_to_hold_the_lock_for_or_of_strided_arrays_is_left_to_numpy():
    """Over HELD_RUNS runs or HELD_BYTES bytes, or arrays not C-contiguous: False, and nothing is copied."""
    rng = np.random.default_rng(2)
    many = rng.standard_normal((HELD_RUNS + 1, 3, 5, 2)).astype(np.float32)  # a slot on axis 1: HELD_RUNS + 1 runs
    long = rng.standard_normal((3, 2, HELD_BYTES // 32, 8)).astype(np.float32)  # a slot of over HELD_BYTES
    strided = rng.standard_normal((4, 3, 6, 2)).astype(np.float32)[:, :, ::2]
    for array, axis, length in ((many, 1, 4), (long, 0, HELD_BYTES // 32), (strided, 0, 2)):
        before = array.copy()
        assert copy_slots([array], [array], [(0, 2)], axis, length) is False
        np.testing.assert_array_equal(array, before)
    assert copy_slots([long], [long], [(0, 2)], 0, 4) is True  # the same arrays, a few positions: held
