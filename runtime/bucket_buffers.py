"""A bucket's shape (``Bucket``) and where its caches and sources' keys live (runtime/slotted_rows.py):
``HostBuffers``, numpy arrays the CPU provider steps on in place, or ``DeviceBuffers``, ONNX Runtime values on
the step's device whose rows are copied there (``CacheOps.copy_rows``) and never visit the host. A device's
buffer sets are kept for the next batch that takes the same bucket: the buffers, and the step's binding and
captured graph over them (runtime/captured.py), are made once per bucket shape a process uses, not once per
batch."""

from __future__ import annotations

import itertools
import threading
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnxruntime as ort

from runtime.contract import ORT_DTYPES
from runtime.device_cache import CacheOps

MIN_SOURCES = 1  # the fewest slots a bucket has
MIN_LENGTH = 16  # the shortest source and cache length a bucket has (each a power of two)
SHRINK_AFTER = 64  # steps with a quarter of the slots or fewer in use before the batch moves to a smaller bucket


def _power_of_two(value: int, least: int) -> int:
    return max(least, 1 << max(0, int(value) - 1).bit_length())


@dataclass(frozen=True)
class Bucket:
    """Room for ``sources`` sources of up to ``src_len`` tokens (with eos), ``group`` rows each, and
    ``cache_len`` self-attention slots per row."""

    sources: int
    group: int
    src_len: int
    cache_len: int

    @property
    def rows(self) -> int:
        return self.sources * self.group

    @property
    def top_k(self) -> int:
        """Candidates per row and per source the step keeps: what the widest search takes (2·beam, greedy 1)."""
        return 1 if self.group == 1 else 2 * self.group

    @property
    def smallest(self) -> bool:
        """No bucket has fewer slots."""
        return self.sources <= MIN_SOURCES

    def with_room_for(self, sources: int) -> Bucket:
        """This bucket with the fewest slots (a power of two) that hold ``sources``."""
        return Bucket(_power_of_two(sources, MIN_SOURCES), self.group, self.src_len, self.cache_len)

    def holds(self, other: Bucket) -> bool:
        return (
            self.sources >= other.sources
            and self.group >= other.group
            and self.src_len >= other.src_len
            and self.cache_len >= other.cache_len
        )

    @staticmethod
    def fitting(sources: int, group: int, src_len: int, cache_len: int) -> Bucket:
        """The smallest bucket for these needs (each length a power of two, at least MIN_LENGTH)."""
        return Bucket(
            _power_of_two(sources, MIN_SOURCES),
            group,
            _power_of_two(src_len, MIN_LENGTH),
            _power_of_two(cache_len, MIN_LENGTH),
        )


_keys = itertools.count(1)  # every buffer set's own number (a captured step's graph id: 0 is ONNX Runtime's)


@dataclass(eq=False)
class BufferSet:
    """A bucket's self-attention caches (past_key_0, past_value_0, ...) and sources' keys and values (cross_...),
    and ``key``, the set's own number."""

    cache: list[Any]
    cross: list[Any]
    key: int = field(default_factory=lambda: next(_keys))


class HostBuffers:
    """Numpy buffers, made for each bucket a batch takes and left to the garbage collector after."""

    on_device = False

    def __init__(self, dtype) -> None:
        self.dtype = dtype

    def take(self, cache_shape: tuple[int, ...], count: int, cross_shape: tuple[int, ...] | None) -> BufferSet:
        cache = [np.zeros(cache_shape, self.dtype) for _ in range(count)]
        cross = [] if cross_shape is None else [np.zeros(cross_shape, self.dtype) for _ in range(count)]
        return BufferSet(cache, cross)

    def give_back(self, buffers: BufferSet) -> None:
        pass

    @staticmethod
    def copy_rows(source: np.ndarray, target: np.ndarray, rows: Sequence[int], targets: Sequence[int], slots=None):
        """target[targets, :, :slots] = source[rows, :, :slots] (slots: all of source's); slots past it keep what
        they held, which nobody reads (a row's length, a source's mask)."""
        slots = source.shape[2] if slots is None else slots
        target[np.asarray(targets), :, :slots] = source[np.asarray(rows), :, :slots]

    def reorder(self, buffers: list[np.ndarray], rows: Sequence[int], targets: Sequence[int], slots: int) -> None:
        """Each buffer's rows ``targets`` become its rows ``rows`` (beams reordered within their sources)."""
        for buffer in buffers:
            self.copy_rows(buffer, buffer, rows, targets, slots)

    @staticmethod
    def nbytes(buffer: np.ndarray) -> int:
        return buffer.nbytes


class DeviceBuffers:
    """ONNX Runtime values on ``ops``' device, zeroed when made (a masked slot is multiplied by 0, which a NaN left
    in fresh memory would survive), rows copied by ``ops.copy_rows``, and kept by shape for the next batch
    (at most the sets in use at once, for each bucket shape used)."""

    on_device = True

    def __init__(self, ops: CacheOps) -> None:
        self.ops, self.dtype = ops, ops.dtype
        self._free: dict[tuple, list[BufferSet]] = defaultdict(list)
        self._lock = threading.Lock()
        self._reorders: dict[int, ort.InferenceSession] = {}
        self.made = 0  # buffer sets made (a test reads it: a second batch in the same bucket makes none)

    def take(self, cache_shape: tuple[int, ...], count: int, cross_shape: tuple[int, ...] | None) -> BufferSet:
        shape = (cache_shape, count, cross_shape)
        with self._lock:
            if self._free[shape]:
                return self._free[shape].pop()
            self.made += 1
        cache = [self._zeros(cache_shape) for _ in range(count)]
        cross = [] if cross_shape is None else [self._zeros(cross_shape) for _ in range(count)]
        return BufferSet(cache, cross)

    def give_back(self, buffers: BufferSet) -> None:
        cross = tuple(buffers.cross[0].shape()) if buffers.cross else None
        with self._lock:
            self._free[(tuple(buffers.cache[0].shape()), len(buffers.cache), cross)].append(buffers)

    def copy_rows(self, source, target: ort.OrtValue, rows: Sequence[int], targets: Sequence[int], slots=None):
        """target[targets] = source[rows], whole rows zero-padded to target's slots, on the device (``slots`` is
        a host copy's shortcut)."""
        self.ops.copy_rows(source, target, rows, targets)

    def reorder(self, buffers: list[ort.OrtValue], rows: Sequence[int], targets: Sequence[int], slots: int) -> None:
        """Each buffer's rows ``targets`` become its rows ``rows``, all buffers in one run (beam search reorders
        every step: one run instead of one per buffer)."""
        session = self._reorders.get(len(buffers)) or self._reorder_session(len(buffers))
        binding = session.io_binding()
        for i, buffer in enumerate(buffers):
            binding.bind_ortvalue_input(f"x{i}", buffer)
            binding.bind_ortvalue_output(f"y{i}", buffer)
        binding.bind_cpu_input("rows", np.asarray(rows, np.int64))
        binding.bind_cpu_input("targets", np.asarray(targets, np.int64).reshape(-1, 1))
        session.run_with_iobinding(binding)

    def _reorder_session(self, count: int) -> ort.InferenceSession:
        """The reorder of ``count`` buffers (runtime/step_graphs.py, reorder_graph) on the buffers' provider."""
        from runtime.step_graphs import reorder_graph  # the onnx package: only where beams reorder on a device

        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        model = reorder_graph(count, self.dtype).SerializeToString()
        session = ort.InferenceSession(model, options, providers=[self.ops.provider])
        self._reorders[count] = session
        return session

    @staticmethod
    def nbytes(buffer: ort.OrtValue) -> int:
        return int(np.prod(buffer.shape())) * np.dtype(ORT_DTYPES[buffer.data_type()]).itemsize

    def _zeros(self, shape: tuple[int, ...]) -> ort.OrtValue:
        return ort.OrtValue.ortvalue_from_numpy(np.zeros(shape, self.dtype), self.ops.device, 0)
