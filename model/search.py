"""Decoding over an abstract decoder step, in numpy only.

PyTorch (``model.translate``), ONNX Runtime (``export.runtime``) and the
server all decode through this module: the search is written once, and the
backends differ only in how one decoder step is computed.

- ``GreedySearch`` / ``BeamSearch``: the search of one source. Each step it
  receives the log-probabilities of its live rows and says which rows go on
  (by origin) with which tokens; it is done when it returns no rows.
- ``DecodeBatch``: the running batch. Sources join (``add``) at any step with
  an empty self-attention cache and their own cross-attention keys/values,
  and leave as soon as their search is done (or they are cancelled). Offline
  decoding adds everything once and steps until empty; the server's
  continuous scheduler adds arrivals between steps.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

NEG_INF = -1e9


def pad_sources(ids: Sequence[Sequence[int]], pad: int, eos: int) -> tuple[np.ndarray, np.ndarray]:
    """Source ids + eos, right-padded: tokens (B, S) int64 and mask (B, S) bool (True on real tokens)."""
    longest = max(len(row) for row in ids) + 1
    tokens = np.full((len(ids), longest), pad, dtype=np.int64)
    for i, row in enumerate(ids):
        tokens[i, : len(row) + 1] = [*row, eos]
    return tokens, tokens != pad


def default_max_output(source_len: int, cap: int) -> int:
    """Longest translation searched for a source of source_len tokens (eos included)."""
    return min(cap, 2 * source_len + 10)


@dataclass
class KVCache:
    """Self-attention keys/values of the live rows, in a buffer that grows in chunks.

    k, v: (L, R, H, capacity, d_k); mask: (R, capacity) True on written slots;
    lengths: (R,) slots written per row. Rows may have different lengths: each
    writes its next entry at its own slot, and the validity mask tells the
    decoder which slots are real. The whole buffer is passed to the decoder
    step, so no per-step copy is made; unwritten slots are masked out.
    """

    k: np.ndarray
    v: np.ndarray
    mask: np.ndarray
    lengths: np.ndarray
    chunk: int = 16

    @classmethod
    def empty(cls, layers: int, rows: int, heads: int, d_head: int, dtype=np.float32, chunk: int = 16) -> KVCache:
        shape = (layers, rows, heads, 0, d_head)
        empty = np.zeros(shape, dtype)
        return cls(empty, empty.copy(), np.zeros((rows, 0), bool), np.zeros(rows, np.int64), chunk)

    @property
    def capacity(self) -> int:
        return self.k.shape[3]

    @property
    def nbytes(self) -> int:
        return self.k.nbytes + self.v.nbytes + self.mask.nbytes

    def _grow(self, capacity: int) -> None:
        extra = capacity - self.capacity
        pad = ((0, 0), (0, 0), (0, 0), (0, extra), (0, 0))
        self.k, self.v = np.pad(self.k, pad), np.pad(self.v, pad)
        self.mask = np.pad(self.mask, ((0, 0), (0, extra)))

    def append(self, new_k: np.ndarray, new_v: np.ndarray) -> None:
        """Write each row's new entry (L, R, H, 1, d_k) at that row's next slot."""
        needed = int(self.lengths.max(initial=0)) + 1
        if needed > self.capacity:
            self._grow(-(-needed // self.chunk) * self.chunk)
        rows = np.arange(len(self.lengths))
        # Advanced indices split by a slice put the row axis first: (R, L, H, d_k).
        self.k[:, rows, :, self.lengths] = new_k[:, :, :, 0].transpose(1, 0, 2, 3)
        self.v[:, rows, :, self.lengths] = new_v[:, :, :, 0].transpose(1, 0, 2, 3)
        self.mask[rows, self.lengths] = True
        self.lengths = self.lengths + 1

    def select(self, rows: np.ndarray) -> None:
        """Keep these rows (indices may repeat); capacity shrinks to what the longest needs."""
        self.lengths = self.lengths[rows]
        longest = int(self.lengths.max(initial=0))
        capacity = min(self.capacity, -(-longest // self.chunk) * self.chunk)
        self.k = np.ascontiguousarray(self.k[:, rows, :, :capacity])
        self.v = np.ascontiguousarray(self.v[:, rows, :, :capacity])
        self.mask = np.ascontiguousarray(self.mask[rows, :capacity])

    def add_empty_rows(self, count: int) -> None:
        """Rows for new arrivals: nothing cached yet."""
        layers, _, heads, capacity, d_head = self.k.shape
        zeros = np.zeros((layers, count, heads, capacity, d_head), self.k.dtype)
        self.k = np.concatenate([self.k, zeros], axis=1)
        self.v = np.concatenate([self.v, zeros], axis=1)
        self.mask = np.concatenate([self.mask, np.zeros((count, capacity), bool)])
        self.lengths = np.concatenate([self.lengths, np.zeros(count, np.int64)])


class SourceCache:
    """Cross-attention keys/values of the batch's sources, one slot per source.

    k, v: (L, N, H, S, d_k) with room for N sources of up to S tokens; mask
    (N, S) True on a source's real tokens. A joining source is written into
    the next free slot in place (the others are not copied); a leaving one
    frees its slot. Only when the room runs out, or the longest live source
    needs less than half of S, are the live slots packed to the front (S
    shrinking to what they need), and the buffer grows in chunks only if
    packing is not enough. The whole buffer is passed to the decoder step;
    rows reach their source's slot through source_index, so unused slots cost
    memory but no compute.

    ``place`` turns the host buffers into what the decoder step takes (an
    ONNX Runtime device value with IOBinding); it runs once per change of the
    buffer, not per step. Encoder outputs that live on a device are brought to
    the host once, when they join.
    """

    def __init__(self, place: Callable[[np.ndarray], Any] | None = None, chunk: int = 8) -> None:
        self.place, self.chunk = place, chunk
        self.k: np.ndarray | None = None
        self.v: np.ndarray | None = None
        self.mask = np.zeros((0, 0), bool)
        self.lengths = np.zeros(0, np.int64)  # real tokens per slot; 0 once free
        self.used = 0  # slots written since the last packing
        self._placed: tuple[Any, Any] | None = None

    @property
    def capacity(self) -> tuple[int, int]:
        return self.mask.shape

    @property
    def nbytes(self) -> int:
        return 0 if self.k is None else self.k.nbytes + self.v.nbytes

    @property
    def step_inputs(self) -> tuple[Any, Any, np.ndarray]:
        """(cross_k, cross_v, src_mask) for the decoder step."""
        if self.place is None or self.k is None:
            return self.k, self.v, self.mask
        if self._placed is None:
            self._placed = (self.place(self.k), self.place(self.v))
        return (*self._placed, self.mask)

    def add(self, k: Any, v: Any, mask: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
        """Write n sources (k, v: (L, n, H, s, d_k), mask (n, s)) into free slots.

        Returns their slots and, when the live slots were packed first, the
        map old slot -> new slot (-1 for freed ones) that row indices must follow.
        """
        if k is not None and not isinstance(k, np.ndarray):
            k, v = k.numpy(), v.numpy()  # an ONNX Runtime value on a device: to the host, once
        count, length = mask.shape
        want_length = _round_up(max(int(self.lengths.max(initial=0)), length), self.chunk)
        remap = None
        if self.used + count > self.capacity[0] or length > self.capacity[1] or 2 * want_length <= self.capacity[1]:
            had_sources = self.used > 0
            packed = self._pack(count, want_length, k)
            remap = packed if had_sources else None
        slots = np.arange(self.used, self.used + count)
        self.mask[slots] = False
        self.mask[slots, :length] = mask
        if k is not None:
            self.k[:, self.used : self.used + count, :, :length] = k
            self.v[:, self.used : self.used + count, :, :length] = v
        self.lengths[slots] = mask.sum(axis=1)
        self.used += count
        self._placed = None
        return slots, remap

    def free(self, slot: int) -> None:
        self.lengths[slot] = 0

    def clear(self) -> None:
        self.__init__(self.place, self.chunk)

    def _pack(self, joining: int, length: int, sample: np.ndarray | None) -> np.ndarray:
        """Live slots to the front of a buffer with room for ``joining`` more sources of ``length`` tokens."""
        live = np.flatnonzero(self.lengths[: self.used] > 0)
        needed, current = _round_up(len(live) + joining, 8), self.capacity[0]
        # Grow geometrically, so packing stays rare; shrink when far too big.
        slots = max(needed, 2 * current) if needed > current else min(current, 2 * needed)
        remap = np.full(self.capacity[0], -1, np.int64)
        remap[live] = np.arange(len(live))
        keep = min(length, self.capacity[1])
        mask = np.zeros((slots, length), bool)
        mask[: len(live), :keep] = self.mask[live, :keep]
        lengths = np.zeros(slots, np.int64)
        lengths[: len(live)] = self.lengths[live]
        if self.k is not None or sample is not None:
            reference = self.k if self.k is not None else sample
            layers, _, heads, _, d_head = reference.shape
            k = np.zeros((layers, slots, heads, length, d_head), reference.dtype)
            v = np.zeros_like(k)
            if self.k is not None and len(live):
                k[:, : len(live), :, :keep] = self.k[:, live, :, :keep]
                v[:, : len(live), :, :keep] = self.v[:, live, :, :keep]
            self.k, self.v = k, v
        self.mask, self.lengths, self.used = mask, lengths, len(live)
        return remap


def _round_up(value: int, chunk: int) -> int:
    return -(-value // chunk) * chunk


class Search(Protocol):
    rows: int  # live rows this source occupies

    def advance(self, log_probs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """log_probs (rows, V) of this step -> (origin of each next row, its token); none when done."""

    def result(self) -> list[int]: ...


@dataclass
class GreedySearch:
    max_length: int  # tokens including eos
    eos_id: int
    tokens: list[int] = field(default_factory=list)
    rows: int = 1

    def advance(self, log_probs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        token = int(log_probs[0].argmax())
        if token == self.eos_id or len(self.tokens) + 1 >= self.max_length:
            self.rows = 0
            return np.zeros(0, np.int64), np.zeros(0, np.int64)
        self.tokens.append(token)
        return np.zeros(1, np.int64), np.array([token])

    def result(self) -> list[int]:
        return self.tokens


def top_indices(values: np.ndarray, k: int) -> np.ndarray:
    """Indices of the k largest values, best first, ties broken by the lower index (O(n), not a full sort)."""
    if values.size > k:
        candidates = np.argpartition(-values, k - 1)[:k]
        threshold = values[candidates].min()
        candidates = np.flatnonzero(values >= threshold)  # every tie at the boundary, so the choice is stable
    else:
        candidates = np.arange(values.size)
    return candidates[np.lexsort((candidates, -values[candidates]))][:k]


def length_normalized(score: float, length: int, alpha: float) -> float:
    """GNMT length penalty: score / ((5 + length) / 6)^alpha."""
    return score / (((5.0 + length) / 6.0) ** alpha)


@dataclass
class BeamSearch:
    """Beam search for one source. It starts from one row; each step takes the 2·beam
    best extensions: those ending in eos within the top beam ranks are finished
    (scored with the GNMT length penalty), the best non-eos ones form the next
    beam. Done with ``beam`` finished hypotheses or at max_length."""

    beam: int
    max_length: int
    eos_id: int
    alpha: float = 0.6
    scores: np.ndarray = field(default_factory=lambda: np.zeros(1))
    history: np.ndarray = field(default_factory=lambda: np.zeros((1, 0), np.int64))
    finished: list[tuple[float, list[int]]] = field(default_factory=list)
    rows: int = 1

    def advance(self, log_probs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        vocab = log_probs.shape[-1]
        candidates = self.scores[:, None] + log_probs.astype(np.float64)
        at_limit = self.history.shape[1] + 1 >= self.max_length
        if at_limit:  # the only way on is to end
            candidates[:, : self.eos_id] = NEG_INF
            candidates[:, self.eos_id + 1 :] = NEG_INF
        flat = candidates.reshape(-1)
        top = top_indices(flat, 2 * self.beam)
        origins, tokens, scores = [], [], []
        for rank, index in enumerate(top):
            origin, token = divmod(int(index), vocab)
            if flat[index] <= NEG_INF / 2:
                break
            if token == self.eos_id:
                if rank < self.beam:
                    length = self.history.shape[1] + 1
                    self.finished.append(
                        (length_normalized(float(flat[index]), length, self.alpha), self.history[origin].tolist())
                    )
            elif len(origins) < self.beam:
                origins.append(origin)
                tokens.append(token)
                scores.append(flat[index])
            if len(self.finished) >= self.beam or (len(origins) == self.beam and rank >= self.beam - 1):
                break
        if len(self.finished) >= self.beam or at_limit or not origins:
            self.rows = 0
            return np.zeros(0, np.int64), np.zeros(0, np.int64)
        origin_array, token_array = np.array(origins), np.array(tokens)
        self.history = np.concatenate([self.history[origin_array], token_array[:, None]], axis=1)
        self.scores = np.array(scores)
        self.rows = len(origins)
        return origin_array, token_array

    def result(self) -> list[int]:
        return max(self.finished, key=lambda f: f[0])[1]


def new_search(beam: int, max_length: int, eos_id: int) -> Search:
    return GreedySearch(max_length, eos_id) if beam == 1 else BeamSearch(beam, max_length, eos_id)


StepFn = Callable[[dict[str, Any]], tuple[np.ndarray, np.ndarray, np.ndarray]]


class DecodeBatch:
    """The running decode batch: sources with their searches, and the rows of their hypotheses.

    ``step_fn`` computes one decoder step from named numpy inputs (tokens,
    positions, past_k, past_v, cache_mask, cross_k, cross_v, src_mask,
    source_index) and returns (log_probs, new_k, new_v). Cross-attention
    keys/values are kept once per source (a ``SourceCache`` slot); rows point
    at their slot through source_index, so a request's beams share them.
    ``place`` puts the cross-attention buffers where the step wants them
    (see ``SourceCache``).
    """

    def __init__(
        self,
        step_fn: StepFn,
        layers: int,
        heads: int,
        d_head: int,
        start_id: int,
        dtype=np.float32,
        place: Callable[[np.ndarray], Any] | None = None,
    ) -> None:
        self.step_fn = step_fn
        self.start_id = start_id
        self.cache = KVCache.empty(layers, 0, heads, d_head, dtype)
        self.sources = SourceCache(place)
        self.searches: dict[Any, Search] = {}  # live sources in row order
        self.slot_of: dict[Any, int] = {}
        self.source_index = np.zeros(0, np.int64)
        self.tokens = np.zeros(0, np.int64)

    @property
    def rows(self) -> int:
        return len(self.tokens)

    def __len__(self) -> int:
        return len(self.searches)

    @property
    def cross_nbytes(self) -> int:
        return self.sources.nbytes

    @property
    def src_mask(self) -> np.ndarray:
        return self.sources.mask

    def add(
        self, keys: Sequence[Any], searches: Sequence[Search], cross_k: Any, cross_v: Any, src_mask: np.ndarray
    ) -> None:
        """Join sources (encoded together: cross_k (L, n, H, S, d_k)) with empty caches."""
        slots, remap = self.sources.add(cross_k, cross_v, src_mask)
        if remap is not None:
            self.source_index = remap[self.source_index]
            self.slot_of = {key: int(remap[slot]) for key, slot in self.slot_of.items()}
        for key, search, slot in zip(keys, searches, slots, strict=True):
            self.slot_of[key] = int(slot)
            self.searches[key] = search
        self.cache.add_empty_rows(len(keys))
        self.source_index = np.concatenate([self.source_index, slots])
        self.tokens = np.concatenate([self.tokens, np.full(len(keys), self.start_id, np.int64)])

    def _run_step(self) -> np.ndarray:
        cross_k, cross_v, src_mask = self.sources.step_inputs
        inputs = {
            "tokens": self.tokens,
            "positions": self.cache.lengths.copy(),
            "past_k": self.cache.k,
            "past_v": self.cache.v,
            "cache_mask": self.cache.mask,
            "cross_k": cross_k,
            "cross_v": cross_v,
            "src_mask": src_mask,
            "source_index": self.source_index,
        }
        log_probs, new_k, new_v = self.step_fn(inputs)
        self.cache.append(new_k, new_v)
        return log_probs

    def step(self) -> list[tuple[Any, list[int]]]:
        """One decoder step for every row; returns the sources finished by it (key, token ids)."""
        log_probs = self._run_step()
        rows, tokens, finished, offset = [], [], [], 0
        for key, search in list(self.searches.items()):
            n = search.rows
            origins, next_tokens = search.advance(log_probs[offset : offset + n])
            rows.append(offset + origins)
            tokens.append(next_tokens)
            offset += n
            if search.rows == 0:
                finished.append((key, search.result()))
                self._forget(key)
        self._keep_rows(np.concatenate(rows) if rows else np.zeros(0, np.int64), tokens)
        return finished

    def remove(self, key: Any) -> None:
        """Drop a source mid-way (its caller went away); its rows and cache go at once."""
        offset = 0
        keep = []
        for k, search in self.searches.items():
            if k != key:
                keep.append(np.arange(offset, offset + search.rows))
            offset += search.rows
        self._forget(key)
        rows = np.concatenate(keep) if keep else np.zeros(0, np.int64)
        self._select_rows(rows)
        self.tokens = self.tokens[rows]
        self._release_if_empty()

    def _select_rows(self, rows: np.ndarray) -> None:
        self.cache.select(rows)
        self.source_index = self.source_index[rows]

    def _forget(self, key: Any) -> None:
        del self.searches[key]
        self.sources.free(self.slot_of.pop(key))

    def _keep_rows(self, rows: np.ndarray, tokens: list[np.ndarray]) -> None:
        if len(rows) != self.rows or not np.array_equal(rows, np.arange(self.rows)):
            self._select_rows(rows)
        self.tokens = np.concatenate(tokens).astype(np.int64) if tokens else np.zeros(0, np.int64)
        self._release_if_empty()

    def _release_if_empty(self) -> None:
        if not self.searches:
            self.sources.clear()
            self.slot_of = {}


def decode(
    batch: DecodeBatch,
    cross_k: Any,
    cross_v: Any,
    src_mask: np.ndarray,
    sources: Sequence[Sequence[int]],
    beam: int,
    eos_id: int,
    max_output_tokens: int,
) -> list[list[int]]:
    """Decode sources (already encoded together) to completion: token ids without start and eos."""
    searches = [new_search(beam, default_max_output(len(s) + 1, max_output_tokens), eos_id) for s in sources]
    batch.add(list(range(len(sources))), searches, cross_k, cross_v, src_mask)
    results: dict[int, list[int]] = {}
    while len(batch):
        results.update(batch.step())
    return [results[i] for i in range(len(sources))]


def translate_in_batches(
    tokenizer, texts: Sequence[str], translate_ids: Callable[[list[list[int]]], list[list[int]]], batch_size: int
) -> list[str]:
    """Tokenize, translate length-sorted batches (little padding), detokenize in the input order."""
    ids = tokenizer.encode_source(texts)
    order = sorted(range(len(ids)), key=lambda i: len(ids[i]))
    outputs: list[list[int]] = [[] for _ in ids]
    for start in range(0, len(order), batch_size):
        chunk = order[start : start + batch_size]
        for i, out in zip(chunk, translate_ids([ids[i] for i in chunk]), strict=True):
            outputs[i] = out
    return tokenizer.decode(outputs)
