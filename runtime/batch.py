"""The running batch: sources with their searches, the rows of their hypotheses, and each step's inputs.

Sources join (``add``) at any step with an empty self-attention cache and their own cross-attention
keys/values, and leave as soon as their search is done (or they are removed). Each ``step`` builds one
``StepInputs`` value (the step's feeds by contract name, runtime/contract.py) and hands it to a step function
(``runtime.backend.OrtBackend.step``, or PyTorch's in model/translate.py), which keeps its own bindings and
never reads the batch. ``drain`` steps until the batch is empty: the one fill-and-drain loop, which offline
decoding (runtime/offline.py), warm-up and the PyTorch reference use; the server's lanes add arrivals between
steps instead.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from runtime.caches import FEW_ROWS, KVCache, SourceCache
from runtime.contract import layer_names
from runtime.layout import gap_filling_order, step_layout
from runtime.search import Decoding, Hypothesis, Search


def pad_sources(ids: Sequence[Sequence[int]], pad: int, eos: int) -> tuple[np.ndarray, np.ndarray]:
    """Source ids + eos, right-padded: tokens (B, S) int64 and mask (B, S) bool (True on real tokens)."""
    longest = max(len(row) for row in ids) + 1
    tokens = np.full((len(ids), longest), pad, dtype=np.int64)
    for i, row in enumerate(ids):
        tokens[i, : len(row) + 1] = [*row, eos]
    return tokens, tokens != pad


@dataclass(frozen=True)
class EncodedSources:
    """Encoder outputs waiting to join a batch (``server.interface.Encoded``): cross-attention keys and values
    (L, n, H, S, d_k), numpy or values on the step's device (None for a step that needs none), and the sources'
    mask (n, S)."""

    cross_k: Any
    cross_v: Any
    src_mask: np.ndarray
    seconds: float = 0.0  # what the encoder call took


@dataclass(frozen=True)
class Joined:
    """What joining sources to a batch cost: the encoder call and the padding of its batch."""

    seconds: float
    padded_tokens: int
    real_tokens: int


class BatchKey:
    """Which batch a step's inputs come from: a step function that keeps bindings for a batch holds them under
    its key, weakly (runtime/binding.py), so that they go with the batch."""

    __slots__ = ("__weakref__",)


class StepInputs(NamedTuple):
    """One decoder step's inputs, as a value: the feeds by contract name (the caches' views are bound as the
    step's outputs too, so that it writes each row's new entry in place), the rows, which batch they come from
    and their layout. ``layout`` changes whenever a feed's shape or memory does, so a step may keep its bindings
    until then; its last part alone flips while beam search alternates between a device cache's two buffer
    sets. The feeds the batch updates between steps (tokens, lengths, scores) are updated in place."""

    feeds: dict[str, Any]
    rows: int
    batch: BatchKey
    layout: tuple[int, ...]


# top_log_probs (R, K), top_ids (R, K), eos_log_probs (R, 1), then CANDIDATE_OUTPUTS (runtime/contract.py)
StepOutputs = Sequence[np.ndarray]
StepFn = Callable[[StepInputs], StepOutputs]
# Several greedy steps in one run (runtime/step_graphs.py): each row's next k tokens (R, k) and log-probabilities
ChunkFn = Callable[[StepInputs], tuple[np.ndarray, np.ndarray]]


class DecodeBatch:
    """The running decode batch: sources with their searches, and the rows of their hypotheses.

    ``step_fn(inputs)`` computes one decoder step over the ``StepInputs`` (runtime/contract.py has the names),
    writes each row's new self-attention entry into the cache in place, and returns ``StepOutputs``. A source's
    rows are contiguous, in the order of ``searches``, which is also the order of its cross-attention
    keys/values in ``sources`` (kept once per source, so a request's beams share them: the step attends to them
    once for the source's group of rows, see ``row_groups``). ``decoding`` makes each joining source's search;
    ``place`` puts the cross-attention buffers where the step wants them (see ``SourceCache``); ``cache_type``
    makes the self-attention cache (on a device: ``runtime.device_cache.DeviceKVCache``).
    """

    def __init__(
        self,
        step_fn: StepFn,
        layers: int,
        heads: int,
        d_cache: int,
        start_id: int,
        decoding: Decoding,
        dtype=np.float32,
        place: Callable[[np.ndarray], Any] | None = None,
        cache_type: type[KVCache] | Callable[..., KVCache] = KVCache,
        chunk_fn: ChunkFn | None = None,
        chunk: int = 1,
    ) -> None:
        self.step_fn, self.chunk_fn, self.chunk = step_fn, chunk_fn, chunk if chunk_fn is not None else 1
        self.start_id = start_id
        self.decoding = decoding
        self.cache = cache_type(layers, heads, d_cache, dtype)
        self.sources = SourceCache(place)
        self.searches: dict[Any, Search] = {}  # live sources, in row order
        self.tokens = np.zeros(0, np.int64)
        self.total_length = np.zeros((), np.int32)
        self.top_k = np.ones(1, np.int64)
        self.row_scores = np.zeros((0, 1))  # each row's running score (float64), for the step's search head
        self._count_list: list[int] = []  # each source's rows
        self._set_groups()
        self._key = BatchKey()
        self._inputs: StepInputs | None = None  # the last step's, kept while their layout holds
        self._version = 0

    @property
    def rows(self) -> int:
        """Hypotheses being decoded (a source has one per beam)."""
        return self.cache.rows

    def __len__(self) -> int:
        return len(self.searches)

    @property
    def cache_bytes(self) -> int:
        """Self-attention cache allocated now (paged in as it is written)."""
        return self.cache.nbytes

    @property
    def cross_bytes(self) -> int:
        """Cross-attention keys/values held now."""
        return self.sources.nbytes

    def step_inputs(self) -> StepInputs:
        """The next step's inputs: the last step's value while the feeds keep their shapes and memory."""
        layout = (self._version, *self.cache.layout)
        inputs = self._inputs
        if inputs is None or inputs.layout != layout:
            inputs = self._inputs = StepInputs(self._feeds(), self.rows, self._key, layout)
        return inputs

    def _feeds(self) -> dict[str, Any]:
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
        if cross:  # none when sources joined without keys/values (a step that reads none: model/translate.py)
            feeds.update(zip(layer_names("cross", layers), cross, strict=True))
        return feeds

    def add(
        self,
        keys: Sequence[Hashable],
        encoded: EncodedSources,
        beams: Sequence[int],
        max_lengths: Sequence[int],
    ) -> Joined:
        """Join sources encoded together, each with its beam size and longest output (tokens with eos), one row
        each with an empty cache; they decode from the next step on."""
        mask = encoded.src_mask
        self.sources.add(encoded.cross_k, encoded.cross_v, mask)
        for key, beam, max_length in zip(keys, beams, max_lengths, strict=True):
            assert key not in self.searches, key
            self.searches[key] = self.decoding.search(beam, max_length)
        # Room for every beam and the longest output at once: the cache never grows (and copies) mid-decode
        # (growing it on beam search's first step cost 3% of batch-32 beam-4 time). Its buffers are zeroed
        # lazily by the OS, so rows and slots are paged in only as they are written.
        widest = sum(search.width for search in self.searches.values())
        self.cache.reserve(widest, max(max_lengths) + self.chunk - 1)  # a chunk's rows write up to k past the end
        self.cache.add_rows(len(keys))
        self.tokens = np.concatenate([self.tokens, np.full(len(keys), self.start_id, np.int64)])
        self._changed()
        return Joined(encoded.seconds, mask.size, int(mask.sum()))

    def step(self) -> list[tuple[Any, Hypothesis]]:
        """One decoder step for every row; returns the sources finished by it, with their hypotheses."""
        self.total_length[()] = self.cache.longest + 1
        if self.chunk > 1 and self.top_k[0] == 1:  # every source greedy: k steps in one run
            return self._greedy_chunk()
        outputs = self.step_fn(self.step_inputs())
        top_log_probs, top_ids, eos_log_probs = outputs[:3]
        self.cache.advance()
        if self.top_k[0] == 1:  # every source greedy: one row each
            return self._greedy_step(top_log_probs[:, :1], top_ids[:, :1])
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
        """Every source greedy, one row each (the order of rows is the order of sources): each row's search
        takes the row's tokens, a column per step the run made (one, or a chunk's), until it ends; a row that
        ended leaves, and what the run wrote for it after its end is never read."""
        finished, kept = [], []
        best, best_log_probs = top_ids.tolist(), top_log_probs.tolist()
        for row, (key, search) in enumerate(list(self.searches.items())):
            if all(map(search.take, best[row], best_log_probs[row])):
                kept.append(row)
            else:
                finished.append((key, search.result()))
                del self.searches[key]
        if len(kept) == self.rows:  # nothing changes shape: the next step reuses its binding
            if self.rows <= FEW_ROWS:
                tokens = memoryview(self.tokens)
                for row, taken in enumerate(best):
                    tokens[row] = taken[-1]
            else:
                self.tokens[:] = top_ids[:, -1]
        else:
            self._keep([np.array([row]) for row in kept], [top_ids[row, -1:] for row in kept], kept)
        return finished

    def _greedy_chunk(self) -> list[tuple[Any, Hypothesis]]:
        """``chunk`` greedy steps of every row in one run (runtime/step_graphs.py)."""
        tokens, log_probs = self.chunk_fn(self.step_inputs())
        for _ in range(self.chunk):
            self.cache.advance()
        return self._greedy_step(log_probs, tokens)

    def drain(self) -> dict[Any, Hypothesis]:
        """Step until every source is done (no more joining): each source's hypothesis, by key."""
        results: dict[Any, Hypothesis] = {}
        while len(self):
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
        if not self.searches:  # empty: it holds no buffers, nor do its last inputs and bindings (a new key)
            self.sources.clear()
            self.cache.clear()
            self._inputs, self._key = None, BatchKey()
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
