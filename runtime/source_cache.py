"""The cross-attention keys/values of a running batch's sources, on the host (``SourceCache``)."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from runtime.caches import round_up
from runtime.held_copies import copy_slots


class SourceCache:
    """Cross-attention keys/values of the batch's live sources, in the batch's order.

    k, v: (L, N, H, S, d_k) with room for N sources of up to S tokens; the first ``count``
    slots are live and slot i holds the batch's i-th source, so the decoder step reaches a
    source's keys/values without an index. mask (N, S) is 1 on a source's real tokens.
    A joining source is written into the next slot in place (the others are not copied);
    the batch fills a leaving source's slot with one from the end (see ``gap_filling_order``). The buffer is
    replaced only when room runs out (growing geometrically) or when the longest live
    source needs less than half of S (S shrinking to what they need).

    ``place`` turns each layer's live slots into what the decoder step takes (an ONNX
    Runtime device value with IOBinding); it runs once per change of the sources, not per
    step. Encoder outputs that live on a device are brought to the host once, when they join.
    """

    def __init__(self, place: Callable[[np.ndarray], Any] | None = None, round_to: int = 8) -> None:
        self.place, self.round_to = place, round_to
        self.k: np.ndarray | None = None
        self.v: np.ndarray | None = None
        self.mask = np.zeros((0, 0), np.int32)  # as the step reads it: its live rows bind as they are
        self.lengths = np.zeros(0, np.int64)  # real tokens per slot
        self.count = 0  # live slots, at the front
        self._placed: tuple[list[Any], np.ndarray] | None = None
        self._memory: tuple[np.ndarray, np.ndarray] | None = None  # the flat buffers k and v are views of
        self._spare: tuple[np.ndarray, np.ndarray] | None = None  # those before the last resize, for the next

    @property
    def capacity(self) -> tuple[int, int]:
        return self.mask.shape

    @property
    def nbytes(self) -> int:
        return sum(flat.nbytes for pair in (self._memory, self._spare) if pair is not None for flat in pair)

    def step_inputs(self) -> tuple[list[Any], np.ndarray]:
        """[cross_key_0, cross_value_0, cross_key_1, ...] (N, H, S, d_k) and src_mask (N, S) int32 of the
        N live sources (contiguous views of the buffers)."""
        if self._placed is None:
            place, n = self.place or (lambda array: array), self.count
            layers = [] if self.k is None else [place(x[i, :n]) for i in range(len(self.k)) for x in (self.k, self.v)]
            self._placed = (layers, self.mask[:n])
        return self._placed

    def add(self, k: Any, v: Any, mask: np.ndarray) -> None:
        """Append n sources (k, v: (L, n, H, s, d_k), mask (n, s)) after the live ones."""
        if k is not None and not isinstance(k, np.ndarray):
            k, v = k.numpy(), v.numpy()  # an ONNX Runtime value on a device: to the host, once
        count, length = mask.shape
        want_length = round_up(max(int(self.lengths[: self.count].max(initial=0)), length), self.round_to)
        if self.count + count > self.capacity[0] or length > self.capacity[1] or 2 * want_length <= self.capacity[1]:
            self._resize(self.count + count, want_length, k)
        slots = slice(self.count, self.count + count)
        self.mask[slots] = 0
        self.mask[slots, :length] = mask
        joining = [(self.count + i, i) for i in range(count)]
        if k is not None and not copy_slots((self.k, self.v), (k, v), joining, 1, length):
            self.k[:, slots, :, :length], self.v[:, slots, :, :length] = k, v
        self.lengths[slots] = mask.sum(axis=1)
        self.count += count
        self._placed = None

    def keep(self, positions: Sequence[int]) -> None:
        """Keep these live sources, in this order; only those whose slot changes are copied, in place: when no slot
        is both read and written (a departure: sources from the end fill the gaps), each alone and only its real
        tokens (the rest of its slot is masked), the lock held (``copy_slots``)."""
        moved = [slot for slot, origin in enumerate(positions) if origin != slot]
        if moved:
            origins, arrays = [positions[slot] for slot in moved], [x for x in (self.k, self.v) if x is not None]
            if set(moved).isdisjoint(origins):
                for target, origin in zip(moved, origins, strict=True):
                    tokens = int(self.lengths[origin])
                    if not copy_slots(arrays, arrays, [(target, origin)], 1, tokens):
                        for array in arrays:
                            array[:, target, :, :tokens] = array[:, origin, :, :tokens]
                    self.mask[target], self.lengths[target] = self.mask[origin], self.lengths[origin]
            else:
                moved, origins = np.array(moved, np.int64), np.array(origins, np.int64)
                for array in arrays:  # fancy indexing reads them all before any slot is written
                    array[:, moved] = array[:, origins]
                self.mask[moved], self.lengths[moved] = self.mask[origins], self.lengths[origins]
        self.count = len(positions)
        self._placed = None

    def clear(self) -> None:
        self.__init__(self.place, self.round_to)

    def _resize(self, needed: int, length: int, sample: np.ndarray | None) -> None:
        """A buffer with room for ``needed`` sources of ``length`` tokens, the live ones copied to it."""
        needed, current, live = round_up(needed, 8), self.capacity[0], self.count
        # Grow geometrically, so resizing stays rare; shrink when far too big.
        slots = max(needed, 2 * current) if needed > current else min(current, 2 * needed)
        keep = min(length, self.capacity[1])
        mask = np.zeros((slots, length), np.int32)
        mask[:live, :keep] = self.mask[:live, :keep]
        lengths = np.zeros(slots, np.int64)
        lengths[:live] = self.lengths[:live]
        if self.k is not None or sample is not None:
            reference = self.k if self.k is not None else sample
            layers, _, heads, _, d_head = reference.shape
            shape = (layers, slots, heads, length, d_head)
            memory = self._room(math.prod(shape), reference.dtype)
            k, v = (flat[: math.prod(shape)].reshape(shape) for flat in memory)
            if self.k is not None and not copy_slots((k, v), (self.k, self.v), [(i, i) for i in range(live)], 1, keep):
                k[:, :live, :, :keep], v[:, :live, :, :keep] = self.k[:, :live, :, :keep], self.v[:, :live, :, :keep]
            self._memory, self._spare = memory, self._memory
            self.k, self.v = k, v
        self.mask, self.lengths = mask, lengths

    def _room(self, size: int, dtype: np.dtype) -> tuple[np.ndarray, np.ndarray]:
        """Flat buffers for k and v of at least ``size`` elements: the spare pair where it is large enough, its pages
        already written (a new page costs a fault at its first write, and a 20-token source's slot spans 48: a
        join took 213 µs of thread CPU under 32 greedy clients on a 2-core AMD EPYC, the same copy into written
        pages a few µs), else new ones (zeroed lazily by the OS). What a reused slot held before is masked, as a
        departed source's is."""
        spare, self._spare = self._spare, None
        if spare is not None and spare[0].size >= size and spare[0].dtype == dtype:
            return spare
        return np.zeros(size, dtype), np.zeros(size, dtype)
