"""The self-attention cache on the step's device (runtime/device_cache.py), run on the CPU provider unless
``--provider cuda``: its one-node graphs copy rows zero-padded and in place, the cache keeps what the host cache
keeps as rows join, grow, reorder and leave, and only an fp16 cache lives on CUDA."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest

from runtime.caches import KVCache
from runtime.device_cache import BufferView, DeviceKVCache, device_cache_for


def test_copy_rows_pads_each_row_to_the_targets_slots_and_reads_every_row_before_writing(cache_ops):
    target = cache_ops.empty((3, 1, 4, 2))
    target.update_inplace(np.full((3, 1, 4, 2), 7.0, np.float32))
    joining = np.arange(1, 9, dtype=np.float32).reshape(2, 1, 2, 2)  # 2 slots of the target's 4
    cache_ops.copy_rows(joining, target, rows=[1, 0], targets=[0, 2])
    copied = target.numpy().copy()
    np.testing.assert_array_equal(copied[[0, 2], :, :2], joining[[1, 0]])
    assert not copied[[0, 2], :, 2:].any() and (copied[1] == 7).all()  # zero-padded; row 1 untouched
    cache_ops.copy_rows(target, target, rows=[2, 0], targets=[0, 2])  # a swap within one buffer
    np.testing.assert_array_equal(target.numpy()[[0, 2]], copied[[2, 0]])


def _write_step(caches: list[KVCache], rng: np.random.Generator) -> None:
    """What a decoder step does, the same in every cache: each live row's new entry at its own length, then the
    lengths advance."""
    first = caches[0]
    rows = np.arange(first.rows)
    entries = [rng.standard_normal((first.rows, first.heads, first.d_cache)) for _ in first.keys + first.values]
    for cache in caches:
        for buffer, entry in zip(cache.keys + cache.values, entries, strict=True):
            if isinstance(buffer, ort.OrtValue):
                array = buffer.numpy().copy()
                array[rows, :, cache.live_lengths] = entry
                buffer.update_inplace(array)
            else:
                buffer[rows, :, cache.live_lengths] = entry
        cache.advance()


def _live(cache: KVCache) -> list[list[np.ndarray]]:
    """Each buffer's live rows, each row's cached slots."""
    arrays = [b.numpy() if isinstance(b, ort.OrtValue) else b for b in cache.keys + cache.values]
    return [[array[row, :, :length] for row, length in enumerate(cache.live_lengths)] for array in arrays]


def test_a_device_cache_keeps_what_the_host_cache_keeps(cache_ops):
    rng = np.random.default_rng(0)
    host = KVCache(layers=2, heads=2, d_cache=8)
    device = DeviceKVCache(layers=2, heads=2, d_cache=8, dtype=np.float32, ops=cache_ops)
    caches = [host, device]
    for cache in caches:
        cache.add_rows(3)
    for _ in range(2):
        _write_step(caches, rng)
    for cache in caches:
        cache.add_rows(2)  # joining rows: more rows than the buffers held, copied zero-padded
    for _ in range(host.round_to):
        _write_step(caches, rng)  # past the first round_to slots
    assert device.capacity == host.capacity > host.round_to and device.rows_capacity >= 5
    for selection in ([4, 0, 0, 2, 1], [1, 2], [1, 1, 0]):  # beams reordered, sources leaving, a beam's first
        parity = device.parity
        for cache in caches:
            cache.select(selection)
        assert device.parity != parity  # gathered into the spare buffers, which swapped in
        _write_step(caches, rng)
        assert device.live_lengths.tolist() == host.live_lengths.tolist()
        for on_device, on_host in zip(_live(device), _live(host), strict=True):
            for a, b in zip(on_device, on_host, strict=True):
                np.testing.assert_array_equal(a, b)
    assert all(isinstance(buffer, ort.OrtValue) for buffer in device.keys + device.values)
    view = device.views()[0]
    assert isinstance(view, BufferView) and view.shape == (3, 2, device.capacity, 8)  # the live rows, by address
    assert device.nbytes == host.nbytes + sum(b.nbytes for b in host.keys + host.values)  # and the spare set


def test_only_an_fp16_cache_lives_on_cuda():
    """ONNX Runtime's CUDA GroupQueryAttention has no float32 kernel: an fp32 step on CUDA attends on the CPU, and
    its cache bound on the device decoded wrongly on an H200, so fp32 keeps its cache on the host there."""
    assert device_cache_for("cuda", np.float16, None) is True
    assert device_cache_for("cuda", np.float32, None) is False
    assert device_cache_for("cpu", np.float16, None) is False
    assert device_cache_for("cpu", np.float32, True) is True  # the device cache's code, tested on the CPU
    assert device_cache_for("cuda", np.float16, False) is False
    with pytest.raises(ValueError, match="use the fp16 variant"):
        device_cache_for("cuda", np.float32, True)
