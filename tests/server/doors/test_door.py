"""The front door (server/doors/door.py): its bounds by kind, what it refuses and when (before a body is read), that
the refusal is the documented 429 / RESOURCE_EXHAUSTED, and that a long request's CPU work runs off the event
loop while a short one's stays on it."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
import types
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from server.documents import markup
from server.doors import door as door_module
from server.doors.door import (
    LAG_INTERVAL_S,
    LAG_SMOOTHING,
    LONG,
    SHED_FLOOR,
    SHORT,
    SHORT_REQUEST_CHARS,
    Door,
    DoorLimits,
)
from server.errors import Overloaded
from server.operations.metrics import Metrics
from testkit.sentences import own_sentences
from testkit.servers import RunningServer, http, start_server

LONG_CHARS = 4 * SHORT_REQUEST_CHARS  # the test server's door: one long request of up to this at a time


def document(chars: int) -> str:
    """Plain paragraphs of distinct sentences, at least ``chars`` characters in all."""
    sentences, text = own_sentences(400), ""
    while len(text) < chars:
        text += " ".join(sentences[len(text) % 300 :][:5]) + "\n\n"
    return text


def gauge(metrics: Metrics, name: str, kind: str) -> float:
    return metrics.registry.get_sample_value(name, {"kind": kind})


def test_short_requests_are_bounded_by_number_and_long_ones_by_characters():
    metrics = Metrics()
    door = Door(DoorLimits(requests=3, long_chars=10_000), metrics)
    first = door.enter(6_000)
    assert (first.kind, gauge(metrics, "translate_door_chars", LONG)) == (LONG, 6_000)
    with pytest.raises(
        Overloaded,
        match=r"6,000 characters of long texts .*\(door_long_chars\); send shorter texts; retry in about 1 s",
    ):
        door.enter(5_000)
    short = door.enter(100)  # the long requests' bound is theirs alone
    assert gauge(metrics, "translate_door_requests", SHORT) == 1
    with door.enter(4_000), pytest.raises(Overloaded, match="3 requests are being translated"):  # 4,000 fits
        door.enter(10)
    first.leave()
    first.leave()  # once only
    short.leave()
    assert door.requests == {SHORT: 0, LONG: 0} and door.chars == {SHORT: 0, LONG: 0}
    assert metrics.registry.get_sample_value("translate_rejected_total", {"reason": "door"}) == 2


def test_a_long_request_alone_always_enters_and_a_resize_shrinks_without_refusal():
    door = Door(DoorLimits(requests=10, long_chars=1_000), Metrics())
    held = door.enter(50_000)  # over the bound, but alone: --char-limit bounds it
    assert held.kind == LONG
    held.resize(500)  # its texts turned out short: it is a short request now
    assert (held.kind, door.requests, door.chars) == (SHORT, {SHORT: 1, LONG: 0}, {SHORT: 500, LONG: 0})
    long = door.enter(3_000)
    with pytest.raises(Overloaded):
        held.resize(2_500)  # growing into a second long request is checked
    assert held.inside is False and door.requests == {SHORT: 0, LONG: 1}  # refused: it holds nothing
    long.leave()


def test_retry_after_follows_the_rate_long_requests_leave():
    door = Door(DoorLimits(requests=10, long_chars=3_000), Metrics())
    for _ in range(3):
        door.enter(3_000).leave()
    door.departures.clear()
    door.departures.extend([(0.0, 3_000), (1.0, 3_000), (2.0, 3_000)])  # 3,000 characters a second
    held = door.enter(3_000)
    with pytest.raises(Overloaded) as refused:
        door.enter(2_500)
    assert refused.value.retry_after_s == pytest.approx(1.0)  # its 3,000 held leave in about a second
    held.leave()


@pytest.fixture(scope="module")
def server(tiny_export: Path) -> Iterator[RunningServer]:
    running = start_server(tiny_export, door_long_chars=LONG_CHARS)
    yield running
    running.close()


def test_a_long_request_with_no_room_is_429_before_its_body_is_read(server: RunningServer):
    held = server.server.translations.door.enter(LONG_CHARS)  # a document being translated
    refused = server.count("translate_rejected_total", {"reason": "door"})
    try:
        body = json.dumps({"q": document(3 * SHORT_REQUEST_CHARS), "source": "en", "target": "de"}).encode()
        with socket.create_connection(("127.0.0.1", server.server.http_port), timeout=10) as connection:
            headers = "POST /translate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            connection.sendall(f"{headers}Content-Length: {len(body)}\r\n\r\n".encode() + body[:100])
            # The rest of the body is never sent: a server that read it before answering would never answer, and
            # recv would give up (the connection's timeout) rather than return the refusal.
            answer = connection.recv(65536).decode()
        assert answer.startswith("HTTP/1.1 429") and "door_long_chars" in answer and "Retry-After: " in answer
        status, _, answer = http(server, "/translate", {"q": own_sentences(1)[0], "source": "en", "target": "de"})
        assert status == 200  # short requests have their own room
        assert server.count("translate_rejected_total", {"reason": "door"}) == refused + 1
    finally:
        held.leave()
    status, _, _ = http(server, "/translate", {"q": document(3 * SHORT_REQUEST_CHARS), "source": "en", "target": "de"})
    assert status == 200


def test_a_long_grpc_request_with_no_room_is_resource_exhausted(server: RunningServer):
    held = server.server.translations.door.enter(LONG_CHARS)
    try:
        with pytest.raises(grpc.RpcError) as refused:
            server.translate([document(3 * SHORT_REQUEST_CHARS)])
        assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "door_long_chars" in refused.value.details()
        assert len(server.translate(own_sentences(2)).translations) == 2
    finally:
        held.leave()
    assert server.metric("translate_door_requests", {"kind": LONG}) == 0


def test_a_long_requests_parsing_runs_off_the_event_loop_and_a_short_ones_on_it(server: RunningServer, monkeypatch):
    threads: list[str] = []
    parse = markup.parse

    def recording(text: str, format: str) -> markup.ParsedText:
        threads.append(threading.current_thread().name)
        return parse(text, format)

    monkeypatch.setattr(markup, "parse", recording)
    loop = server.thread.name
    long = "<p>" + document(3 * SHORT_REQUEST_CHARS).replace("\n\n", "</p><p>") + "</p>"
    assert http(server, "/translate", {"q": long, "source": "en", "target": "de", "format": "html"})[0] == 200
    assert (
        http(server, "/translate", {"q": "<b>A dog</b> runs.", "source": "en", "target": "de", "format": "html"})[0]
        == 200
    )
    assert threads[0].startswith("documents") and threads[1] == loop


def test_a_lagging_event_loop_sheds_a_share_of_requests_growing_to_all_at_twice_the_bound():
    door = Door(DoorLimits(requests=100_000, long_chars=10_000, max_loop_lag_s=0.04), Metrics())
    door.loop_lag_s = 0.1
    held = [door.enter(10) for _ in range(SHED_FLOOR)]  # a busy loop holding few requests is not flooded
    door.loop_lag_s = 0.039
    door.enter(10).leave()
    door.loop_lag_s = 0.06  # half of the requests refused
    refused = 0
    for _ in range(1000):
        try:
            door.enter(10).leave()
        except Overloaded as error:
            refused += 1
            assert "event loop is 60 ms behind (max_loop_lag_ms)" in str(error)
    assert 400 < refused < 600
    door.loop_lag_s = 0.08
    with pytest.raises(Overloaded):
        door.enter(10)
    for request in held:
        request.leave()


def test_the_loop_watch_sees_a_blocked_loop():
    door = Door(DoorLimits(requests=10, long_chars=10_000, max_loop_lag_s=0.04), Metrics())

    async def blocked() -> float:
        watch = asyncio.create_task(door.watch_loop())
        await asyncio.sleep(0.15)
        time.sleep(0.4)  # the loop is stuck; the watch's timer, overdue, runs first after it
        await asyncio.sleep(0.001)
        watch.cancel()
        return door.loop_lag_s

    # The watch's timer was due before the block began: it fires 0.3 s late or more (more on a slower machine),
    # and a third of that is over twice the bound.
    assert asyncio.run(blocked()) > 0.08  # everything is shed


class ScriptedLoop:
    """The event loop as the watch sees it, on a clock the test moves: each of the watch's sleeps ends when the
    test says, as late as it says."""

    def __init__(self) -> None:
        self.now = 0.0

    def time(self) -> float:
        return self.now

    @types.coroutine
    def sleep(self, seconds: float):
        yield  # until the test sends the watch on


def test_the_loop_watch_smooths_the_lag_and_forgets_a_blocked_loop(monkeypatch):
    metrics = Metrics()
    door = Door(DoorLimits(requests=10, long_chars=10_000, max_loop_lag_s=0.04), metrics)
    loop = ScriptedLoop()
    monkeypatch.setattr(door_module, "asyncio", types.SimpleNamespace(get_running_loop=lambda: loop, sleep=loop.sleep))
    watch = door.watch_loop()
    watch.send(None)  # asleep until its first sample

    def sample(late: float) -> float:
        loop.now += LAG_INTERVAL_S + late
        watch.send(None)
        assert metrics.registry.get_sample_value("translate_event_loop_lag_seconds") == door.loop_lag_s
        return door.loop_lag_s

    assert sample(0.0) == 0.0
    blocked = sample(0.35)
    assert blocked == pytest.approx(0.35 * LAG_SMOOTHING) and blocked > 2 * door.limits.max_loop_lag_s  # all shed
    for _ in range(12):
        idle = sample(0.0)
    assert idle == pytest.approx(blocked * (1 - LAG_SMOOTHING) ** 12) and idle < 0.01  # forgotten
    watch.close()


def test_a_body_sent_without_its_length_is_checked_right_after_it_is_read(server: RunningServer):
    held = server.server.translations.door.enter(LONG_CHARS)
    try:
        body = json.dumps({"q": document(3 * SHORT_REQUEST_CHARS), "source": "en", "target": "de"}).encode()
        with socket.create_connection(("127.0.0.1", server.server.http_port), timeout=10) as connection:
            headers = "POST /translate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            chunk = f"{len(body):x}\r\n".encode() + body + b"\r\n0\r\n\r\n"
            connection.sendall(f"{headers}Transfer-Encoding: chunked\r\n\r\n".encode() + chunk)
            answer = connection.recv(65536).decode()
        assert answer.startswith("HTTP/1.1 429") and "door_long_chars" in answer
    finally:
        held.leave()
