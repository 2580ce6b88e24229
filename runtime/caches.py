"""The self-attention caches a running batch keeps on the host: the keys/values its rows write at every step
(``KVCache``), and ``CachePool``, which hands an emptied cache's buffers to the next. The cross-attention
keys/values of its sources are runtime/source_cache.py; a device-resident self-attention cache is
runtime/device_cache.py.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Sequence

import numpy as np

from runtime.held_copies import copy_slots

# Up to this many rows, the arrays a step reads are updated through a memoryview, element by element: the
# first numpy ufunc after ONNX Runtime's run costs 8-14 µs (its dispatch runs from caches the run evicted),
# more than a few Python item writes (batch 1 greedy: 7 µs less per step, 1.1% faster).
FEW_ROWS = 8
# Up to this many rows, a batch's rows are chosen anew (a join, a departure, a beam's reorder) over Python lists:
# numpy's fancy indexing lets go of the interpreter lock at any size, and a lane then waits behind the event loop
# and the other lanes to take it back (runtime/held_copies.py).
LISTED_ROWS = 64


class KVCache:
    """Self-attention keys/values of the live rows, written in place by the decoder step.

    Per decoder layer one key and one value buffer (rows_capacity, H, capacity, d_cache);
    the first ``rows`` rows are live and row r holds ``lengths[r]`` entries at slots
    0..lengths[r]-1 (rows may have different lengths: the lengths are the mask). The step
    writes each row's new entry at slot lengths[r] and the lengths then advance, so a step
    copies nothing. Buffers grow geometrically (rows) and by ``round_to`` slots when needed;
    ``buffers_key`` changes whenever they are replaced, so a step that bound them binds anew.
    Reordering rows (beam search, sources leaving) copies the rows whose origin changed,
    in place; a device cache (``moves_in_place`` False) gathers into a spare set of
    buffers that then swaps in.
    """

    moves_in_place = True  # reordered rows are copied within their buffers (a device cache gathers instead)

    def __init__(
        self,
        layers: int,
        heads: int,
        d_cache: int,
        dtype=np.float32,
        round_to: int = 16,
        pool: CachePool | None = None,
    ) -> None:
        self.layers, self.heads, self.d_cache, self.dtype, self.round_to = layers, heads, d_cache, dtype, round_to
        self.pool = pool
        self.keys: list = []
        self.version = 0
        self.generation = 0  # new buffers
        self.parity = 0  # which of the two buffer sets (live, spare) is live
        self.clear()

    @property
    def buffers_key(self) -> tuple[int, int]:
        """Which buffers the live rows are in: beam search flips between two sets, so a step can keep a
        binding for each."""
        return self.generation, self.parity

    def clear(self) -> None:
        """No rows left: give the buffers back (to the pool, when there is one)."""
        if self.pool is not None and self.keys and self.rows_capacity and self.capacity:
            self.pool.give(self.keys, self.values)
        self.keys = [self._buffer(0, 0) for _ in range(self.layers)]
        self.values = [self._buffer(0, 0) for _ in range(self.layers)]
        self.lengths, self.rows, self._spare = np.zeros(0, np.int32), 0, None
        self.longest = 0  # the most entries a live row holds (kept as a number: read at every step)
        self._sized()
        self.version += 1
        self.generation, self.parity = self.generation + 1, 0

    def _sized(self) -> None:
        """The buffers were replaced: note their rows and slots."""
        self.rows_capacity, _, self.capacity, _ = self._shape(self.keys[0])

    # --- storage: numpy arrays here; runtime.device_cache.DeviceKVCache keeps them on a device instead ---

    def _buffer(self, rows: int, capacity: int) -> np.ndarray:
        return np.zeros((rows, self.heads, capacity, self.d_cache), self.dtype)

    @staticmethod
    def _shape(buffer) -> tuple[int, ...]:
        return buffer.shape

    def _copy_live(self, old, new, longest: int) -> None:
        """The live rows' first ``longest`` slots of ``old`` into the same places of ``new``."""
        new[: self.rows, :, :longest] = old[: self.rows, :, :longest]

    def _gather(self, old, new, rows: np.ndarray, longest: int) -> None:
        """new[i] = old[rows[i]] for the first ``longest`` slots (gathered whole, then copied: twice as fast as
        np.take into the strided slots, 149 against 304 µs for 128 rows of 20 slots)."""
        new[: len(rows), :, :longest] = old[rows, :, :longest]

    def _move(self, origins: Sequence[int], targets: Sequence[int], longest: int) -> None:
        """Row targets[i] takes row origins[i]'s first ``longest`` slots, in place: the origins are all read
        before any target is written, so rows may swap or repeat. A few rows none of which is both an origin
        and a target (beam search's usual step, a departure) are copied one by one, the lock held (``copy_slots``)."""
        buffers, pairs = self.keys + self.values, list(zip(targets, origins, strict=True))
        if (
            len(pairs) <= FEW_ROWS
            and set(targets).isdisjoint(origins)
            and copy_slots(buffers, buffers, pairs, 0, longest)
        ):
            return
        origins, targets = np.asarray(origins, np.int64), np.asarray(targets, np.int64)
        for buffer in buffers:
            buffer[targets, :, :longest] = buffer[origins, :, :longest]

    def view(self, buffer):
        """What the step binds for a buffer: its live rows (a contiguous view)."""
        return buffer[: self.rows]

    # --- rows and slots ---------------------------------------------------------------

    @property
    def nbytes(self) -> int:
        buffers = self.keys + self.values + ([] if self._spare is None else self._spare[0] + self._spare[1])
        return sum(math.prod(self._shape(b)) for b in buffers) * np.dtype(self.dtype).itemsize

    @property
    def live_lengths(self) -> np.ndarray:
        return self.lengths[: self.rows]

    def views(self) -> list:
        """past_key_0, past_value_0, past_key_1, ...: the live rows of each buffer."""
        return [self.view(buffer) for pair in zip(self.keys, self.values, strict=True) for buffer in pair]

    def reserve(self, rows: int, length: int) -> None:
        """Room for ``rows`` rows of ``length`` slots; live entries are kept."""
        if rows <= self.rows_capacity and length <= self.capacity:
            return
        if not self.rows and self.pool is not None and (pooled := self.pool.take(rows, length)) is not None:
            self.keys, self.values = pooled
            self._sized()
            self.lengths = np.zeros(self.rows_capacity, np.int32)
            self.version += 1
            self.generation, self.parity = self.generation + 1, 0
            return
        new_rows = (
            max(rows, min(2 * self.rows_capacity, rows + 64)) if rows > self.rows_capacity else self.rows_capacity
        )
        new_capacity = round_up(length, self.round_to) if length > self.capacity else self.capacity
        self._spare = None
        for buffers in (self.keys, self.values):
            for i, old in enumerate(buffers):
                buffers[i] = self._buffer(new_rows, new_capacity)
                self._copy_live(old, buffers[i], self.longest)
        self._sized()
        lengths = np.zeros(new_rows, np.int32)
        lengths[: self.rows] = self.live_lengths
        self.lengths = lengths
        self.version += 1
        self.generation, self.parity = self.generation + 1, 0

    def add_rows(self, count: int) -> None:
        """Rows for new arrivals: nothing cached yet (their slots are garbage until written)."""
        self.reserve(self.rows + count, max(self.capacity, 1))
        self.lengths[self.rows : self.rows + count] = 0
        self.rows += count
        self.version += 1

    def advance(self) -> None:
        """The step wrote one entry per row; make room for the next step's."""
        if self.rows:
            if self.rows <= FEW_ROWS:
                lengths = memoryview(self.lengths)
                for row in range(self.rows):
                    lengths[row] += 1
            else:
                self.lengths[: self.rows] += 1
            self.longest += 1
        self.reserve(self.rows, self.longest + 1)

    def select(self, rows: Sequence[int]) -> None:
        """Keep these rows, in this order (indices may repeat)."""
        count = len(rows)
        if 0 < count <= LISTED_ROWS and self.moves_in_place:
            self._select_listed(list(rows))
            return
        rows = np.asarray(rows, np.int64)
        longest = self.longest  # only live slots: the rest may not even be paged in
        if count and self.moves_in_place:  # only the rows that change are copied, through a temporary
            self.reserve(count, self.capacity)  # a beam's first step turns one row into several
            changed = np.flatnonzero(rows != np.arange(count))
            if len(changed):
                self._move(rows[changed], changed, longest)
        elif count:  # gathered into the spare buffers, which then swap in
            self.reserve(count, self.capacity)
            if self._spare is None:
                self._spare = tuple(
                    [self._buffer(self.rows_capacity, self.capacity) for _ in buffers]
                    for buffers in (self.keys, self.values)
                )
            spare_keys, spare_values = self._spare
            for old, new in zip(self.keys + self.values, spare_keys + spare_values, strict=True):
                self._gather(old, new, rows, longest)
            self._spare = (self.keys, self.values)
            self.keys, self.values = spare_keys, spare_values
            self.parity ^= 1
        self.lengths[:count] = self.lengths[rows]
        self.rows = count
        self.longest = int(self.live_lengths.max(initial=0))
        self.version += 1

    def _select_listed(self, rows: list[int]) -> None:
        """``select`` over a list (see LISTED_ROWS)."""
        count, longest = len(rows), self.longest
        self.reserve(count, self.capacity)  # a beam's first step turns one row into several
        changed = [target for target, origin in enumerate(rows) if origin != target]
        if changed:
            self._move([rows[target] for target in changed], changed, longest)
        lengths = memoryview(self.lengths)
        kept = [lengths[row] for row in rows]
        for row, length in enumerate(kept):
            lengths[row] = length
        self.rows, self.longest = count, max(kept)
        self.version += 1


class CachePool:
    """The buffers of the last self-attention cache that emptied, kept for the next one they fit: its steps
    then write into memory already paged in, not into fresh pages the kernel must fault in and zero on first
    touch (offline decoding makes a cache per batch). One set at most, so a model holds at most one idle
    cache beside its live ones."""

    def __init__(self) -> None:
        self._lock = threading.Lock()  # translate-file's workers decode batches on threads
        self._buffers: tuple[list, list] | None = None

    def give(self, keys: list, values: list) -> None:
        with self._lock:
            self._buffers = (keys, values)  # the set it held before is freed

    def take(self, rows: int, capacity: int) -> tuple[list, list] | None:
        """The kept set, when its buffers hold ``rows`` rows of ``capacity`` slots (it is then no longer kept)."""
        with self._lock:
            buffers = self._buffers
            if buffers is None or buffers[0][0].shape[0] < rows or buffers[0][0].shape[2] < capacity:
                return None
            self._buffers = None
            return buffers


def round_up(value: int, round_to: int) -> int:
    return -(-value // round_to) * round_to
