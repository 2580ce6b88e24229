"""What the scheduler queues: a job (one RPC) of segments (its sentences), and how results reach the caller."""

from __future__ import annotations

import collections
import itertools
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from runtime.search import Hypothesis
from server.config import ServerConfig
from server.errors import InvalidRequest, ServiceError
from server.sentences import AfterSplit, SplitSentence

log = logging.getLogger(__name__)
BACKLOG_WINDOW_S = 10.0  # Retry-After: the queue over the source tokens finished in this window
_ids = itertools.count()


@dataclass(frozen=True)
class DecodeOptions:
    """How a request's sentences are decoded: built once by its front end (gRPC or HTTP, ``decode_options``) and
    carried unchanged to its job, the translation cache's key and the assembly of its answer."""

    beam: int
    max_output_tokens: int  # eos included
    alternatives: int = 0  # other translations wanted per text, from the beam's n-best (beam > alternatives)


def decode_options(
    config: ServerConfig, beam: int = 0, max_output_tokens: int = 0, alternatives: int = 0, prefix: str = ""
) -> DecodeOptions:
    """A request's options (0: the server's default), within the server's limits. Asking for N alternatives
    widens the beam to N + 1 (beam search's n-best are its finished hypotheses); ``prefix`` names the
    request's fields in errors ("options." in gRPC)."""
    if alternatives < 0:
        raise InvalidRequest(f"{prefix}alternatives={alternatives} must be 0 or more")
    beam = beam or config.default_beam_size
    if beam > config.max_beam_size:
        raise InvalidRequest(f"{prefix}beam_size={beam} is over the limit {config.max_beam_size} (max_beam_size)")
    if alternatives >= config.max_beam_size:
        raise InvalidRequest(
            f"{prefix}alternatives={alternatives} needs a beam of {alternatives + 1}, over the limit "
            f"{config.max_beam_size} (max_beam_size): ask for at most {config.max_beam_size - 1}"
        )
    max_output = max_output_tokens or config.max_output_tokens
    if max_output > config.max_output_tokens:
        raise InvalidRequest(
            f"{prefix}max_output_tokens={max_output} is over the limit {config.max_output_tokens} (max_output_tokens)"
        )
    return DecodeOptions(max(beam, alternatives + 1), max_output, alternatives)


@dataclass(eq=False)
class QueuedSentence(AfterSplit):
    """A sentence waiting for the engine, then decoding, in a job."""

    job: Job
    spec: SplitSentence
    max_length: int
    reserved_bytes: int = 0
    predicted_tokens: int = 0
    lane: int = 0  # continuous: the running batch's lane, by the size of the whole request
    enqueued_at: float = field(default_factory=time.monotonic)
    joined_at: float = 0.0  # when it joined a running batch (time.monotonic()), ...
    encoded_at: float = 0.0  # ... when its encoder call and join were done ...
    finished_at: float = 0.0  # ... and when its decoding ended
    result: Hypothesis | None = None  # once decoded
    kept: Any = None  # with spec.align: its source's keys and values from its encoder call (Encoded.source)


@dataclass(eq=False)
class Job:
    """One RPC: its segments, options, deadline and how to answer it.

    ``on_segment`` and ``on_done`` are called on the inference thread; they
    must only hand the result over (e.g. loop.call_soon_threadsafe).
    """

    specs: list[SplitSentence]
    options: DecodeOptions
    on_segment: Callable[[QueuedSentence], None]
    on_done: Callable[[ServiceError | None], None]
    deadline: float | None = None  # time.monotonic() value
    model: str = ""  # the name of the engine that translates it; "" is the scheduler's first (default) model
    id: int = field(default_factory=lambda: next(_ids))
    cancelled: bool = False
    segments: list[QueuedSentence] = field(default_factory=list)
    remaining: int = 0
    finished: bool = False

    def answer(self, segment: QueuedSentence) -> None:
        """One segment is done; the last one also answers the job."""
        if self.finished:
            return
        notify(self.on_segment, segment)
        self.remaining -= 1
        if self.remaining == 0:
            self.finished = True
            notify(self.on_done, None)

    def fail(self, error: ServiceError) -> None:
        if not self.finished:
            self.finished = True
            notify(self.on_done, error)


def notify(callback: Callable, value) -> None:
    """Hand a result to its caller; a caller that is gone (closed event loop) must not stop the inference thread."""
    try:
        callback(value)
    except RuntimeError:
        log.warning("a result could not be delivered: its caller is gone")


class Throughput:
    """Source tokens finished in the last BACKLOG_WINDOW_S: how long a queue takes to work off (Retry-After)."""

    def __init__(self) -> None:
        self.finished: collections.deque[tuple[float, int]] = collections.deque()  # (time.monotonic(), tokens)

    def add(self, tokens: int, now: float) -> None:
        self.finished.append((now, tokens))
        while self.finished and self.finished[0][0] < now - BACKLOG_WINDOW_S:
            self.finished.popleft()

    def seconds_for(self, tokens: int) -> float:
        window = list(self.finished)
        rate = sum(t for _, t in window) / BACKLOG_WINDOW_S if window else 0.0
        return max(0.1, tokens / max(rate, 1.0))
