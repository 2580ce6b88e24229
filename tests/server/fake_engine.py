"""The engine interface without a model, for scheduler tests that need no export.

A source "translates" to its ids reversed, one token per decoder step (confidence -0.1 per token) (a beam of b decodes
b rows); its memory is counted in fixed byte costs per token. An engine's replicas keep its records (steps, joins,
encoder calls), so a test reads every lane's on the engine it made.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field

from runtime.batch import Joined
from runtime.search import Hypothesis
from server.errors import ServiceError
from server.scheduling.jobs import DecodeOptions, Job, QueuedSentence
from server.sentences import SplitSentence

BYTES_PER_TOKEN = 1024


@dataclass
class _Source:
    reversed_ids: list[int]
    beam: int
    max_length: int
    output: list[int] = field(default_factory=list)


@dataclass
class _Encoded:
    sources: list[list[int]]
    seconds: float = 0.0


class FakeBatch:
    def __init__(self, engine: FakeEngine) -> None:
        self.engine = engine
        self.sources: dict[Hashable, _Source] = {}

    @property
    def rows(self) -> int:
        return sum(source.beam for source in self.sources.values())

    def __len__(self) -> int:
        return len(self.sources)

    @property
    def cache_bytes(self) -> int:
        return sum(s.beam * len(s.output) * BYTES_PER_TOKEN for s in self.sources.values())

    @property
    def cross_bytes(self) -> int:
        return sum((len(s.reversed_ids) + 1) * BYTES_PER_TOKEN for s in self.sources.values())

    def add(
        self, keys: Sequence[Hashable], encoded: _Encoded, beams: Sequence[int], max_lengths: Sequence[int]
    ) -> Joined:
        sources = encoded.sources
        for key, ids, beam, length in zip(keys, sources, beams, max_lengths, strict=True):
            assert key not in self.sources, key
            self.sources[key] = _Source(list(reversed(ids)), beam, length)
        self.engine.joins.append(list(keys))
        self.engine.joined_at_step.append(len(self.engine.steps))
        longest = max(len(ids) for ids in sources) + 1
        return Joined(0.001, longest * len(sources), sum(len(ids) + 1 for ids in sources))

    def step(self) -> list[tuple[Hashable, Hypothesis]]:
        self.engine.step(self.rows)
        finished = []
        for key, source in list(self.sources.items()):
            complete = len(source.output) == len(source.reversed_ids)
            if complete or len(source.output) + 1 >= source.max_length:
                stopped = "eos" if complete else "length"
                finished.append((key, Hypothesis(source.output, -0.1 * len(source.output), stopped)))
                del self.sources[key]
            else:
                source.output.append(source.reversed_ids[len(source.output)])
        return finished

    def remove(self, key: Hashable) -> None:
        del self.sources[key]


class FakeMemory:
    def sequence_bytes(self, source_tokens: int, target_tokens: int, beam: int) -> int:
        return (source_tokens + 1 + beam * target_tokens) * BYTES_PER_TOKEN

    def encoder_scores_bytes(self, sentences: int, longest: int) -> int:
        return sentences * (longest + 1) ** 2 * 4


class FakeEngine:
    name, version, provider, variant = "fake", "0", "cpu", "fp32"
    source_language, target_language = "en", "de"

    def __init__(self, step_seconds: float = 0.0, encode_seconds: float = 0.0) -> None:
        self.step_seconds, self.encode_seconds = step_seconds, encode_seconds
        self.encoded_on: list[tuple[str, int]] = []  # each encode call's thread, and the steps made before it
        self.joined_at_step: list[int] = []  # the steps made before each join
        self.encode_error: Exception | None = None  # raised by every encode call while set
        self.joins: list[list[Hashable]] = []  # keys joined together, in order
        self.steps: list[int] = []  # rows of each step
        self.memory = FakeMemory()

    def warmup(self) -> None:
        pass

    def tokenize(self, texts: list[str]) -> list[list[int]]:
        return [[len(word) + 3 for word in text.split()] for text in texts]

    def detokenize(self, ids: Sequence[Sequence[int]]) -> list[str]:
        return [" ".join(map(str, row)) for row in ids]

    @staticmethod
    def max_length(source_tokens: int, cap: int) -> int:
        return min(cap, 2 * source_tokens + 12)

    def encode(self, sources: Sequence[Sequence[int]]) -> _Encoded:
        self.encoded_on.append((threading.current_thread().name, len(self.steps)))
        time.sleep(self.encode_seconds)
        if self.encode_error is not None:
            raise self.encode_error
        return _Encoded([list(ids) for ids in sources])

    def new_batch(self) -> FakeBatch:
        return FakeBatch(self)

    def step(self, rows: int) -> None:
        """A step of a batch of ``rows`` rows on this engine."""
        time.sleep(self.step_seconds)
        self.steps.append(rows)


def fake_job(
    engine: FakeEngine,
    sentences: list[str],
    beam: int = 1,
    on_segment: Callable[[QueuedSentence], None] = lambda segment: None,
    on_done: Callable[[ServiceError | None], None] = lambda error: None,
) -> Job:
    """A job of one text per sentence, tokenized by ``engine``, of up to 16 output tokens each."""
    ids = engine.tokenize(sentences)
    specs = [SplitSentence(0, i, s, row) for i, (s, row) in enumerate(zip(sentences, ids, strict=True))]
    return Job(specs, DecodeOptions(beam, 16), on_segment=on_segment, on_done=on_done)
