"""Decoding over an abstract decoder step, in numpy only.

PyTorch (``model.translate``), ONNX Runtime (``runtime.sessions``) and the
server all decode through this module: the search is written once, and the
backends differ only in how one decoder step is computed.

- ``GreedySearch`` / ``BeamSearch``: the search of one source. Each step it
  receives the log-probabilities of its live rows and says which rows go on
  (by origin) with which tokens; it is done when it returns no rows, with a
  ``Hypothesis``: the tokens, a confidence score and why it stopped. With
  ``max_repeats`` set (the server, translate-file), a hypothesis whose tail
  repeats an n-gram more often than that stops there (the runaway-output guard).
- ``DecodeBatch``: the running batch. Sources join (``add``) at any step with
  an empty self-attention cache and their own cross-attention keys/values,
  and leave as soon as their search is done (or they are cancelled). Offline
  decoding adds everything once and steps until empty; the server's
  continuous scheduler adds arrivals between steps.
"""

from __future__ import annotations

import concurrent.futures
import functools
import itertools
import math
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol

import numpy as np

from runtime.contract import layer_names


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


# Up to this many rows, the arrays a step reads are updated through a memoryview, element by element: the
# first numpy ufunc after ONNX Runtime's run costs 8-14 µs (its dispatch runs from caches the run evicted),
# more than a few Python item writes (batch 1 greedy: 7 µs less per step, 1.1% faster).
FEW_ROWS = 8


class KVCache:
    """Self-attention keys/values of the live rows, written in place by the decoder step.

    Per decoder layer one key and one value buffer (rows_capacity, H, capacity, d_cache);
    the first ``rows`` rows are live and row r holds ``lengths[r]`` entries at slots
    0..lengths[r]-1 (rows may have different lengths: the lengths are the mask). The step
    writes each row's new entry at slot lengths[r] and the lengths then advance, so a step
    copies nothing. Buffers grow geometrically (rows) and in chunks (slots) when needed;
    ``layout`` changes whenever they are replaced, so a step that bound them binds anew.
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
        chunk: int = 16,
        pool: CachePool | None = None,
    ) -> None:
        self.layers, self.heads, self.d_cache, self.dtype, self.chunk = layers, heads, d_cache, dtype, chunk
        self.pool = pool
        self.keys: list = []
        self.version = 0
        self.generation = 0  # new buffers
        self.parity = 0  # which of the two buffer sets (live, spare) is live
        self.clear()

    @property
    def layout(self) -> tuple[int, int]:
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

    # --- storage: numpy arrays here; runtime.sessions.DeviceKVCache keeps them on a device instead ---

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
        and a target (beam search's usual step) are copied one by one, without the temporary that fancy
        indexing gathers them into first."""
        buffers = self.keys + self.values
        if len(targets) <= FEW_ROWS and set(targets).isdisjoint(origins):
            for buffer in buffers:
                for origin, target in zip(origins, targets, strict=True):
                    buffer[target, :, :longest] = buffer[origin, :, :longest]
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
        new_capacity = _round_up(length, self.chunk) if length > self.capacity else self.capacity
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
        if 0 < count <= FEW_ROWS and self.moves_in_place:
            self._select_few(rows)
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

    def _select_few(self, rows: Sequence[int]) -> None:
        """``select`` for a few rows, in Python: no numpy call (see FEW_ROWS)."""
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


class SourceCache:
    """Cross-attention keys/values of the batch's live sources, in the batch's order.

    k, v: (L, N, H, S, d_k) with room for N sources of up to S tokens; the first ``count``
    slots are live and slot i holds the batch's i-th source, so the decoder step reaches a
    source's keys/values without an index. mask (N, S) is True on a source's real tokens.
    A joining source is written into the next slot in place (the others are not copied);
    the batch fills a leaving source's slot with one from the end (see ``gap_filling_order``). The buffer is
    replaced only when room runs out (growing geometrically) or when the longest live
    source needs less than half of S (S shrinking to what they need).

    ``place`` turns each layer's live slots into what the decoder step takes (an ONNX
    Runtime device value with IOBinding); it runs once per change of the sources, not per
    step. Encoder outputs that live on a device are brought to the host once, when they join.
    """

    def __init__(self, place: Callable[[np.ndarray], Any] | None = None, chunk: int = 8) -> None:
        self.place, self.chunk = place, chunk
        self.k: np.ndarray | None = None
        self.v: np.ndarray | None = None
        self.mask = np.zeros((0, 0), bool)
        self.lengths = np.zeros(0, np.int64)  # real tokens per slot
        self.count = 0  # live slots, at the front
        self._placed: tuple[list[Any], np.ndarray] | None = None

    @property
    def capacity(self) -> tuple[int, int]:
        return self.mask.shape

    @property
    def nbytes(self) -> int:
        return 0 if self.k is None else self.k.nbytes + self.v.nbytes

    def step_inputs(self) -> tuple[list[Any], np.ndarray]:
        """[cross_key_0, cross_value_0, cross_key_1, ...] (N, H, S, d_k) and src_mask (N, S) int32 of the
        N live sources (contiguous views of the buffers)."""
        if self._placed is None:
            place, n = self.place or (lambda array: array), self.count
            layers = [] if self.k is None else [place(x[i, :n]) for i in range(len(self.k)) for x in (self.k, self.v)]
            self._placed = (layers, self.mask[:n].astype(np.int32))
        return self._placed

    def add(self, k: Any, v: Any, mask: np.ndarray) -> None:
        """Append n sources (k, v: (L, n, H, s, d_k), mask (n, s)) after the live ones."""
        if k is not None and not isinstance(k, np.ndarray):
            k, v = k.numpy(), v.numpy()  # an ONNX Runtime value on a device: to the host, once
        count, length = mask.shape
        want_length = _round_up(max(int(self.lengths[: self.count].max(initial=0)), length), self.chunk)
        if self.count + count > self.capacity[0] or length > self.capacity[1] or 2 * want_length <= self.capacity[1]:
            self._resize(self.count + count, want_length, k)
        slots = slice(self.count, self.count + count)
        self.mask[slots] = False
        self.mask[slots, :length] = mask
        if k is not None:
            self.k[:, slots, :, :length] = k
            self.v[:, slots, :, :length] = v
        self.lengths[slots] = mask.sum(axis=1)
        self.count += count
        self._placed = None

    def keep(self, positions: np.ndarray) -> None:
        """Keep these live sources, in this order; only those whose slot changes are copied, in place."""
        moved = np.flatnonzero(positions != np.arange(len(positions)))
        if len(moved):
            origins = positions[moved]  # fancy indexing reads them all before any slot is written
            for array in (self.k, self.v):
                if array is not None:
                    array[:, moved] = array[:, origins]
            self.mask[moved], self.lengths[moved] = self.mask[origins], self.lengths[origins]
        self.count = len(positions)
        self._placed = None

    def clear(self) -> None:
        self.__init__(self.place, self.chunk)

    def _resize(self, needed: int, length: int, sample: np.ndarray | None) -> None:
        """A buffer with room for ``needed`` sources of ``length`` tokens, the live ones copied to it."""
        needed, current, live = _round_up(needed, 8), self.capacity[0], self.count
        # Grow geometrically, so resizing stays rare; shrink when far too big.
        slots = max(needed, 2 * current) if needed > current else min(current, 2 * needed)
        keep = min(length, self.capacity[1])
        mask = np.zeros((slots, length), bool)
        mask[:live, :keep] = self.mask[:live, :keep]
        lengths = np.zeros(slots, np.int64)
        lengths[:live] = self.lengths[:live]
        if self.k is not None or sample is not None:
            reference = self.k if self.k is not None else sample
            layers, _, heads, _, d_head = reference.shape
            k = np.zeros((layers, slots, heads, length, d_head), reference.dtype)
            v = np.zeros(k.shape, k.dtype)  # not zeros_like, which writes every page: calloc pages in lazily
            if self.k is not None and live:
                k[:, :live, :, :keep] = self.k[:, :live, :, :keep]
                v[:, :live, :, :keep] = self.v[:, :live, :, :keep]
            self.k, self.v = k, v
        self.mask, self.lengths = mask, lengths


def row_groups(counts: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Rows of sources in order, counts[i] rows for source i, seen as groups of G = max(counts):
    groups (N, G) the row at each position of a source's group (its last row again where it has
    fewer), row_position (R,) each row's position in the flattened (N·G) groups, and
    source_index (R,) each row's source. The decoder step attends to a source's keys once for
    its whole group (the beams of a source are one query block)."""
    width = int(counts.max(initial=1))
    offsets = np.cumsum(counts) - counts
    source_index = np.repeat(np.arange(len(counts)), counts)
    within = np.arange(len(source_index)) - offsets[source_index]
    groups = offsets[:, None] + np.minimum(np.arange(width)[None, :], counts[:, None] - 1)
    return groups.astype(np.int64), (source_index * width + within).astype(np.int64), source_index


def _round_up(value: int, chunk: int) -> int:
    return -(-value // chunk) * chunk


class Hypothesis(NamedTuple):
    """A finished translation of one source."""

    tokens: list[int]  # without start and eos
    # Confidence: the log-probability of every token the search chose for it (eos included when it ended
    # with one) divided by their number, i.e. the log of their geometric-mean probability; 0 is certain.
    score: float
    stopped: str  # "eos"; "length": the longest output allowed; "repetition": the runaway-output guard
    # Beam search's other finished hypotheses of the source, best first, each output once and none the
    # same as this one's (LibreTranslate's alternatives); greedy search has none.
    alternatives: tuple[Hypothesis, ...] = ()


# The runaway-output guard: an n-gram of up to REPEAT_NGRAM tokens repeated consecutively more than
# max_repeats times (after its first occurrence) ends its hypothesis, which keeps the first occurrence.
REPEAT_NGRAM = 4
MAX_REPEATS = 4  # the server's and translate-file's limit: "ha ha ha ha ha" passes, "ch" six times does not


def repeated_tail(tokens: Sequence[int], max_repeats: int) -> int:
    """How many tokens to drop from the end: when the tail repeats an n-gram (n ≤ REPEAT_NGRAM) more than
    max_repeats times in a row after its first occurrence, all its occurrences but the first; 0 otherwise."""
    for n in range(1, REPEAT_NGRAM + 1):
        span = n * (max_repeats + 2)
        if len(tokens) < span or tokens[-1] != tokens[-1 - n]:  # the cheap test first
            continue
        start = len(tokens) - span
        if all(tokens[i] == tokens[i - n] for i in range(start + n, len(tokens))):
            while start >= n and tokens[start - n : start] == tokens[start : start + n]:
                start -= n
            return len(tokens) - start - n
    return 0


class Search(Protocol):
    rows: int  # live rows this source occupies
    width: int  # the most rows it may occupy (the beam)
    top_k: int  # candidates per row it needs from a step
    max_length: int  # tokens it may produce, eos included

    def advance(
        self, top_log_probs: np.ndarray, top_ids: np.ndarray, eos_log_probs: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """This step's best candidates of its live rows, (rows, top_k) each, best first (equal ones lower
        token first, as ONNX TopK returns them), and each row's eos log-probability (rows,) -> (origin of
        each next row, its token); none when done."""

    def result(self) -> Hypothesis: ...


@dataclass
class GreedySearch:
    max_length: int  # tokens including eos
    eos_id: int
    max_repeats: int | None = None  # the runaway-output guard (None: off)
    tokens: list[int] = field(default_factory=list)
    rows: int = 1
    width: int = 1
    top_k: int = 1
    log_prob: float = 0.0  # of the tokens chosen so far
    stopped: str = ""
    scores = (0.0,)  # the row's score for the step graph's search head, which greedy does not read

    def advance(
        self, top_log_probs: np.ndarray, top_ids: np.ndarray, eos_log_probs: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        token = int(top_ids[0, 0])
        if self.take(token, float(top_log_probs[0, 0])):
            return _ROW_ZERO, top_ids[0, :1]
        return _NO_ROWS, _NO_ROWS

    def take(self, token: int, log_prob: float) -> bool:
        """The step's best token and its log-probability: whether the row goes on."""
        if token == self.eos_id or len(self.tokens) + 1 >= self.max_length:
            self.stopped = "eos" if token == self.eos_id else "length"
            if token == self.eos_id:
                self.log_prob += log_prob
            self.rows = 0
            return False
        self.tokens.append(token)
        self.log_prob += log_prob
        if self.max_repeats is not None and (drop := repeated_tail(self.tokens, self.max_repeats)):
            scored = len(self.tokens)
            del self.tokens[-drop:]
            self.log_prob *= len(self.tokens) / scored  # the kept tokens' share, at the same mean
            self.stopped, self.rows = "repetition", 0
            return False
        return True

    def result(self) -> Hypothesis:
        chosen = len(self.tokens) + (self.stopped == "eos")
        return Hypothesis(self.tokens, self.log_prob / max(chosen, 1), self.stopped)


_NO_ROWS = np.zeros(0, np.int64)
_ROW_ZERO = np.zeros(1, np.int64)


# GNMT's length penalty α for beam search; a checkpoint may name its own, tuned on validation data
# ("decoding": {"length_penalty": α} in config.json, carried into the export's manifest).
LENGTH_PENALTY = 0.6


def length_normalized(score: float, length: int, alpha: float) -> float:
    """GNMT length penalty: score / ((5 + length) / 6)^alpha."""
    return score / (((5.0 + length) / 6.0) ** alpha)


@dataclass
class BeamSearch:
    """Beam search for one source. It starts from one row; each step takes the 2·beam
    best extensions: those ending in eos within the top beam ranks are finished
    (scored with the GNMT length penalty), the best non-eos ones form the next
    beam. Done with ``beam`` finished hypotheses or at max_length.

    The 2·beam best extensions over all rows are among each row's own 2·beam best,
    which is all a step hands over. Ties go to the lower row, then the lower token.

    A step's few rows are kept in plain lists (a numpy call on four numbers costs more than the work): each
    step's rows as back-pointers to the step before, read back into a row's tokens only when it ends."""

    beam: int
    max_length: int
    eos_id: int
    alpha: float = LENGTH_PENALTY
    max_repeats: int | None = None  # the runaway-output guard (None: off)
    scores: list[float] = field(default_factory=lambda: [0.0])  # each live row's (float64, as the step's)
    # steps[t] = (origins, tokens): after step t, row i continues row origins[i] of the step before with tokens[i]
    steps: list[tuple[list[int], list[int]]] = field(default_factory=list)
    tails: list[tuple[int, ...]] = field(default_factory=lambda: [()])  # each row's last REPEAT_NGRAM tokens
    # (length-normalized score, hypothesis) of each finished hypothesis
    finished: list[tuple[float, Hypothesis]] = field(default_factory=list)
    rows: int = 1

    @property
    def width(self) -> int:
        return self.beam

    @property
    def top_k(self) -> int:
        return 2 * self.beam

    def output(self, row: int) -> list[int]:
        """A live row's tokens so far, read back through the steps."""
        tokens = []
        for origins, step_tokens in reversed(self.steps):
            tokens.append(step_tokens[row])
            row = origins[row]
        tokens.reverse()
        return tokens

    def advance(
        self, top_log_probs: np.ndarray, top_ids: np.ndarray, eos_log_probs: np.ndarray
    ) -> tuple[Sequence[int], Sequence[int]]:
        """From each row's best candidates: ranks them over the rows as the step graph's search head does
        (export/decoder_step.py), then ``advance_ranked``."""
        k = min(self.top_k, top_ids.shape[1])
        values = (np.asarray(self.scores)[:, None] + top_log_probs[:, :k]).reshape(-1)  # float64, as the scores
        # Best first, ties to the lower row, then the lower token: each row's candidates come best first with
        # ties to the lower token (ONNX TopK's order), so a stable sort of the rows in order keeps both.
        ranked = np.argsort(-values, kind="stable")[: 2 * self.beam]
        candidates = values[ranked], ranked // k, top_ids[:, :k].reshape(-1)[ranked]
        return self.advance_ranked(*(c.tolist() for c in candidates), eos_log_probs)

    def advance_ranked(
        self, values: Sequence[float], origins: Sequence[int], tokens: Sequence[int], eos_log_probs: np.ndarray
    ) -> tuple[Sequence[int], Sequence[int]]:
        """This step's best extensions over the live rows, best first (at least 2·beam: their scores, rows
        and tokens), and each row's eos log-probability -> (origin of each next row, its token); none when
        done. The 2·beam best are all a step needs: at most one per row ends in eos."""
        rows, length, beam = len(self.scores), len(self.steps) + 1, self.beam
        at_limit = length >= self.max_length
        if at_limit:  # the only way on is to end
            ends = np.asarray(self.scores) + eos_log_probs.reshape(rows)
            ranked = np.argsort(-ends, kind="stable")[: 2 * beam]
            values, origins, tokens = ends[ranked].tolist(), ranked.tolist(), [self.eos_id] * len(ranked)
        elif self.eos_id not in tokens[:beam] and not self._may_run_away(origins[:beam], tokens[:beam]):
            # The usual step: the best beam extensions go on, and nothing finishes.
            return self._go_on(origins[:beam], tokens[:beam], values[:beam])
        kept_origins, kept_tokens, kept_scores = [], [], []
        ranked_candidates = zip(origins[: 2 * beam], tokens[: 2 * beam], values[: 2 * beam], strict=True)
        for rank, (origin, token, value) in enumerate(ranked_candidates):
            if token == self.eos_id:
                if rank < beam:
                    stopped = "length" if at_limit else "eos"
                    hypothesis = Hypothesis(self.output(origin), value / length, stopped)
                    self.finished.append((length_normalized(value, length, self.alpha), hypothesis))
            elif self.max_repeats is not None and (kept := self._runaway(origin, token)) is not None:
                # It ends here, cut back to the repeated n-gram's first occurrence; at any rank, so that a
                # step whose candidates all run away still leaves a hypothesis.
                hypothesis = Hypothesis(kept, value / length, "repetition")
                self.finished.append((length_normalized(value, length, self.alpha), hypothesis))
            elif len(kept_origins) < beam:
                kept_origins.append(origin)
                kept_tokens.append(token)
                kept_scores.append(value)
            if len(self.finished) >= beam or (len(kept_origins) == beam and rank >= beam - 1):
                break
        if len(self.finished) >= beam or at_limit or not kept_origins:
            self.rows = 0
            return _NO_ROWS, _NO_ROWS
        return self._go_on(kept_origins, kept_tokens, kept_scores)

    def _go_on(
        self, origins: Sequence[int], tokens: Sequence[int], scores: Sequence[float]
    ) -> tuple[list[int], list[int]]:
        """The next rows: these extensions (rank order), placed by ``in_place_order``."""
        order = in_place_order(origins)
        origins, tokens = [origins[i] for i in order], [tokens[i] for i in order]
        self.scores = [scores[i] for i in order]
        if self.max_repeats is not None:
            self.tails = [(*self.tails[o], t)[-REPEAT_NGRAM:] for o, t in zip(origins, tokens, strict=True)]
        self.steps.append((origins, tokens))
        self.rows = len(origins)
        return origins, tokens

    def _may_run_away(self, origins: Sequence[int], tokens: Sequence[int]) -> bool:
        """Whether the guard must look closer at these extensions: one repeats a token of its row's last
        REPEAT_NGRAM (without which no n-gram of the tail can repeat)."""
        if self.max_repeats is None:
            return False
        return any(token in self.tails[origin] for origin, token in zip(origins, tokens, strict=True))

    def _runaway(self, origin: int, token: int) -> list[int] | None:
        """The row's tokens and this one cut back to the first occurrence of an n-gram they repeat too often
        (the guard), or None when they do not. Looks closer only when the token is among the row's last
        REPEAT_NGRAM, without which no n-gram of the tail can repeat."""
        if token not in self.tails[origin]:
            return None
        output = [*self.output(origin), token]
        drop = repeated_tail(output, self.max_repeats)
        return output[: len(output) - drop] if drop else None

    def result(self) -> Hypothesis:
        """The best finished hypothesis (the first of equals), the others as its alternatives."""
        best, *others = (hypothesis for _, hypothesis in sorted(self.finished, key=lambda f: -f[0]))  # stable
        distinct = {tuple(best.tokens): best}
        for hypothesis in others:  # the better of two equal outputs (the guard may cut two rows alike)
            distinct.setdefault(tuple(hypothesis.tokens), hypothesis)
        return best._replace(alternatives=tuple(distinct.values())[1:])


def gap_filling_order(kept: Sequence[int]) -> list[int]:
    """A new order for the sources that go on (``kept``: their positions, increasing), as indices into
    ``kept``: those that can keep their position do, and the places of those that left go to sources
    from the end, so a departure moves one source's keys and rows, not every source after it (sources
    of equal row counts, as in a greedy or a beam batch; any order is correct)."""
    count = len(kept)
    stay = [index for index, position in enumerate(kept) if position < count]
    movers = iter(range(len(stay), count))  # those past the new end, in order
    slots = dict(zip((kept[index] for index in stay), stay, strict=True))
    return [slots[slot] if slot in slots else next(movers) for slot in range(count)]


def in_place_order(origins: Sequence[int]) -> list[int]:
    """An order for the next rows (given their origins in rank order) in which each origin's first child
    takes the origin's own row, the others the rows left, in rank order: a row that stays in place is not
    copied in the cache (KVCache.select), and in rank order two in three would move (beam 4,
    test_2016_flickr: 43,299 row moves against 19,837)."""
    slots: list[int | None] = [None] * len(origins)
    others = []
    for index, origin in enumerate(origins):
        if origin < len(slots) and slots[origin] is None:
            slots[origin] = index
        else:
            others.append(index)
    rest = iter(others)
    return [next(rest) if slot is None else slot for slot in slots]


def new_search(
    beam: int, max_length: int, eos_id: int, alpha: float = LENGTH_PENALTY, max_repeats: int | None = None
) -> Search:
    """``max_repeats``: the runaway-output guard's limit (None: off, as the reference engines have none)."""
    if beam == 1:
        return GreedySearch(max_length, eos_id, max_repeats)
    return BeamSearch(beam, max_length, eos_id, alpha, max_repeats)


_batch_serials = itertools.count()
StepFn = Callable[["DecodeBatch"], tuple[np.ndarray, ...]]


class DecodeBatch:
    """The running decode batch: sources with their searches, and the rows of their hypotheses.

    ``step_fn(batch)`` computes one decoder step over ``batch.step_feeds()`` (see
    ``export/decoder_step.py`` for the names), writes each row's new self-attention
    entry into ``batch.cache`` in place, and returns (top_log_probs (R, K), top_ids
    (R, K), eos_log_probs (R, 1)). A source's rows are contiguous, in the order of
    ``searches``, which is also the order of its cross-attention keys/values in
    ``sources`` (kept once per source, so a request's beams share them: the step
    attends to them once for the source's group of rows, see ``row_groups``).
    ``place`` puts the cross-attention buffers where the step wants them (see
    ``SourceCache``); ``cache_type`` makes the self-attention cache (on a device: see
    ``runtime.sessions.DeviceKVCache``). ``version`` changes whenever a feed's shape or memory does,
    so a step can keep its bindings until then.
    """

    def __init__(
        self,
        step_fn: StepFn,
        layers: int,
        heads: int,
        d_cache: int,
        start_id: int,
        dtype=np.float32,
        place: Callable[[np.ndarray], Any] | None = None,
        cache_type: type[KVCache] | Callable[..., KVCache] = KVCache,
    ) -> None:
        self.step_fn = step_fn
        self.start_id = start_id
        self.cache = cache_type(layers, heads, d_cache, dtype)
        self.sources = SourceCache(place)
        self.searches: dict[Any, Search] = {}  # live sources, in row order
        self.tokens = np.zeros(0, np.int64)
        self.total_length = np.zeros((), np.int32)
        self.top_k = np.ones(1, np.int64)
        self.row_scores = np.zeros((0, 1))  # each row's running score (float64), for the step's search head
        self._count_list: list[int] = []  # each source's rows
        self._set_groups()
        self.step_state: dict[Any, Any] = {}  # what step_fn keeps with this batch (its bindings)
        self.narrow = False  # it shares the cores with other batches now: step_fn may run it on fewer threads
        self._version = 0
        self._serial = next(_batch_serials)

    @property
    def rows(self) -> int:
        return self.cache.rows

    def __len__(self) -> int:
        return len(self.searches)

    @property
    def cross_nbytes(self) -> int:
        return self.sources.nbytes

    @property
    def src_mask(self) -> np.ndarray:
        return self.sources.mask

    @property
    def version(self) -> tuple[int, int, int, int]:
        """Changes whenever a feed's shape or memory does (unique across batches, unlike id()); its last
        part alone flips while beam search alternates between the cache's two buffer sets."""
        return self._serial, self._version, *self.cache.layout

    def step_feeds(self) -> dict[str, Any]:
        """The decoder step's inputs by name; the cache views are bound as outputs too."""
        cross, src_mask = self.sources.step_inputs()
        layers = self.cache.layers
        feeds = {
            "tokens": self.tokens,
            "lengths": self.cache.live_lengths,
            "total_length": self.total_length,
            "groups": self.groups,
            "row_position": self.row_position,
            "src_mask": src_mask,
            "top_k": self.top_k,
            "row_scores": self.row_scores,
            "candidate_bias": self.candidate_bias,
        }
        feeds.update(zip(layer_names("past", layers), self.cache.views(), strict=True))
        feeds.update(zip(layer_names("cross", layers), cross, strict=True))
        return feeds

    def add(
        self, keys: Sequence[Any], searches: Sequence[Search], cross_k: Any, cross_v: Any, src_mask: np.ndarray
    ) -> None:
        """Join sources (encoded together: cross_k (L, n, H, S, d_k)), one row each with an empty cache."""
        self.sources.add(cross_k, cross_v, src_mask)
        for key, search in zip(keys, searches, strict=True):
            assert key not in self.searches and search.rows == 1, key
            self.searches[key] = search
        # Room for every beam and the longest output at once: the cache never grows (and copies) mid-decode
        # (growing it on beam search's first step cost 3% of batch-32 beam-4 time). Its buffers are zeroed
        # lazily by the OS, so rows and slots are paged in only as they are written.
        widest = sum(search.width for search in self.searches.values())
        self.cache.reserve(widest, max(search.max_length for search in searches))
        self.cache.add_rows(len(keys))
        self.tokens = np.concatenate([self.tokens, np.full(len(keys), self.start_id, np.int64)])
        self._changed()

    def step(self) -> list[tuple[Any, Hypothesis]]:
        """One decoder step for every row; returns the sources finished by it, with their hypotheses."""
        self.total_length[()] = self.cache.longest + 1
        outputs = self.step_fn(self)
        top_log_probs, top_ids, eos_log_probs = outputs[:3]
        self.cache.advance()
        if self.top_k[0] == 1:  # every source greedy: one row each
            return self._greedy_step(top_log_probs, top_ids)
        # Each source's candidates, ranked by the step (CANDIDATE_OUTPUTS), if it does: as lists, once.
        ranked = [output.tolist() for output in outputs[3:]]
        rows, tokens, kept, finished, offset = [], [], [], [], 0
        for position, (key, search) in enumerate(list(self.searches.items())):
            part = slice(offset, offset + search.rows)
            offset += search.rows
            if ranked and search.width > 1:
                values, origins, candidates = (output[position] for output in ranked)
                origins, next_tokens = search.advance_ranked(values, origins, candidates, eos_log_probs[part])
            else:
                origins, next_tokens = search.advance(top_log_probs[part], top_ids[part], eos_log_probs[part])
            if search.rows:
                rows.append([part.start + origin for origin in origins])
                tokens.append(next_tokens)
                kept.append(position)
            else:
                finished.append((key, search.result()))
                del self.searches[key]
        self._keep(rows, tokens, kept)
        return finished

    def _greedy_step(self, top_log_probs: np.ndarray, top_ids: np.ndarray) -> list[tuple[Any, Hypothesis]]:
        """Every source greedy, one row each: the order of rows is the order of sources."""
        finished, kept = [], []
        best, best_log_probs = top_ids[:, 0].tolist(), top_log_probs[:, 0].tolist()
        for row, (key, search) in enumerate(list(self.searches.items())):
            if search.take(best[row], best_log_probs[row]):
                kept.append(row)
            else:
                finished.append((key, search.result()))
                del self.searches[key]
        if len(kept) == self.rows:  # nothing changes shape: the next step reuses its binding
            if self.rows <= FEW_ROWS:
                tokens = memoryview(self.tokens)
                for row, token in enumerate(best):
                    tokens[row] = token
            else:
                self.tokens[:] = top_ids[:, 0]
        else:
            self._keep([np.array([row]) for row in kept], [top_ids[row, :1] for row in kept], kept)
        return finished

    def drain(self) -> dict[Any, Hypothesis]:
        """Step until every source is done (no more joining): each source's hypothesis, by key. The one
        fill-and-drain loop: offline decoding adds its sources and drains; the server steps itself, adding
        arrivals between steps."""
        results: dict[Any, Hypothesis] = {}
        while self.searches:
            results.update(self.step())
        return results

    def remove(self, key: Any) -> None:
        """Drop a source mid-way (its caller went away); its rows and cache go at once."""
        rows, kept, offset = [], [], 0
        for position, (k, search) in enumerate(self.searches.items()):
            if k != key:
                rows.append(np.arange(offset, offset + search.rows))
                kept.append(position)
            offset += search.rows
        del self.searches[key]
        self._keep(rows, [self.tokens[part] for part in rows], kept)

    def _select_rows(self, rows: np.ndarray) -> None:
        self.cache.select(rows)

    def _keep_sources(self, positions: np.ndarray) -> None:
        self.sources.keep(positions)

    def _keep(self, rows: list[Sequence[int]], tokens: list[Sequence[int]], sources: list[int]) -> None:
        """Go on with these sources (positions before the step, increasing; ``self.searches`` holds just
        them, in that order), each with its rows (by their index before the step) and their next tokens.
        When sources left, those from the end fill their places (``gap_filling_order``)."""
        if not self.searches:
            self.sources.clear()
            self.cache.clear()
            self._changed(np.zeros(0, np.int64))
            return
        if len(sources) != self.sources.count:
            order = gap_filling_order(sources)
            rows, tokens, sources = [rows[i] for i in order], [tokens[i] for i in order], [sources[i] for i in order]
            items = list(self.searches.items())
            self.searches = dict(items[i] for i in order)
            self._keep_sources(np.array(sources, np.int64))
        if self.rows <= FEW_ROWS and sum(map(len, rows)) <= FEW_ROWS:  # in Python: no numpy call (FEW_ROWS)
            kept_rows, next_tokens = list(itertools.chain(*rows)), list(itertools.chain(*tokens))
            if kept_rows != list(range(self.rows)):
                self._select_rows(kept_rows)
            self._changed(next_tokens)
            return
        kept_rows = np.fromiter(itertools.chain.from_iterable(rows), np.int64)
        if len(kept_rows) != self.rows or not np.array_equal(kept_rows, np.arange(self.rows)):
            self._select_rows(kept_rows)
        self._changed(np.fromiter(itertools.chain.from_iterable(tokens), np.int64))

    def _changed(self, tokens: Sequence[int] | None = None) -> None:
        """Rows or sources changed: feeds are rebound, and each row gets the candidates it needs; or, when
        every source kept its number of rows (beam search's usual step), only the tokens change, in place
        (through a memoryview for a few rows, see FEW_ROWS)."""
        searches = self.searches.values()
        counts = [search.rows for search in searches]
        beam_search = any(search.width > 1 for search in searches)  # greedy rows keep score 0
        scores = list(itertools.chain.from_iterable(search.scores for search in searches)) if beam_search else None
        if tokens is not None and len(tokens) == len(self.tokens) and counts == self._count_list:
            if len(tokens) <= FEW_ROWS:
                token_view = memoryview(self.tokens)
                for row, token in enumerate(tokens):
                    token_view[row] = token
                if scores is not None:
                    score_view = memoryview(self.row_scores)
                    for row, score in enumerate(scores):
                        score_view[row, 0] = score
            else:
                self.tokens[:] = tokens
                if scores is not None:
                    self.row_scores[:, 0] = scores
            return
        if tokens is not None:
            self.tokens = np.asarray(tokens, np.int64)
        self._count_list = counts
        self._set_groups()
        self.row_scores = (np.zeros(sum(counts)) if scores is None else np.array(scores, np.float64))[:, None].copy()
        self._version += 1

    def _set_groups(self) -> None:
        """The step's view of which rows are whose, how many candidates it keeps per row and per source, and
        which of them each source takes (``step_layout``)."""
        counts, wanted = tuple(self._count_list), tuple(search.top_k for search in self.searches.values())
        make = step_layout if sum(counts) <= FEW_ROWS else step_layout.__wrapped__  # kept only while small
        self.groups, self.row_position, self.source_index, self.candidate_bias, self.top_k[0] = make(counts, wanted)


@functools.lru_cache(maxsize=256)
def step_layout(counts: tuple[int, ...], wanted: tuple[int, ...]) -> tuple[np.ndarray, ...]:
    """For sources with ``counts`` rows each, taking ``wanted`` candidates each: ``row_groups``, then
    ``candidate_bias`` (N, G, K), 0 on each real row's candidates its source takes and -inf elsewhere, and
    ``top_k``, the most any source takes (K). Read-only, so that batches can bind the same arrays: those of up
    to FEW_ROWS rows are kept for the shapes that come back (every batch of one beam source, a greedy batch of
    n), where building them costs more than the step's other host work; the cache stays under a few MiB."""
    count_array, wanted_array = np.array(counts, np.int64), np.array(wanted, np.int64)
    groups, row_position, source_index = row_groups(count_array)
    k = int(wanted_array.max(initial=1))
    real_row = np.arange(groups.shape[1])[None, :, None] < count_array[:, None, None]
    under_limit = np.arange(k)[None, None, :] < wanted_array[:, None, None]
    candidate_bias = np.where(real_row & under_limit, 0.0, -np.inf)
    for array in (groups, row_position, source_index, candidate_bias):
        array.flags.writeable = False
    return groups, row_position, source_index, candidate_bias, k


def source_searches(
    sources: Sequence[Sequence[int]],
    beam: int,
    eos_id: int,
    max_output_tokens: int,
    alpha: float = LENGTH_PENALTY,
    max_repeats: int | None = None,
) -> list[Search]:
    """A search for each source, looking for at most ``default_max_output`` tokens."""
    lengths = (default_max_output(len(source) + 1, max_output_tokens) for source in sources)
    return [new_search(beam, length, eos_id, alpha, max_repeats) for length in lengths]


def translate_in_batches(
    tokenizer,
    texts: Sequence[str],
    translate_ids: Callable[[list[list[int]]], list[list[int]]],
    batch_size: int,
    workers: int = 1,
    by_length: bool = True,
) -> list[str]:
    """Tokenize, translate length-sorted batches (little padding), detokenize in the input order.
    ``workers`` > 1: that many batches at once, on threads (``translate_ids`` must allow it; ONNX Runtime
    releases the GIL while it runs). ``by_length=False``: batches of the texts in their own order (as a
    server sees its arrivals; benchmarks/service_overhead.py)."""
    ids = tokenizer.encode_source(texts)
    order = sorted(range(len(ids)), key=lambda i: len(ids[i])) if by_length else list(range(len(ids)))
    chunks = [order[start : start + batch_size] for start in range(0, len(order), batch_size)]
    translate = lambda chunk: translate_ids([ids[i] for i in chunk])  # noqa: E731
    if workers > 1:
        with concurrent.futures.ThreadPoolExecutor(workers) as pool:
            results = list(pool.map(translate, chunks))
    else:
        results = list(map(translate, chunks))
    outputs: list[list[int]] = [[] for _ in ids]
    for chunk, translated in zip(chunks, results, strict=True):
        for i, out in zip(chunk, translated, strict=True):
            outputs[i] = out
    return tokenizer.decode(outputs)
