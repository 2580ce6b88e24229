"""Decoding algorithms over an abstract decoder, in numpy only.

PyTorch (``model.translate``), ONNX Runtime (``export.runtime``) and the server
all decode through this module, so the search itself is written once and the
backends differ only in how one decoder step is computed.

A backend provides a ``DecoderState``: ``step(tokens)`` runs one decoder step
for every live row and returns log-probabilities, ``select(rows)`` keeps (and
reorders) rows, which is how beams are re-ranked and finished rows leave.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

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


class DecoderState(Protocol):
    def step(self, tokens: np.ndarray) -> np.ndarray:
        """Feed one token per live row (R,); returns log-probabilities (R, V)."""

    def select(self, rows: np.ndarray) -> None:
        """Keep only these rows, in this order (indices may repeat)."""


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
        return cls(
            np.zeros(shape, dtype), np.zeros(shape, dtype), np.zeros((rows, 0), bool), np.zeros(rows, np.int64), chunk
        )

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
        """Keep these rows; the capacity shrinks to what the longest kept row needs."""
        self.lengths = self.lengths[rows]
        longest = int(self.lengths.max(initial=0))
        capacity = min(self.capacity, -(-longest // self.chunk) * self.chunk)
        self.k = np.ascontiguousarray(self.k[:, rows, :, :capacity])
        self.v = np.ascontiguousarray(self.v[:, rows, :, :capacity])
        self.mask = np.ascontiguousarray(self.mask[rows, :capacity])

    def extend(self, other: KVCache) -> None:
        """Append other's rows (e.g. new arrivals with empty caches) after this cache's rows."""
        capacity = max(self.capacity, other.capacity)
        for cache in (self, other):
            if cache.capacity < capacity:
                cache._grow(capacity)
        self.k = np.concatenate([self.k, other.k], axis=1)
        self.v = np.concatenate([self.v, other.v], axis=1)
        self.mask = np.concatenate([self.mask, other.mask], axis=0)
        self.lengths = np.concatenate([self.lengths, other.lengths])


StepFn = Callable[[dict[str, np.ndarray]], tuple[np.ndarray, np.ndarray, np.ndarray]]


@dataclass
class CachedDecoderState:
    """A DecoderState over any backend that computes one step from numpy inputs.

    ``step_fn`` takes the decoder-step inputs by name (tokens, positions,
    past_k, past_v, cache_mask, cross_k, cross_v, src_mask, source_index) and
    returns (log_probs, new_k, new_v). Cross-attention keys/values are stored
    once per source; rows point at their source through source_index.
    """

    step_fn: StepFn
    cross_k: np.ndarray  # (L, N, H, S, d_k)
    cross_v: np.ndarray
    src_mask: np.ndarray  # (N, S)
    source_index: np.ndarray  # (R,)
    cache: KVCache
    steps: int = field(default=0)

    def step(self, tokens: np.ndarray) -> np.ndarray:
        inputs = {
            "tokens": tokens.astype(np.int64),
            "positions": self.cache.lengths.copy(),
            "past_k": self.cache.k,
            "past_v": self.cache.v,
            "cache_mask": self.cache.mask,
            "cross_k": self.cross_k,
            "cross_v": self.cross_v,
            "src_mask": self.src_mask,
            "source_index": self.source_index.astype(np.int64),
        }
        log_probs, new_k, new_v = self.step_fn(inputs)
        self.cache.append(new_k, new_v)
        self.steps += 1
        return log_probs

    def select(self, rows: np.ndarray) -> None:
        self.source_index = self.source_index[rows]
        self.cache.select(rows)


def greedy_search(state: DecoderState, max_lengths: Sequence[int], start_id: int, eos_id: int) -> list[list[int]]:
    """Greedy decoding of one row per source; a row leaves the batch when it emits eos
    or reaches its max length. Returns token ids without the start and eos tokens."""
    n = len(max_lengths)
    outputs: list[list[int]] = [[] for _ in range(n)]
    live = np.arange(n)
    tokens = np.full(n, start_id, dtype=np.int64)
    limits = np.asarray(max_lengths)
    step = 0
    while len(live):
        log_probs = state.step(tokens)
        step += 1
        tokens = np.where(limits[live] <= step, eos_id, log_probs.argmax(-1))  # at its limit a row must end
        for row, source in enumerate(live):
            if tokens[row] != eos_id:
                outputs[source].append(int(tokens[row]))
        keep = tokens != eos_id
        if not keep.all():
            rows = np.flatnonzero(keep)
            state.select(rows)
            live, tokens = live[rows], tokens[rows]
    return outputs


def length_normalized(score: float, length: int, alpha: float) -> float:
    """GNMT length penalty: score / ((5 + length) / 6)^alpha."""
    return score / (((5.0 + length) / 6.0) ** alpha)


@dataclass
class _Hypotheses:
    """The finished hypotheses of one source."""

    beam: int
    alpha: float
    done: list[tuple[float, list[int]]] = field(default_factory=list)

    def add(self, score: float, tokens: list[int]) -> None:
        self.done.append((length_normalized(score, len(tokens) + 1, self.alpha), tokens))

    @property
    def complete(self) -> bool:
        return len(self.done) >= self.beam

    def best(self) -> list[int]:
        return max(self.done, key=lambda d: d[0])[1]


def beam_search(
    state: DecoderState,
    max_lengths: Sequence[int],
    beam: int,
    start_id: int,
    eos_id: int,
    alpha: float = 0.6,
) -> list[list[int]]:
    """Beam search, ``beam`` rows per source, laid out source-major (the state
    must start with n·beam rows whose row r belongs to source r // beam).

    Each step takes the 2·beam best extensions per source: those ending in eos
    within the top beam ranks are finished (scored with the GNMT length
    penalty), the best non-eos ones form the next beam. A source is done when
    it has ``beam`` finished hypotheses; the best by normalized score wins.
    """
    n = len(max_lengths)
    hyps = [_Hypotheses(beam, alpha) for _ in range(n)]
    live = np.arange(n)  # sources still searching
    scores = np.full((n, beam), NEG_INF, dtype=np.float64)
    scores[:, 0] = 0.0  # all beams start identical: expand only the first
    history = np.zeros((n, beam, 0), dtype=np.int64)
    tokens = np.full(n * beam, start_id, dtype=np.int64)
    limits = np.asarray(max_lengths)
    step = 0
    while len(live):
        log_probs = state.step(tokens)
        vocab = log_probs.shape[-1]
        step += 1
        candidates = scores[:, :, None] + log_probs.reshape(len(live), beam, vocab)
        at_limit = limits[live] <= step
        candidates[at_limit, :, :eos_id] = NEG_INF  # a source at its limit may only finish
        candidates[at_limit, :, eos_id + 1 :] = NEG_INF
        flat = candidates.reshape(len(live), beam * vocab)
        top = np.argsort(-flat, axis=1, kind="stable")[:, : 2 * beam]
        next_scores = np.full((len(live), beam), NEG_INF)
        next_origin = np.zeros((len(live), beam), dtype=np.int64)
        next_tokens = np.full((len(live), beam), eos_id, dtype=np.int64)
        for i, source in enumerate(live):
            kept = 0
            for rank, index in enumerate(top[i]):
                origin, token = divmod(int(index), vocab)
                score = flat[i, index]
                if score <= NEG_INF / 2:
                    break
                if token == eos_id:
                    if rank < beam:
                        hyps[source].add(float(score), history[i, origin].tolist())
                elif kept < beam:
                    next_scores[i, kept], next_origin[i, kept], next_tokens[i, kept] = score, origin, token
                    kept += 1
                if hyps[source].complete or kept == beam and rank >= beam - 1:
                    break
        still = np.array([not hyps[s].complete for s in live], dtype=bool) & ~at_limit
        rows = (np.flatnonzero(still)[:, None] * beam + next_origin[still]).reshape(-1)
        history = np.concatenate([history[np.arange(len(live))[:, None], next_origin], next_tokens[:, :, None]], 2)
        live, scores, history, tokens = live[still], next_scores[still], history[still], next_tokens[still].reshape(-1)
        if len(live):
            state.select(rows)
    return [h.best() for h in hyps]


def search(
    state: DecoderState, sources: Sequence[Sequence[int]], beam: int, start_id: int, eos_id: int, max_output_tokens: int
) -> list[list[int]]:
    """Greedy (beam 1) or beam search over a state started for these sources."""
    limits = [default_max_output(len(s) + 1, max_output_tokens) for s in sources]
    if beam == 1:
        return greedy_search(state, limits, start_id, eos_id)
    return beam_search(state, limits, beam, start_id, eos_id)


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
