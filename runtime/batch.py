"""The running batch: sources with their searches, the rows of their hypotheses, and each step's inputs.

Sources join (``add``) at any step with an empty self-attention cache and their own cross-attention
keys/values, and leave as soon as their search is done (or they are removed). Where their rows and keys live is
the batch's row layout (``RowLayout``): packed, with gaps filled as sources leave (runtime/compact_rows.py), or
in the fixed slots of a bucket (runtime/slotted_rows.py). Each ``step`` takes the layout's ``StepInputs`` value
(the step's feeds by contract name, runtime/contract.py), hands it to a step function
(``runtime.backend.OrtBackend.step``, or PyTorch's in model/translate.py), which keeps its own bindings and
never reads the batch, lets each source's search take its candidates, and tells the layout what moved.
``drain`` steps until the batch is empty: the one fill-and-drain loop, which offline decoding
(runtime/offline.py), warm-up and the PyTorch reference use; the server's lanes add arrivals between steps
instead.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol

import numpy as np

from runtime.greedy_rows import MANY_ROWS, GreedyRows
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

    def source(self, index: int) -> SourceStates:
        """Source ``index``'s keys and values alone, as float32 host copies (L, 1, H, S, d_k) of its S tokens (eos
        included): what the aligner reads for it (runtime/aligner.py) instead of encoding it again."""
        tokens = int(self.src_mask[index].sum())
        k, v = (host_float32(x)[:, index : index + 1, :, :tokens].copy() for x in (self.cross_k, self.cross_v))
        return SourceStates(k, v)


class SourceStates(NamedTuple):
    """One source's cross-attention keys and values from its encoder call, kept for its alignment."""

    cross_k: np.ndarray  # (L, 1, H, S, d_k), float32 on the host
    cross_v: np.ndarray


def host_float32(value: Any) -> np.ndarray:
    """An encoder output (numpy, or an ONNX Runtime OrtValue on any device) as a float32 host array."""
    return np.asarray(value if isinstance(value, np.ndarray) else value.numpy(), np.float32)


@dataclass(frozen=True)
class RowShape:
    """What each row of a model's batch holds: a key and a value of ``heads`` × ``d_cache`` per decoder layer
    and cached token, in ``dtype``; every row starts from ``start_id``."""

    layers: int
    heads: int
    d_cache: int
    start_id: int
    dtype: Any = np.float32


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
    and the feeds' key. ``feeds_key`` changes whenever a feed's shape or memory does, so a step may keep its
    bindings until then; its last part alone flips while beam search alternates between a device cache's two
    buffer sets. The feeds the batch updates between steps (tokens, lengths, scores) are updated in place."""

    feeds: dict[str, Any]
    rows: int
    batch: BatchKey
    feeds_key: tuple[int, ...]


# top_log_probs (R, K), top_ids (R, K), eos_log_probs (R, 1), then CANDIDATE_OUTPUTS (runtime/contract.py)
StepOutputs = Sequence[np.ndarray]
StepFn = Callable[[StepInputs], StepOutputs]
# Several greedy steps in one run (runtime/step_graphs.py): each row's next k tokens (R, k) and log-probabilities
KStepsFn = Callable[[StepInputs], tuple[np.ndarray, np.ndarray]]


class Placed(NamedTuple):
    """A live source where the layout keeps it: its key and search, its index in the step's per-source outputs
    (its position in a compact batch, its slot in a bucket) and its first row (its rows follow it)."""

    key: Hashable
    search: Search
    index: int
    first_row: int


class Advanced(NamedTuple):
    """A source that goes on after a step: where it was (``Placed``), how many rows it had, each new row's
    origin among them and its next token."""

    placed: Placed
    rows_before: int
    origins: Sequence[int]
    tokens: Sequence[int]


class RowLayout(Protocol):
    """Where a running batch keeps its sources' rows, caches and keys, and so what each step reads: the batch
    makes the searches and runs them, the layout places and moves what they decide."""

    rows: int  # hypotheses being decoded
    cache_bytes: int  # self-attention cache allocated now
    cross_bytes: int  # sources' keys and values held now

    def __len__(self) -> int: ...

    def placed(self) -> Sequence[Placed]:
        """The live sources, in the order of the step's per-source outputs (a layout may keep the list while no
        source joins, leaves or changes its number of rows)."""

    def greedy_only(self) -> bool:
        """Whether every row is a greedy source's, one a source (a row's index is its source's)."""

    def add(self, keys: Sequence[Hashable], searches: Sequence[Search], encoded: EncodedSources, overrun: int) -> None:
        """Place joining sources with their new searches, a row each with ``start_id``; ``overrun``: the cache
        slots a run of several steps writes past a source's longest output."""

    def step_inputs(self) -> StepInputs: ...

    def begin_step(self, steps: int) -> StepInputs:
        """The next run's inputs, its total length set (``steps``: the steps a greedy run may make)."""

    def advance(self, steps: int) -> None:
        """A run wrote ``steps`` entries into each live row's cache."""

    def after_beam_step(self, advanced: list[Advanced], finished: list[Placed]) -> None:
        """Move rows as the searches decided: ``advanced`` go on, ``finished`` leave."""

    def after_greedy_step(self, last: np.ndarray, best: list[list[int]] | None, finished: list[Placed]) -> None:
        """Greedy rows took their tokens (``last``: each row's latest; ``best``: each row's run, as lists, where
        the step had FEW_ROWS rows or fewer, else None); the ``finished`` leave."""

    def remove(self, key: Hashable) -> None: ...


class DecodeBatch:
    """The running decode batch (``server.interface.Batch``): sources with their searches, in a ``RowLayout``.

    ``step_fn(inputs)`` computes one decoder step over the ``StepInputs`` (runtime/contract.py has the names),
    writes each row's new self-attention entry into the cache in place, and returns ``StepOutputs``; when every
    source is greedy, ``k_steps_fn``, where there is one, makes ``steps_per_run`` steps (1 or more) in one run
    instead, over a graph without the search head. ``decoding`` makes each joining source's search.
    """

    def __init__(
        self,
        step_fn: StepFn,
        decoding: Decoding,
        layout: RowLayout,
        k_steps_fn: KStepsFn | None = None,
        steps_per_run: int = 1,
    ) -> None:
        self.step_fn, self.k_steps_fn = step_fn, k_steps_fn
        self.steps_per_run = steps_per_run if k_steps_fn is not None else 1
        self.decoding = decoding
        self.layout = layout
        self.greedy_rows = GreedyRows(decoding.eos_id, decoding.stop_rules)

    @property
    def rows(self) -> int:
        """Hypotheses being decoded (a source has one per beam)."""
        return self.layout.rows

    def __len__(self) -> int:
        return len(self.layout)

    @property
    def cache_bytes(self) -> int:
        """Self-attention cache allocated now (paged in as it is written)."""
        return self.layout.cache_bytes

    @property
    def cross_bytes(self) -> int:
        """Cross-attention keys/values held now."""
        return self.layout.cross_bytes

    def step_inputs(self) -> StepInputs:
        """The next step's inputs: the last step's value while the feeds keep their shapes and memory."""
        return self.layout.step_inputs()

    def add(
        self,
        keys: Sequence[Hashable],
        encoded: EncodedSources,
        beams: Sequence[int],
        max_lengths: Sequence[int],
    ) -> Joined:
        """Join sources encoded together, each with its beam size and longest output (tokens with eos), one row
        each with an empty cache; they decode from the next step on."""
        searches = [self.decoding.search(beam, max_length) for beam, max_length in zip(beams, max_lengths, strict=True)]
        self.layout.add(keys, searches, encoded, self.steps_per_run - 1)
        mask = encoded.src_mask
        return Joined(encoded.seconds, mask.size, int(mask.sum()))

    def step(self) -> list[tuple[Any, Hypothesis]]:
        """One decoder step for every row; returns the sources finished by it, with their hypotheses."""
        layout = self.layout
        inputs = layout.begin_step(self.steps_per_run)
        if self.k_steps_fn is not None and layout.greedy_only():  # every source greedy: their own graph's run
            tokens, log_probs = self.k_steps_fn(inputs)
            layout.advance(self.steps_per_run)
            return self._greedy_step(log_probs, tokens)
        outputs = self.step_fn(inputs)
        top_log_probs, top_ids = outputs[0], outputs[1]
        layout.advance(1)
        if layout.greedy_only():  # every source greedy: one row each (a device's eos output is never copied)
            return self._greedy_step(top_log_probs[:, :1], top_ids[:, :1])
        eos_log_probs = outputs[2]
        # Each source's candidates, ranked by the step (CANDIDATE_OUTPUTS), if it does: as lists, once.
        ranked = [output.tolist() for output in outputs[3:]]
        advanced, finished, results = [], [], []
        for placed in layout.placed():
            key, search, index, first = placed
            before = search.rows
            part = slice(first, first + before)
            if ranked and search.width > 1:  # a RankedSearch
                values, origins, candidates = (output[index] for output in ranked)
                origins, next_tokens = search.advance_ranked(values, origins, candidates, eos_log_probs[part])
            else:
                origins, next_tokens = search.advance(top_log_probs[part], top_ids[part], eos_log_probs[part])
            if search.rows:
                advanced.append(Advanced(placed, before, origins, next_tokens))
            else:
                finished.append(placed)
                results.append((key, search.result()))
        layout.after_beam_step(advanced, finished)
        return results

    def _greedy_step(self, top_log_probs: np.ndarray, top_ids: np.ndarray) -> list[tuple[Any, Hypothesis]]:
        """Every source greedy, one row each: each row's search takes the row's tokens, a column per step the run
        made (one, or a k-step run's), until it ends; a row that ended leaves, and what the run wrote for it after its
        end is never read. One step of MANY_ROWS rows or more is checked over numpy (``GreedyRows``)."""
        placed = self.layout.placed()  # each a OneRowSearch, its row its first
        best = None  # the layout reads it only for FEW_ROWS rows or fewer
        if top_ids.shape[1] == 1 and len(placed) >= MANY_ROWS:
            finished = self.greedy_rows.step(placed, top_ids, top_log_probs)
        else:
            finished, best, best_log_probs = [], top_ids.tolist(), top_log_probs.tolist()
            for source in placed:
                search, row = source.search, source.first_row
                if not all(map(search.take, best[row], best_log_probs[row])):
                    finished.append(source)
        self.layout.after_greedy_step(top_ids[:, -1], best, finished)
        return [(source.key, source.search.result()) for source in finished]

    def drain(self) -> dict[Any, Hypothesis]:
        """Step until every source is done (no more joining): each source's hypothesis, by key."""
        results: dict[Any, Hypothesis] = {}
        while len(self):
            results.update(self.step())
        return results

    def remove(self, key: Any) -> None:
        """Drop a source mid-way (its caller went away); its rows and cache go at once."""
        self.layout.remove(key)
