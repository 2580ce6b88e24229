"""Shutdown, cancellation, failures and queue limits."""

from __future__ import annotations

import logging
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from proto import translate_pb2, translate_pb2_grpc
from server import __main__ as server_main
from server.errors import Overloaded
from server.operations.metrics import Metrics
from server.scheduling.jobs import DecodeOptions, Job
from server.scheduling.scheduler import Scheduler
from server.sentences import SplitSentence
from testkit.sentences import own_sentences
from testkit.servers import RunningServer, free_port, server_config, start_subprocess_server
from tests.server.fake_engine import FakeEngine


def in_flight(metrics_port: int) -> float:
    """Sentences queued or decoding, read from the server's metrics port."""
    body = urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5).read().decode()
    values = dict(re.findall(r"^(translate_queue_depth|translate_inflight_sequences) (\S+)$", body, re.M))
    return sum(float(v) for v in values.values())


def http_answer(port: int, path: str, body: bytes | None = None) -> tuple[int, str | None, str]:
    """(status, Retry-After, body) of a request to the server's HTTP port, errors included."""
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=body)
    if body is not None:
        request.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(request, timeout=5) as answer:
            return answer.status, answer.headers.get("Retry-After"), answer.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.headers.get("Retry-After"), error.read().decode()


def assert_draining(channel: grpc.Channel, http_port: int) -> None:
    """What a caller and a load balancer meet while the server drains: refusals, not refused connections."""
    health = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)
    assert health.status == health_pb2.HealthCheckResponse.NOT_SERVING
    with pytest.raises(grpc.RpcError) as error:
        translate_pb2_grpc.TranslatorStub(channel).Translate(
            translate_pb2.TranslateRequest(texts=["A man."]), timeout=5
        )
    assert error.value.code() == grpc.StatusCode.UNAVAILABLE
    assert http_answer(http_port, "/health") == (503, None, '{"status": "draining"}')
    status, retry_after, body = http_answer(http_port, "/translate", b'{"q": "A man.", "source": "en", "target": "de"}')
    assert (status, retry_after) == (503, "1") and "shutting down" in body


def wait_for_draining(http_port: int) -> None:
    """Return once the server's signal handler has run: its /health no longer says it serves."""
    deadline = time.monotonic() + 30
    while http_answer(http_port, "/health")[0] == 200 and time.monotonic() < deadline:
        time.sleep(0.05)


def answered_until(channel: grpc.Channel, http_port: int) -> float:
    """Poll both listeners while each answers as a draining server does; the time.monotonic() at which one of
    them first failed to answer (a refused or dropped connection, or a call that gave up)."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            health = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)
            answer = http_answer(http_port, "/health")
        except (grpc.RpcError, OSError):
            return time.monotonic()
        assert health.status == health_pb2.HealthCheckResponse.NOT_SERVING
        assert answer == (503, None, '{"status": "draining"}')
        time.sleep(0.05)
    raise AssertionError("both listeners still answer a minute after SIGTERM")


@pytest.mark.parametrize("event_loop", ["uvloop", "asyncio"])
def test_sigterm_drains_in_flight_requests_while_refusing_new_ones(tiny_export: Path, event_loop: str):
    http_port = free_port()
    process, port, metrics_port = start_subprocess_server(
        tiny_export,
        "--grace-seconds",
        "4",  # the requests in flight finish within half a second of the signal, loaded or not
        "--max-output-tokens",
        "32",
        "--event-loop",
        event_loop,
        "--http-port",
        str(http_port),
    )
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    stub = translate_pb2_grpc.TranslatorStub(channel)
    request = translate_pb2.TranslateRequest(
        texts=own_sentences(8), options=translate_pb2.TranslateOptions(beam_size=4)
    )
    stub.Translate(request, timeout=60)  # connected and warm
    with ThreadPoolExecutor(12) as pool:
        futures = [pool.submit(stub.Translate, request, timeout=60) for _ in range(12)]
        deadline = time.monotonic() + 30
        while in_flight(metrics_port) < 12 * 8 and time.monotonic() < deadline:
            time.sleep(0.01)
        process.send_signal(signal.SIGTERM)
        time.sleep(0.5)  # the signal's handler has run
        assert_draining(channel, http_port)
        results = [f.result() for f in futures]  # raises if any request was lost
    assert all(len(r.translations) == 8 for r in results)
    assert process.wait(60) == 0
    channel.close()


def test_with_nothing_in_flight_both_listeners_refuse_for_the_grace_period(tiny_export: Path):
    http_port = free_port()
    process, port, _ = start_subprocess_server(tiny_export, "--grace-seconds", "3", "--http-port", str(http_port))
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    assert http_answer(http_port, "/health")[0] == 200
    signalled = time.monotonic()
    process.send_signal(signal.SIGTERM)
    wait_for_draining(http_port)
    assert_draining(channel, http_port)
    # The first answer that fails is timed once it has failed: a listener that closes when the grace period ends
    # fails it no sooner than that, however slow this machine; one that closes early fails it early.
    assert answered_until(channel, http_port) - signalled >= 3
    assert process.wait(30) == 0
    with pytest.raises(urllib.error.URLError):
        http_answer(http_port, "/health")  # closed once the grace period is over
    channel.close()


def test_an_event_loop_that_is_not_installed_is_a_clear_start_up_error(tiny_export: Path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "uvloop", None)  # import uvloop raises ImportError
    monkeypatch.setattr(logging.getLogger(), "level", logging.getLogger().level)  # main() sets it
    assert server_main.event_loop_factory("auto") is None  # asyncio's own
    assert server_main.event_loop_factory("asyncio") is None
    assert server_main.main(["--model", str(tiny_export), "--event-loop", "uvloop"]) == 1
    assert "uvloop is not installed (pip install uvloop)" in capsys.readouterr().err


def test_a_provider_that_cannot_run_is_a_clear_start_up_error(tiny_export: Path, monkeypatch, capsys):
    """No traceback: the server says which provider it cannot use and why, and exits 1."""
    import onnxruntime

    if "CUDAExecutionProvider" in onnxruntime.get_available_providers():
        return  # a CUDA build: nothing missing to report
    monkeypatch.setattr(logging.getLogger(), "level", logging.getLogger().level)  # main() sets it
    config = ["--model", str(tiny_export), "--provider", "cuda", "--port", "0", "--http-port", "0"]
    assert server_main.main([*config, "--metrics-port", "0"]) == 1
    assert "server: cannot start: provider 'cuda' is not available in this onnxruntime build" in capsys.readouterr().err


def test_client_command_prints_translations_and_errors(running: RunningServer):
    target = f"127.0.0.1:{running.server.port}"
    ok = subprocess.run(
        [sys.executable, "-m", "client.client", "--target", target],
        input="A man is walking.\nA cat is sleeping.\n",
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert ok.returncode == 0, ok.stderr
    assert len(ok.stdout.splitlines()) == 2
    bad = subprocess.run(
        [sys.executable, "-m", "client.client", "--target", target, "--beam", "99"],
        input="A man.\n",
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert bad.returncode == 1
    assert "INVALID_ARGUMENT" in bad.stderr and "beam_size=99" in bad.stderr


def test_cancelled_request_frees_its_cache(running: RunningServer):
    request = translate_pb2.TranslateRequest(
        texts=own_sentences(48), options=translate_pb2.TranslateOptions(beam_size=8)
    )
    future = running.stub.Translate.future(request)
    deadline = time.monotonic() + 10
    while running.metric("translate_kv_cache_bytes") == 0 and time.monotonic() < deadline:
        time.sleep(0.005)
    future.cancel()
    assert running.wait_for_metric("translate_inflight_sequences", 0) == 0
    assert running.wait_for_metric("translate_kv_cache_bytes", 0) == 0
    assert running.translate(["A man is walking."]).translations[0].text


def test_inference_failure_answers_its_batch_with_internal(running: RunningServer, monkeypatch):
    batch = running.server.scheduler.lanes[0].batch
    original = batch.step
    calls = {"n": 0}

    def failing_once():
        calls["n"] += 1
        if calls["n"] == 1:
            raise RuntimeError("injected failure")
        return original()

    monkeypatch.setattr(batch, "step", failing_once)
    with pytest.raises(grpc.RpcError) as error:
        running.translate(["A man is walking."])
    assert error.value.code() == grpc.StatusCode.INTERNAL
    assert "inference failed" in error.value.details() and "Traceback" not in error.value.details()
    assert running.translate(["A man is walking."]).translations[0].text


def waits_of_this_thread(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The waits the calling thread makes from now on, on a condition or an event or in a sleep; other threads
    wait as before, unrecorded."""
    me, waits = threading.get_ident(), []
    wait, sleep = threading.Condition.wait, time.sleep

    def recorded_wait(condition: threading.Condition, timeout: float | None = None) -> bool:
        if threading.get_ident() == me:
            waits.append(f"Condition.wait({timeout})")
        return wait(condition, timeout)

    def recorded_sleep(seconds: float) -> None:
        if threading.get_ident() == me:
            waits.append(f"sleep({seconds})")
        sleep(seconds)

    monkeypatch.setattr(threading.Condition, "wait", recorded_wait)
    monkeypatch.setattr(time, "sleep", recorded_sleep)
    return waits


def test_full_queue_refuses_at_once_with_a_retry_hint(tiny_export: Path, monkeypatch):
    config = server_config(tiny_export, max_queue_size=2)
    metrics = Metrics()
    scheduler = Scheduler([FakeEngine()], config, metrics)  # not started: nothing drains the queue
    spec = SplitSentence(0, 0, "x", [5, 6, 7])
    job = lambda: Job([spec], DecodeOptions(1, 16), on_segment=lambda s: None, on_done=lambda e: None)  # noqa: E731
    scheduler.submit(job())
    scheduler.submit(job())
    waits = waits_of_this_thread(monkeypatch)
    with pytest.raises(Overloaded, match=r"queue is full \(2 of 2 sentences waiting\); retry in about [\d.]+ s"):
        scheduler.submit(job())
    assert waits == []  # refused without waiting for room (nothing would free any)
    assert metrics.registry.get_sample_value("translate_rejected_total", {"reason": "queue_full"}) == 1
