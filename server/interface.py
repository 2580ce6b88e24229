"""What the scheduler needs from an inference engine, and nothing else (no ONNX Runtime here).

In the style of TGI's ``Model.generate_token(batch)``: the scheduler creates a running batch, has an engine
encode sources (on any thread, while the batch steps) and adds them to it, steps it, getting back the sources
that step finished, and removes sources whose callers went away. A batch steps on the engine that made it: a
model's lanes all hold its one engine, whose sessions take concurrent runs. Caches, sessions and searches stay
inside the engine (``runtime.engine``; ``tests/server/fake_engine.py`` is a model-free one).
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import Any, Protocol

import numpy as np

from runtime.search import Hypothesis


class Joined(Protocol):
    """What joining sources to a batch cost: the encoder call and the padding of its batch."""

    seconds: float
    padded_tokens: int
    real_tokens: int


class Encoded(Protocol):
    """Sources an engine encoded, not yet in a batch (the engine's own type; the scheduler only passes it on)."""

    seconds: float  # what the encoder call took

    def source(self, index: int) -> Any:
        """Source ``index``'s own encoder output, kept for its alignment (``Engine.align``'s ``kept``)."""


class Memory(Protocol):
    """What sentences hold while they decode (the memory budget's sizes, server/scheduling/budget.py)."""

    def sequence_bytes(self, source_tokens: int, target_tokens: int, beam: int) -> int:
        """Memory one source holds while decoding with ``beam`` rows at ``target_tokens`` steps."""

    def encoder_scores_bytes(self, sentences: int, longest: int) -> int:
        """Peak attention-score bytes of encoding ``sentences`` sources of up to ``longest`` tokens."""


class Batch(Protocol):
    rows: int  # hypotheses being decoded (a source has one per beam)
    cache_bytes: int  # self-attention cache held now
    cross_bytes: int  # cross-attention keys/values held now

    def __len__(self) -> int: ...

    def add(
        self, keys: Sequence[Hashable], encoded: Encoded, beams: Sequence[int], max_lengths: Sequence[int]
    ) -> Joined:
        """Add sources an engine of the model encoded (``Engine.encode``), each with its beam size and longest
        output (tokens with eos); they decode from the next step on. ``Joined.seconds`` is the encoder call's."""

    def step(self) -> list[tuple[Hashable, Hypothesis]]:
        """One decoder step of every row; the sources it finished, with their hypotheses (output ids without
        eos, confidence, why they stopped)."""

    def remove(self, key: Hashable) -> None:
        """Drop a source mid-way; its rows and caches go at once."""


class Engine(Protocol):
    name: str
    version: str
    provider: str
    variant: str
    source_language: str
    target_language: str

    memory: Memory

    def warmup(self) -> None: ...

    def tokenize(self, texts: list[str]) -> list[list[int]]: ...

    def detokenize(self, ids: Sequence[Sequence[int]]) -> list[str]: ...

    def source_pieces(self, ids: Sequence[int]) -> list[str]:
        """The tokenizer's pieces of source ids ("▁" starts a word)."""

    def target_pieces(self, ids: Sequence[int]) -> list[str]: ...

    def align(self, pairs: Sequence[tuple[Sequence[int], Sequence[int]]], kept: Sequence[Any] = ()) -> list[np.ndarray]:
        """For each (source ids, output ids): the attention (len(output), len(source)) each output token
        paid to each source token, to place markup; runs on the caller's thread. ``kept``: per pair, its source's
        encoder output from its decoding (``Encoded.source``) or None (encoded again)."""

    def max_length(self, source_tokens: int, cap: int) -> int:
        """Longest output searched for a source (tokens with eos)."""

    def encode(self, sources: Sequence[Sequence[int]]) -> Encoded:
        """Encode sources together, on this engine's sessions, for a later ``Batch.add``; safe on another
        thread while a batch steps."""

    def new_batch(self) -> Batch: ...
