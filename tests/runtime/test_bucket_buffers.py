"""A bucket's shape and where its buffers live (runtime/bucket_buffers.py): sizes are powers of two from their
least, host buffers copy and reorder rows with numpy, and device buffers (on the CPU provider unless
``--provider cuda``) are zeroed when made, kept per shape for the next batch, and move rows as the host's do."""

from __future__ import annotations

import numpy as np

from runtime import bucket_buffers
from runtime.bucket_buffers import Bucket, DeviceBuffers, HostBuffers


def test_bucket_sizes_are_powers_of_two_from_their_least():
    assert Bucket.fitting(sources=5, group=4, src_len=17, cache_len=3) == Bucket(8, 4, 32, 16)
    assert Bucket.fitting(sources=1, group=1, src_len=1, cache_len=64).rows == bucket_buffers.MIN_SOURCES
    assert Bucket(8, 4, 32, 64).top_k == 8 and Bucket(8, 1, 32, 64).top_k == 1
    assert np.all([Bucket(8, 4, 32, 64).holds(Bucket(4, g, 16, 64)) for g in (1, 4)])


def test_a_bucket_takes_more_or_fewer_slots_keeping_its_lengths():
    bucket = Bucket.fitting(sources=3, group=2, src_len=20, cache_len=40)
    assert (bucket.sources, bucket.rows, bucket.smallest) == (4, 8, False)
    grown = bucket.with_room_for(5)
    assert grown == Bucket(8, 2, 32, 64) and grown.holds(bucket) and not bucket.holds(grown)
    shrunk = bucket.with_room_for(1)
    assert shrunk == Bucket(1, 2, 32, 64) and shrunk.smallest
    assert not bucket.holds(Bucket(4, 2, 64, 64)) and not bucket.holds(Bucket(4, 4, 32, 64))  # longer, wider


def test_host_rows_are_copied_up_to_their_slots_and_reordered_in_place():
    source = np.arange(2 * 1 * 3 * 2, dtype=np.float32).reshape(2, 1, 3, 2)
    target = np.full((4, 1, 5, 2), -1.0, np.float32)
    HostBuffers.copy_rows(source, target, rows=[1, 0], targets=[3, 0])
    np.testing.assert_array_equal(target[[3, 0], :, :3], source[[1, 0]])
    assert (target[:, :, 3:] == -1).all() and (target[1:3] == -1).all()  # slots past the source's, other rows
    buffers = HostBuffers(np.float32)
    before = target.copy()
    buffers.reorder([target], rows=[3, 3, 0], targets=[0, 1, 3], slots=3)  # beams: repeats, a swap
    np.testing.assert_array_equal(target[[0, 1, 3], :, :3], before[[3, 3, 0], :, :3])
    np.testing.assert_array_equal(target[:, :, 3:], before[:, :, 3:])


def test_device_buffer_sets_are_zeroed_and_kept_per_shape_for_the_next_batch(cache_ops):
    buffers = DeviceBuffers(cache_ops)
    cache_shape, cross_shape = (4, 2, 16, 8), (2, 2, 16, 8)
    first = buffers.take(cache_shape, 3, cross_shape)
    assert (len(first.cache), len(first.cross), buffers.made) == (3, 3, 1)
    assert all(not value.numpy().any() for value in first.cache + first.cross)
    assert buffers.nbytes(first.cache[0]) == HostBuffers.nbytes(np.zeros(cache_shape, np.float32))
    buffers.give_back(first)
    assert buffers.take(cache_shape, 3, cross_shape) is first and buffers.made == 1
    other = buffers.take(cache_shape, 3, None)  # no sources' keys: another shape
    assert other is not first and other.cross == [] and other.key != first.key and buffers.made == 2
    assert buffers.take(cache_shape, 3, cross_shape) is not first and buffers.made == 3  # first is in use


def test_device_rows_move_as_the_hosts_do(cache_ops):
    rng = np.random.default_rng(0)
    device = DeviceBuffers(cache_ops)
    host = [rng.standard_normal((4, 2, 6, 8)).astype(np.float32) for _ in range(2)]
    held = device.take(host[0].shape, 2, None).cache
    for value, array in zip(held, host, strict=True):
        value.update_inplace(array)
    joining = rng.standard_normal((2, 2, 4, 8)).astype(np.float32)  # fewer slots than the bucket's
    device.copy_rows(joining, held[0], rows=[1, 0], targets=[2, 0])
    HostBuffers.copy_rows(joining, host[0], rows=[1, 0], targets=[2, 0])
    device.reorder(held, rows=[2, 2, 0], targets=[0, 1, 2], slots=6)
    HostBuffers(np.float32).reorder(host, rows=[2, 2, 0], targets=[0, 1, 2], slots=6)
    for value, array in zip(held, host, strict=True):
        np.testing.assert_array_equal(value.numpy()[:, :, :4], array[:, :, :4])
    # A device copy moves whole rows, zero-padded: slots past the joining rows' are 0, where the host's kept theirs.
    assert not held[0].numpy()[[0, 1, 2], :, 4:].any()
    np.testing.assert_array_equal(held[1].numpy(), host[1])
