"""One record per request, for both front ends: its request ID, what it asked, how it ended.

A caller's ``x-request-id`` (gRPC metadata, HTTP header) names its request; without one (or with one
that is not a short printable token) the server makes one. The ID goes back to the caller (gRPC trailing
metadata, HTTP response header) and into the request's access-log line: one JSON object per request on
the ``server.operations.access`` logger, with method, model, texts, tokens, queue wait, total time and status, and
the texts themselves only with ``access_log_texts``. Finishing a record also counts the request in
``translate_requests_total``.

The server (``python -m server``) writes these lines in batches (``BatchedLines``), as nginx's buffered
``access_log`` does: a line waits at most ACCESS_FLUSH_S, so that a request does not cost a write system call and
a wake-up of whatever reads the log (under 16 clients of single sentences the line cost 8-15% of the server's CPU
per request, most of it the write).
"""

from __future__ import annotations

import json
import logging
import os
import random
import re
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from opentelemetry import trace

from server.interface import Engine
from server.operations.metrics import Metrics
from server.operations.tracing import record_sentences

if TYPE_CHECKING:
    from server.answers import DecodedSentence

REQUEST_ID_HEADER = "x-request-id"
PREVIOUS_ATTEMPTS = "grpc-previous-rpc-attempts"  # what a retrying gRPC client sends with each retry
ATTEMPT_HEADER = "x-attempt"  # the attempt that answered, in trailing metadata when it was a retry
VALID_REQUEST_ID = re.compile(r"[\x21-\x7e]{1,128}")  # printable ASCII, no spaces: safe in logs and headers
log = logging.getLogger("server.operations.access")
ACCESS_FLUSH_S = 0.5  # the longest an access line waits before it is written
ACCESS_FLUSH_LINES = 256  # a batch this long is written at once
# New request IDs drawn from the system at once, this many in one 4 KiB read of os.urandom (10 µs). os.urandom lets go
# of the interpreter lock, so a uuid4 per request handed it to a waiting thread and back. With a uuid4 each and the
# full log records (server/__main__.py), 4.1-4.5 context switches and 0.68-0.74 ms of server CPU per HTTP JSON
# request; with neither, 3.0-3.4 and 0.61-0.67 (null engine, benchmarks/front_door.py, 2-core Intel Xeon, 6 rounds
# alternating).
FRESH_IDS = 256
_fresh_ids: list[str] = []


def request_id(given: str | None) -> str:
    """The caller's request ID when it is a valid one, else a new one: 32 hex digits of the system's randomness
    (os.urandom, as a uuid4 draws its bits), so that one request's ID tells nothing of another's."""
    if given and VALID_REQUEST_ID.fullmatch(given):
        return given
    try:
        return _fresh_ids.pop()  # list.pop is atomic: safe from any thread
    except IndexError:
        block = os.urandom(16 * FRESH_IDS).hex()
        _fresh_ids.extend(block[i : i + 32] for i in range(0, len(block), 32))
        return _fresh_ids.pop()


@dataclass
class Exchange:
    method: str  # the gRPC method, or "HTTP /path"
    request_id: str
    started: float = field(default_factory=time.monotonic)
    engine: Engine | None = None  # the model that translates it, once known
    caller: str = ""  # the name of its API key (never the key), or "anonymous", where keys are on
    texts: list[str] = field(default_factory=list)
    input_tokens: int = 0
    output_tokens: int = 0
    queue_seconds: float = 0.0  # the longest any of its sentences waited before decoding
    previous_attempts: int = 0  # the caller's gRPC retried it this many times before (at some replica)
    span: trace.Span = trace.INVALID_SPAN  # its trace span (server.operations.tracing), when traces are on
    finished: bool = False

    def record(self, sentences: Sequence[DecodedSentence]) -> None:
        """Its sentences: their tokens, the longest queue wait, and each one's spans under its own."""
        record_sentences(self.span, ((i, s.timings) for i, s in enumerate(sentences) if s.timings))
        self.input_tokens = sum(s.source_tokens for s in sentences)
        self.output_tokens = sum(len(s.output) for s in sentences)
        self.queue_seconds = max((s.queue_seconds for s in sentences), default=0.0)


class AccessLog:
    def __init__(self, metrics: Metrics, enabled: bool = True, with_texts: bool = False, sample: float = 1.0) -> None:
        self.metrics = metrics
        self.enabled = enabled
        self.with_texts = with_texts
        self.sample = sample  # the share of OK requests logged; every error is

    def finish(self, exchange: Exchange, code: str) -> None:
        """Count the request and write its line (once, whatever path it ends on)."""
        if exchange.finished:
            return
        exchange.finished = True
        exchange.span.set_attribute("rpc.status", code)
        exchange.span.end()
        engine = exchange.engine
        self.metrics.requests.labels(exchange.method, code, engine.name if engine else "").inc()
        if not self.enabled or (code == "OK" and self.sample < 1.0 and random.random() >= self.sample):
            return
        record = {
            "request_id": exchange.request_id,
            "method": exchange.method,
            "model": f"{engine.name}@{engine.version}" if engine else "",
            "status": code,
            "texts": len(exchange.texts),
            "input_tokens": exchange.input_tokens,
            "output_tokens": exchange.output_tokens,
            "queue_wait_s": round(exchange.queue_seconds, 6),
            "total_s": round(time.monotonic() - exchange.started, 6),
            "attempt": exchange.previous_attempts + 1,
        }
        if exchange.caller:
            record["caller"] = exchange.caller
        if self.with_texts:
            record["text"] = exchange.texts
        log.info(json.dumps(record, ensure_ascii=False))


class BatchedLines(logging.Handler):
    """Formatted records written to ``stream`` in batches: a line waits at most ``seconds`` (a writer thread
    flushes), ``lines`` of them go out at once, and a record of WARNING or worse goes out at once with those before
    it. Closing (``logging.shutdown`` at exit) writes what is left."""

    def __init__(self, stream, seconds: float = ACCESS_FLUSH_S, lines: int = ACCESS_FLUSH_LINES) -> None:
        super().__init__()
        self.stream, self.seconds, self.lines = stream, seconds, lines
        self.pending: list[str] = []
        self.stopped = threading.Event()
        threading.Thread(target=self._flush_every, name="access-log", daemon=True).start()

    def emit(self, record: logging.LogRecord) -> None:  # under the handler's lock (Handler.handle)
        try:
            self.pending.append(self.format(record) + "\n")
            if record.levelno >= logging.WARNING or len(self.pending) >= self.lines:
                self._write()
        except Exception:
            self.handleError(record)

    def _write(self) -> None:
        if self.pending:
            text = "".join(self.pending)
            self.pending.clear()
            self.stream.write(text)
            self.stream.flush()

    def flush(self) -> None:
        with self.lock:
            self._write()

    def _flush_every(self) -> None:
        while not self.stopped.wait(self.seconds):
            self.flush()

    def close(self) -> None:
        self.stopped.set()
        self.flush()
        super().close()


def batch_access_lines(stream, formatter: logging.Formatter | None) -> BatchedLines:
    """Write the access log's lines to ``stream`` in batches (``BatchedLines``) with ``formatter``, instead of
    through the root logger's handlers; once per process."""
    if (made := next((h for h in log.handlers if isinstance(h, BatchedLines)), None)) is not None:
        return made
    handler = BatchedLines(stream)
    handler.setFormatter(formatter)
    log.addHandler(handler)
    log.propagate = False
    return handler
