"""A running batch's rows in fixed-capacity buffers (``SlottedRows``, ``--batch-layout buckets``): the row layout a
captured decoder step needs.

A ``Bucket`` has room for N sources of up to S tokens, G rows each (the widest beam it holds), and T
self-attention slots per row. Every buffer the step binds (tokens, lengths, the caches, the sources' keys,
values and mask, the search head's scores and bias) is allocated once per bucket, and a step changes only what
they hold. A source joins into a free slot (its rows n·G … n·G+G-1, its keys at n) and leaves by freeing it:
its rows are masked (no candidates, length 0), not compacted, so no other row or source moves; beam search
reorders a source's rows within its slot. The batch moves to a larger bucket only when a joining source does
not fit (slots, beam, source or output length), and to a smaller one after SHRINK_AFTER steps with a quarter
of its slots or fewer in use. Within a bucket the step's inputs keep their layout, so a step function binds
them once: what lets a bucket's step be one captured CUDA graph (every bound buffer keeps its address and
shape). The searches and their loop are ``DecodeBatch``'s (runtime/batch.py), as for the compact layout
(runtime/compact_rows.py), so the two decode the same tokens where the step computes each row as it would in a
compact batch.

The caches and sources' keys are host arrays or values on the step's device (runtime/bucket_buffers.py); the
small feeds (tokens, lengths, masks, scores) are host arrays, which a device's step function copies across
before each run (runtime/captured.py). A greedy bucket may run several steps per call (``k_steps_fn``,
runtime/step_graphs.py). On a device the step's total length is the bucket's, as a captured step reads it once.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import Any

import numpy as np

from runtime.batch import Advanced, BatchKey, EncodedSources, Placed, RowShape, StepInputs
from runtime.bucket_buffers import SHRINK_AFTER, Bucket, BufferSet, DeviceBuffers, HostBuffers
from runtime.contract import LIVE, layer_names
from runtime.search import Search


class SlottedRows:
    """The ``RowLayout`` of ``runtime.batch.DecodeBatch`` in a bucket's fixed buffers (see the module's doc):
    ``buffers`` says where they live (default: the host, where the CPU provider steps on them in place)."""

    def __init__(self, shape: RowShape, buffers: HostBuffers | DeviceBuffers | None = None) -> None:
        self.layers, self.heads, self.d_cache = shape.layers, shape.heads, shape.d_cache
        self.start_id = shape.start_id
        self.buffers = buffers or HostBuffers(shape.dtype)
        self.set: BufferSet | None = None  # the bucket's caches and sources' keys
        self.bucket: Bucket | None = None
        self.slots: list[tuple[Hashable, Search] | None] = []
        self.where: dict[Hashable, int] = {}  # each live source's slot
        self._placed: list[Placed] | None = None  # placed(), kept while the slots hold the same sources
        self.buckets_used = 0  # buckets this batch has allocated (a test reads it: joins within one reuse it)
        self._small_steps = 0  # steps in a row with a quarter of the slots or fewer in use
        self._release()

    def __len__(self) -> int:
        return len(self.where)

    @property
    def rows(self) -> int:
        """Hypotheses being decoded (a source has one per live beam)."""
        return sum(self.slots[n][1].rows for n in self.where.values())

    @property
    def cache(self) -> list[Any]:
        """The self-attention caches, past_key_0, past_value_0, ... (none without a bucket)."""
        return self.set.cache if self.set else []

    @property
    def cross(self) -> list[Any]:
        """The sources' keys and values, cross_key_0, cross_value_0, ..."""
        return self.set.cross if self.set else []

    @property
    def cache_bytes(self) -> int:
        return sum(map(self.buffers.nbytes, self.cache))

    @property
    def cross_bytes(self) -> int:
        return sum(map(self.buffers.nbytes, self.cross))

    def placed(self) -> list[Placed]:
        if self._placed is None:  # made again once sources joined, left or moved (``_placed`` reset)
            group = self.bucket.group
            self._placed = [Placed(*self.slots[n], n, n * group) for n in self.where.values()]
        return self._placed

    def greedy_only(self) -> bool:
        return self.bucket.group == 1

    # --- the step ---------------------------------------------------------------------

    def step_inputs(self) -> StepInputs:
        """The step's inputs: the same value, over the same buffers, for as long as the bucket holds."""
        return self._inputs

    def begin_step(self, steps: int) -> StepInputs:
        # GroupQueryAttention's total_sequence_length, a host value: the longest row's on the CPU, where a step's
        # work follows it; on a device the bucket's (a captured step reads it once), less a k-step run's later steps
        if self.buffers.on_device:
            self.total_length[()] = self.bucket.cache_len - steps + 1
        else:
            self.total_length[()] = self.lengths.max() + 1
        return self._inputs

    def advance(self, steps: int) -> None:
        self.lengths += steps * self.live if steps > 1 else self.live

    def add(self, keys: Sequence[Hashable], searches: Sequence[Search], encoded: EncodedSources, overrun: int) -> None:
        """Join sources into free slots, a larger bucket taken first when they do not fit this one."""
        cross_k, cross_v, mask = encoded.cross_k, encoded.cross_v, encoded.src_mask
        if cross_k is not None and not isinstance(cross_k, np.ndarray):
            cross_k, cross_v = cross_k.numpy(), cross_v.numpy()  # values on a device: to the host, once
        live = [self.slots[n][1] for n in self.where.values()] + list(searches)
        need = Bucket.fitting(
            len(live),
            max(search.width for search in live),
            max(mask.shape[1], self._longest_source()),
            max(search.max_length for search in live) + overrun,
        )
        if self.bucket is None or not self.bucket.holds(need):
            current = self.bucket or need
            self._move_to(
                Bucket(
                    max(need.sources, current.sources),  # both powers of two: slots double when they run out
                    need.group,
                    max(need.src_len, current.src_len),
                    max(need.cache_len, current.cache_len),
                ),
                cross_k,
            )
        free = (n for n, slot in enumerate(self.slots) if slot is None)
        length, slots = mask.shape[1], []
        for i, (key, search) in enumerate(zip(keys, searches, strict=True)):
            assert key not in self.where, key
            n = next(free)
            slots.append(n)
            self.slots[n], self.where[key] = (key, search), n
            self._placed = None
            self.src_mask[n] = 0
            self.src_mask[n, :length] = mask[i]
            self.lengths[n * self.bucket.group] = 0  # an empty cache: the slot's rows attend to what they write
            self._set_rows(n, search, (self.start_id,))
        joining = range(len(keys))
        for layer in range(self.layers if cross_k is not None else 0):
            self.buffers.copy_rows(cross_k[layer], self.cross[2 * layer], joining, slots)
            self.buffers.copy_rows(cross_v[layer], self.cross[2 * layer + 1], joining, slots)

    def after_beam_step(self, advanced: list[Advanced], finished: list[Placed]) -> None:
        for placed in finished:
            self._free(placed.index)
        origins_all, targets_all = [], []
        for (_, search, n, base), before, origins, next_tokens in advanced:
            if list(origins) != list(range(len(origins))):
                origins_all.extend(base + origin for origin in origins)
                targets_all.extend(range(base, base + len(origins)))
            if search.rows == before:  # beam search's usual step: only the tokens and scores change
                self.tokens[base : base + before] = next_tokens
                if search.width > 1:
                    self.row_scores[base : base + before, 0] = search.scores
            else:
                self._set_rows(n, search, next_tokens)
        if origins_all:  # every origin is read before any target is written
            self.buffers.reorder(self.cache, origins_all, targets_all, int(self.lengths.max()))
        self._after_step()

    def after_greedy_step(self, last: np.ndarray, best: list[list[int]] | None, finished: list[Placed]) -> None:
        for placed in finished:
            self._free(placed.index)
        self.tokens[:] = last  # free rows' too: nothing reads them, and a join sets its own
        self._after_step()

    def remove(self, key: Hashable) -> None:
        """Drop a source mid-way (its caller went away): its slot is free from the next step on."""
        self._free(self.where[key])
        self._after_step(stepped=False)

    # --- slots -------------------------------------------------------------------------

    def _set_rows(self, n: int, search: Search, tokens: Sequence[int]) -> None:
        """Slot n's rows after a join or a step: the first ``search.rows`` live with ``tokens`` and the search's
        scores, the others masked; the search head takes from each live row the candidates the search wants."""
        group, rows = self.bucket.group, search.rows
        base = n * group
        self.tokens[base : base + rows] = tokens
        self.live[base : base + group] = 0
        self.live[base : base + rows] = 1
        length = self.lengths[base]  # a source's rows all hold its tokens so far
        self.lengths[base : base + group] = 0
        self.lengths[base : base + rows] = length
        scores = getattr(search, "scores", None)
        self.row_scores[base : base + group, 0] = 0.0
        if scores is not None and search.width > 1:
            self.row_scores[base : base + rows, 0] = scores
        self.candidate_bias[n] = -np.inf
        self.candidate_bias[n, :rows, : search.top_k] = 0.0

    def _free(self, n: int) -> None:
        key, _ = self.slots[n]
        del self.where[key]
        self.slots[n], self._placed = None, None
        group = self.bucket.group
        rows = slice(n * group, (n + 1) * group)
        self.live[rows], self.lengths[rows], self.tokens[rows] = 0, 0, self.start_id
        self.candidate_bias[n] = -np.inf
        self.src_mask[n] = 0
        self.src_mask[n, 0] = 1  # a free slot's rows attend to something: no NaN, not even in rows nobody reads

    def _longest_source(self) -> int:
        if not self.where:
            return 0
        used = self.src_mask[list(self.where.values())]
        return int(np.flatnonzero(used.any(axis=0)).max(initial=-1)) + 1

    def _after_step(self, stepped: bool = True) -> None:
        """An empty batch gives its buffers back; one that has long used a quarter of its slots or fewer moves
        to a smaller bucket."""
        if not self.where:
            self._release()
            return
        if not stepped or self.bucket.smallest or 4 * len(self.where) > self.bucket.sources:
            self._small_steps = 0 if stepped else self._small_steps
            return
        self._small_steps += 1
        if self._small_steps >= SHRINK_AFTER:
            self._move_to(self.bucket.with_room_for(2 * len(self.where)))

    # --- buffers -----------------------------------------------------------------------

    def _release(self) -> None:
        """No sources: no buffers, and the next bucket's inputs are a new batch's to a step function."""
        if self.set is not None:
            self.buffers.give_back(self.set)
        self.bucket, self.slots, self.where, self.set, self._placed = None, [], {}, None, None
        self._inputs = None
        self._key = BatchKey()
        self._small_steps = 0

    def _move_to(self, bucket: Bucket, sample: np.ndarray | None = None) -> None:
        """Allocate ``bucket``'s buffers and move the live sources into its first slots, in slot order (``sample``:
        encoder outputs joining, whose dtype and shape the sources' keys take when there are none yet)."""
        old, old_slots = self.bucket, self.slots
        moved = [(n, slot) for n, slot in enumerate(old_slots) if slot is not None]
        rows, group = bucket.rows, bucket.group
        reference = self.cross[0] if self.cross else sample
        cross_shape = None
        if reference is not None:
            shape = tuple(reference.shape() if callable(reference.shape) else reference.shape)
            cross_shape = (bucket.sources, shape[-3], bucket.src_len, shape[-1])
        cache_shape = (rows, self.heads, bucket.cache_len, self.d_cache)
        taken = self.buffers.take(cache_shape, 2 * self.layers, cross_shape)
        state = {
            "tokens": np.full(rows, self.start_id, np.int64),
            "lengths": np.zeros(rows, np.int32),
            "live": np.zeros(rows, np.int32),
            "row_scores": np.zeros((rows, 1), np.float64),
            "candidate_bias": np.full((bucket.sources, group, bucket.top_k), -np.inf),
            "src_mask": np.zeros((bucket.sources, bucket.src_len), np.int32),
        }
        state["src_mask"][:, 0] = 1  # free slots (see _free)
        if old is not None and moved:
            before = np.array([n for n, _ in moved])
            after = np.arange(len(moved))
            kept = min(old.group, group)  # a live source's rows fit both (each bucket is as wide as its beams)
            old_rows = (before[:, None] * old.group + np.arange(kept)).reshape(-1)
            new_rows = (after[:, None] * group + np.arange(kept)).reshape(-1)
            for name in ("tokens", "lengths", "live", "row_scores"):
                state[name][new_rows] = getattr(self, name)[old_rows]
            k = min(old.top_k, bucket.top_k)
            state["candidate_bias"][after, :kept, :k] = self.candidate_bias[before, :kept, :k]
            state["src_mask"][after] = 0
            state["src_mask"][after, : old.src_len] = self.src_mask[before]
            for new, current in zip(taken.cache, self.cache, strict=True):
                self.buffers.copy_rows(current, new, old_rows, new_rows)
            for new, current in zip(taken.cross, self.cross, strict=True):
                self.buffers.copy_rows(current, new, before, after)
        if self.set is not None:
            self.buffers.give_back(self.set)
        self.bucket, self.set = bucket, taken
        for name, value in state.items():
            setattr(self, name, value)
        self.slots = [slot for _, slot in moved] + [None] * (bucket.sources - len(moved))
        self.where = {slot[0]: n for n, slot in enumerate(self.slots) if slot is not None}
        self._placed = None
        self.total_length = np.zeros((), np.int32)
        self.groups = np.arange(rows, dtype=np.int64).reshape(bucket.sources, group)
        self.row_position = np.arange(rows, dtype=np.int64)
        self.top_k = np.array([bucket.top_k], np.int64)
        self.buckets_used += 1
        self._small_steps = 0
        feeds = {
            "tokens": self.tokens,
            "lengths": self.lengths,
            "total_length": self.total_length,
            "groups": self.groups,
            "row_position": self.row_position,
            "src_mask": self.src_mask,
            "top_k": self.top_k,
            "row_scores": self.row_scores,
            "candidate_bias": self.candidate_bias,
        }
        if self.buffers.on_device:  # a device greedy step's (runtime/step_graphs.py, device_greedy_graph)
            feeds[LIVE] = self.live
        feeds.update(zip(layer_names("past", self.layers), self.cache, strict=True))
        if self.cross:
            feeds.update(zip(layer_names("cross", self.layers), self.cross, strict=True))
        self._inputs = StepInputs(feeds, rows, self._key, (taken.key, 0))
