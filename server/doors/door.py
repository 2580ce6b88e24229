"""The front door: what both front ends hold at once, bounded before any of a request's work is done.

A request is held from the moment its size is known (an HTTP Content-Length, before the body is read; a gRPC
message's texts, as gRPC has parsed it) until it is answered: parsed, segmented, queued, decoded and its markup
put back. Two kinds share the door, as two lanes share the scheduler: short requests (a sentence or a few, up to
``SHORT_REQUEST_CHARS``), bounded by their number, and long ones (documents), bounded by their characters. Over
either bound a request is refused at once (``Overloaded``: 429 with Retry-After, RESOURCE_EXHAUSTED), before its
body is parsed, so a flood of documents is refused in milliseconds instead of queueing unseen behind the parsing
of those before it, and it never takes the short requests' room. Each kind's backlog is a gauge
(``translate_door_requests``, ``translate_door_chars``).

The event loop that answers both front ends is a resource of its own: when requests arrive faster than it can
answer them, they wait in its ready queue, unseen by any count above. So the door also watches the loop's lag (how
late a timer fires, smoothed) and, while it holds SHED_FLOOR requests or more, refuses a share of new requests
while the lag is over ``max_loop_lag_s``: none at the bound, all at twice it, as toobusy-js sheds a Node server's
load. A refusal costs the loop about a tenth of an answer, so the backlog drains and health checks, metrics and the
requests let in keep being answered.
"""

from __future__ import annotations

import asyncio
import functools
import random
import threading
import time
from collections import deque
from dataclasses import dataclass

from server.errors import Overloaded
from server.operations.metrics import Metrics

# A request of at most this many characters, all its texts together, is short: a few sentences (test_2016_flickr's
# longest is 200 characters) whose CPU work in the front end is smaller than a hop to a worker thread would cost.
SHORT_REQUEST_CHARS = 2_000
SHORT, LONG = "short", "long"
RETRY_AFTER_S = (1.0, 60.0)  # the bounds of a refusal's Retry-After
RATE_WINDOW = 16  # long requests whose departures give the door's recent rate, for Retry-After
# How often the loop's lag is sampled: a timer every 20 ms cost single sentences under 32 gRPC clients 4-6% of their
# requests/s on a 2-core AMD EPYC (each wake-up takes the GIL from the lanes), every 100 ms none measurable; a
# sustained lag still shows within a few samples (toobusy-js samples every 500 ms).
LAG_INTERVAL_S = 0.1
LAG_SMOOTHING = 1 / 3  # each sample's weight in the smoothed lag (toobusy-js' default)
# A lagging loop holding fewer requests than this is busy, not flooded, and sheds nothing: 32 closed-loop HTTP
# clients of single sentences (at most 32 held) ran the loop 58 ms late on a 2-core AMD EPYC, where refusing
# them gains nothing. 64 is a lane's default --max-batch-size.
SHED_FLOOR = 64


def kind_of(chars: int) -> str:
    return SHORT if chars <= SHORT_REQUEST_CHARS else LONG


@dataclass(frozen=True)
class DoorLimits:
    """``requests``: requests of either kind held at once; ``long_chars``: characters of long requests held at
    once (a long request alone is always let in, however long: ``char_limit`` bounds it)."""

    requests: int
    long_chars: int
    max_loop_lag_s: float = 0.0  # the event loop's smoothed lag over which requests are shed (0: never)


class Door:
    """The requests both front ends hold, by kind; thread-safe (the front ends' event loop and the worker that
    parses documents both release what they hold)."""

    def __init__(self, limits: DoorLimits, metrics: Metrics) -> None:
        self.limits, self.metrics = limits, metrics
        self.lock = threading.Lock()
        self.requests = {SHORT: 0, LONG: 0}
        self.chars = {SHORT: 0, LONG: 0}
        self.departures: deque[tuple[float, int]] = deque(maxlen=RATE_WINDOW)  # (when, characters) of long ones
        self.loop_lag_s = 0.0  # the event loop's smoothed lag (watch_loop)
        self.shed = random.Random(0).random  # which requests a lagging loop refuses
        for kind in (SHORT, LONG):  # read when scraped, not set at every request (4 label lookups each)
            metrics.door_requests.labels(kind).set_function(functools.partial(self.requests.get, kind))
            metrics.door_chars.labels(kind).set_function(functools.partial(self.chars.get, kind))

    async def watch_loop(self) -> None:
        """Sample the running event loop's lag every LAG_INTERVAL_S, for ever (cancel it to stop)."""
        loop = asyncio.get_running_loop()
        while True:
            started = loop.time()
            await asyncio.sleep(LAG_INTERVAL_S)
            late = max(0.0, loop.time() - started - LAG_INTERVAL_S)
            self.loop_lag_s += LAG_SMOOTHING * (late - self.loop_lag_s)
            self.metrics.event_loop_lag.set(self.loop_lag_s)

    def enter(self, chars: int) -> Held:
        """A request of at most ``chars`` characters comes in, or is refused (Overloaded) at once."""
        held = Held(self)
        held.resize(chars)
        return held

    def _take(self, kind: str, chars: int, check: bool) -> None:
        """Under the lock: one more request of ``kind`` and its ``chars``; where ``check``, only if there is room
        (else Overloaded)."""
        total, bound = sum(self.requests.values()), self.limits.max_loop_lag_s
        if check and bound and total >= SHED_FLOOR and self.shed() < self.loop_lag_s / bound - 1.0:
            self._refuse(f"its event loop is {self.loop_lag_s * 1000:.0f} ms behind (max_loop_lag_ms)")
        if check and total >= self.limits.requests:
            self._refuse(f"{total} requests are being translated, the most this server holds at once")
        if check and kind == LONG and self.requests[LONG] and self.chars[LONG] + chars > self.limits.long_chars:
            self._refuse(
                f"{self.chars[LONG]:,} characters of long texts are being translated and this one has {chars:,}, "
                f"over the {self.limits.long_chars:,} this server holds at once (door_long_chars); send shorter "
                "texts"
            )
        self.requests[kind] += 1
        self.chars[kind] += chars

    def _give(self, kind: str, chars: int, left_at: float | None) -> None:
        """Under the lock: a request of ``kind`` and its ``chars`` out; ``left_at``: when it was answered (None: it
        is only being resized)."""
        self.requests[kind] -= 1
        self.chars[kind] -= chars
        if kind == LONG and left_at is not None:
            self.departures.append((left_at, chars))

    def _refuse(self, why: str) -> None:
        self.metrics.rejected.labels("door").inc()
        retry = self._retry_after()
        raise Overloaded(f"the server is busy: {why}; retry in about {retry:.0f} s", retry_after_s=retry)

    def _retry_after(self) -> float:
        """How long the long requests held take to leave at the rate the last ones left, within RETRY_AFTER_S."""
        low, high = RETRY_AFTER_S
        if len(self.departures) < 2:
            return low
        (first, _), (last, _) = self.departures[0], self.departures[-1]
        rate = sum(chars for _, chars in list(self.departures)[1:]) / max(last - first, 1e-3)
        return min(high, max(low, self.chars[LONG] / max(rate, 1.0)))


class Held:
    """One request's place at the door, given back once (``leave``, or the end of a ``with`` block)."""

    def __init__(self, door: Door) -> None:
        self.door, self.kind, self.chars, self.inside = door, SHORT, 0, False

    def resize(self, chars: int) -> None:
        """The request's size once known (its texts' characters, after a Content-Length bound it): the request
        changes kind where it crosses SHORT_REQUEST_CHARS; growing may be refused (Overloaded), shrinking never."""
        door = self.door
        with door.lock:
            grows = not self.inside or chars > self.chars
            if self.inside:
                door._give(self.kind, self.chars, None)
                self.inside = False
            door._take(kind_of(chars), chars, check=grows)
            self.kind, self.chars, self.inside = kind_of(chars), chars, True

    def leave(self) -> None:
        door = self.door
        with door.lock:
            if self.inside:
                door._give(self.kind, self.chars, time.monotonic())
                self.inside = False

    def __enter__(self) -> Held:
        return self

    def __exit__(self, *exc) -> None:
        self.leave()
