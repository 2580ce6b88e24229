"""The callers' service config: round robin over a target's addresses and retries of UNAVAILABLE, so a
replica that drains loses no request of a client that uses it (client.client, the load generator)."""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2

from client.channel import CHANNEL_OPTIONS, KEEPALIVE_TIME_MS, KEEPALIVE_TIMEOUT_MS, SERVICE, SERVICE_CONFIG, channel
from proto import translate_pb2, translate_pb2_grpc
from server.config import ServerConfig
from testkit.sentences import own_sentences
from testkit.servers import RunningServer, server_config
from tests.conftest import ROOT


@contextlib.contextmanager
def round_robin_over_two(tiny_export: Path) -> Iterator[tuple[list[RunningServer], Callable[[], object]]]:
    """Two replicas and a call of one sentence through the callers' channel over both."""
    replicas = [RunningServer(server_config(tiny_export, max_output_tokens=8)) for _ in range(2)]
    try:
        target = "ipv4:" + ",".join(f"127.0.0.1:{r.server.port}" for r in replicas)
        with channel(target) as connection:
            stub = translate_pb2_grpc.TranslatorStub(connection)
            request = translate_pb2.TranslateRequest(texts=own_sentences(1))
            yield replicas, lambda: stub.Translate(request, timeout=20)
    finally:
        for replica in replicas:
            replica.close()


def test_a_draining_replica_loses_no_request(tiny_export: Path):
    with round_robin_over_two(tiny_export) as (replicas, call):
        answered = [call() for _ in range(6)]  # round robin: both serve
        served = {r.server.port: r.metric("translate_requests_total", {"code": "OK"}) or 0 for r in replicas}
        assert all(count >= 2 for count in served.values()), served
        replicas[0].server.scheduler.stop_accepting()  # draining: it answers UNAVAILABLE
        answered += [call() for _ in range(10)]
        assert len({a.translations[0].text for a in answered}) == 1
        assert replicas[0].metric("translate_requests_total", {"code": "UNAVAILABLE"}) >= 1  # it was asked, ...
        assert replicas[1].metric("translate_requests_total", {"code": "OK"}) >= served[replicas[1].server.port] + 10


def test_round_robin_skips_a_replica_whose_health_says_not_serving(tiny_export: Path):
    with round_robin_over_two(tiny_export) as (replicas, call):
        for _ in range(6):
            call()
        asked = replicas[0].metric("translate_requests_total") or 0
        assert asked >= 2  # round robin: both serve
        not_serving = health_pb2.HealthCheckResponse.NOT_SERVING
        replicas[0].call(replicas[0].server.health.set(SERVICE, not_serving))  # as a drain begins
        time.sleep(0.5)  # the health watch tells the channel
        for _ in range(10):
            call()
        assert replicas[0].metric("translate_requests_total") == asked  # not even asked


def test_without_the_service_config_a_draining_replica_fails_requests(tiny_export: Path):
    replica = RunningServer(server_config(tiny_export, max_output_tokens=8))
    try:
        replica.server.scheduler.stop_accepting()
        with grpc.insecure_channel(f"127.0.0.1:{replica.server.port}") as plain:
            stub = translate_pb2_grpc.TranslatorStub(plain)
            with pytest.raises(grpc.RpcError) as error:
                stub.Translate(translate_pb2.TranslateRequest(texts=["A man."]), timeout=20)
            assert error.value.code() == grpc.StatusCode.UNAVAILABLE
    finally:
        replica.close()


def test_the_service_config_retries_only_what_is_safe_to():
    for method in SERVICE_CONFIG["methodConfig"]:
        assert method["retryPolicy"]["retryableStatusCodes"] == ["UNAVAILABLE", "CANCELLED"]
    assert json.loads(json.dumps(SERVICE_CONFIG)) == SERVICE_CONFIG


def test_the_deployed_service_config_is_the_callers_one():
    assert json.loads((ROOT / "deploy" / "grpc" / "service-config.json").read_text()) == SERVICE_CONFIG


def test_the_server_allows_the_clients_keepalive_pings():
    """A client pinging faster than the server allows gets GOAWAY too_many_pings and its pings slowed."""
    assert ServerConfig().min_client_ping_interval_s * 1000 < KEEPALIVE_TIME_MS
    assert ("grpc.http2.ping_timeout_ms", KEEPALIVE_TIMEOUT_MS) in CHANNEL_OPTIONS


def test_the_load_generator_counts_retries_and_losses(tiny_export: Path, tmp_path: Path):
    """A draining replica beside a serving one: its refusals are retried on the other, the report counts
    them (the server says which attempt answered), and nothing is lost."""
    from client import loadtest

    replicas = [RunningServer(server_config(tiny_export, max_output_tokens=8)) for _ in range(2)]
    try:
        replicas[0].server.scheduler.stop_accepting()
        target = "ipv4:" + ",".join(f"127.0.0.1:{r.server.port}" for r in replicas)
        args = [
            "--target",
            target,
            "--metrics",
            "",
            "--requests",
            "12",
            "--concurrency",
            "1",  # round robin alternates strictly: every refusal's retry meets the serving replica (with two
            # clients, one request's attempts can all meet the draining one while the other's take the turns)
            "--tokenizer",
            str(tiny_export / "sentencepiece.model"),
            "--out",
            str(tmp_path),
        ]
        assert loadtest.main(args) == 0
        (run,) = json.loads((tmp_path / "report.json").read_text())["runs"]
        assert (run["requests"], run["answered"], run["lost"]) == (12, 12, 0)
        refusals = replicas[0].metric("translate_requests_total", {"code": "UNAVAILABLE"})
        assert 1 <= run["retried"] <= refusals  # a request may have met the draining replica more than once
    finally:
        for replica in replicas:
            replica.close()
