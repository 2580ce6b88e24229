"""A running batch's rows packed (``CompactRows``, ``--batch-layout compact``): a source's rows are contiguous, in
the order of its searches, which is also the order of its cross-attention keys/values (kept once per source,
so a request's beams share them: the step attends to them once for the source's group of rows, see
runtime/layout.py). Rows that leave are compacted away and sources from the end fill their places, so a step
reads just the live rows; the feeds are rebuilt when rows or sources change, and kept otherwise.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Hashable, Sequence
from typing import Any

import numpy as np

from runtime.batch import Advanced, BatchKey, EncodedSources, Placed, RowShape, StepInputs
from runtime.caches import FEW_ROWS, LISTED_ROWS, KVCache
from runtime.contract import layer_names
from runtime.layout import gap_filling_order, step_layout
from runtime.search import Search
from runtime.source_cache import SourceCache


class CompactRows:
    """The packed ``RowLayout`` of ``runtime.batch.DecodeBatch``: ``place`` puts the cross-attention buffers
    where the step wants them (see ``SourceCache``); ``cache_type`` makes the self-attention cache (on a device:
    ``runtime.device_cache.DeviceKVCache``)."""

    def __init__(
        self,
        shape: RowShape,
        place: Callable[[np.ndarray], Any] | None = None,
        cache_type: type[KVCache] | Callable[..., KVCache] = KVCache,
    ) -> None:
        self.start_id = shape.start_id
        self.cache = cache_type(shape.layers, shape.heads, shape.d_cache, shape.dtype)
        self.sources = SourceCache(place)
        self.searches: dict[Any, Search] = {}  # live sources, in row order
        self.tokens = np.zeros(0, np.int64)
        self.total_length = np.zeros((), np.int32)
        self.top_k = np.ones(1, np.int64)
        self.row_scores = np.zeros((0, 1))  # each row's running score (float64), for the step's search head
        self._count_list: list[int] = []  # each source's rows
        self._placed: list[Placed] | None = None  # placed(), kept while the sources and their rows do
        self._set_groups()
        self._key = BatchKey()
        self._inputs: StepInputs | None = None  # the last step's, kept while their layout holds
        self._version = 0

    @property
    def rows(self) -> int:
        return self.cache.rows

    def __len__(self) -> int:
        return len(self.searches)

    @property
    def cache_bytes(self) -> int:
        return self.cache.nbytes

    @property
    def cross_bytes(self) -> int:
        return self.sources.nbytes

    def placed(self) -> list[Placed]:
        if self._placed is None:  # made again once sources joined, left or changed their rows (``_changed``)
            searches, firsts = self.searches, itertools.accumulate(self._count_list, initial=0)
            self._placed = list(map(Placed, searches, searches.values(), range(len(searches)), firsts))
        return self._placed

    def greedy_only(self) -> bool:
        return self.top_k[0] == 1

    def step_inputs(self) -> StepInputs:
        key = (self._version, *self.cache.buffers_key)
        inputs = self._inputs
        if inputs is None or inputs.feeds_key != key:
            inputs = self._inputs = StepInputs(self._feeds(), self.rows, self._key, key)
        return inputs

    def begin_step(self, steps: int) -> StepInputs:
        self.total_length[()] = self.cache.longest + 1
        return self.step_inputs()

    def advance(self, steps: int) -> None:
        for _ in range(steps):
            self.cache.advance()

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

    def add(self, keys: Sequence[Hashable], searches: Sequence[Search], encoded: EncodedSources, overrun: int) -> None:
        self.sources.add(encoded.cross_k, encoded.cross_v, encoded.src_mask)
        for key, search in zip(keys, searches, strict=True):
            assert key not in self.searches, key
            self.searches[key] = search
        # Room for every beam and the longest output at once: the cache never grows (and copies) mid-decode
        # (growing it on beam search's first step cost 3% of batch-32 beam-4 time). Its buffers are zeroed
        # lazily by the OS, so rows and slots are paged in only as they are written.
        widest = sum(search.width for search in self.searches.values())
        self.cache.reserve(widest, max(search.max_length for search in searches) + overrun)
        self.cache.add_rows(len(keys))
        self.tokens = np.concatenate([self.tokens, np.full(len(keys), self.start_id, np.int64)])
        self._changed()

    def after_beam_step(self, advanced: list[Advanced], finished: list[Placed]) -> None:
        for placed in finished:
            del self.searches[placed.key]
        rows = [[placed.first_row + origin for origin in origins] for placed, _, origins, _ in advanced]
        self._keep(rows, [tokens for *_, tokens in advanced], [move.placed.index for move in advanced])

    def after_greedy_step(self, last: np.ndarray, best: list[list[int]] | None, finished: list[Placed]) -> None:
        if not finished:  # nothing changes shape: the next step reuses its binding
            if self.rows <= FEW_ROWS:
                tokens = memoryview(self.tokens)
                for row, taken in enumerate(best):
                    tokens[row] = taken[-1]
            else:
                self.tokens[:] = last
            return
        for placed in finished:
            del self.searches[placed.key]
        gone, tokens = {placed.index for placed in finished}, last.tolist()
        kept = [row for row in range(self.rows) if row not in gone]
        self._keep([[row] for row in kept], [[tokens[row]] for row in kept], kept)

    def remove(self, key: Hashable) -> None:
        rows, kept, offset = [], [], 0
        for position, (k, search) in enumerate(self.searches.items()):
            if k != key:
                rows.append(np.arange(offset, offset + search.rows))
                kept.append(position)
            offset += search.rows
        del self.searches[key]
        self._keep(rows, [self.tokens[part] for part in rows], kept)

    def _select_rows(self, rows: Sequence[int]) -> None:
        self.cache.select(rows)

    def _keep_sources(self, positions: list[int]) -> None:
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
            self._keep_sources(sources)
        if self.rows <= LISTED_ROWS and sum(map(len, rows)) <= LISTED_ROWS:  # over lists (LISTED_ROWS)
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
        self._count_list, self._placed = counts, None
        self._set_groups()
        self.row_scores = (np.zeros(sum(counts)) if scores is None else np.array(scores, np.float64))[:, None].copy()
        self._version += 1

    def _set_groups(self) -> None:
        """The step's view of which rows are whose, how many candidates it keeps per row and per source, and
        which of them each source takes (``step_layout``)."""
        counts, wanted = tuple(self._count_list), tuple(search.top_k for search in self.searches.values())
        rows, greedy = sum(counts), sum(wanted) == len(wanted) == sum(counts)  # greedy: one row, one candidate each
        make = step_layout if rows <= FEW_ROWS or greedy else step_layout.__wrapped__  # shapes that come back
        self.groups, self.row_position, self.source_index, self.candidate_bias, self.top_k[0] = make(counts, wanted)
