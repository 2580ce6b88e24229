"""Every port (gRPC, HTTP, metrics) answers on the IPv4 and the IPv6 loopback under the default --host."""

from __future__ import annotations

import logging
import socket
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from proto import translate_pb2, translate_pb2_grpc
from server.config import ServerConfig
from server.doors.listen import ListenError, addresses, grpc_address, listen
from testkit.servers import RunningServer, free_port, server_config


def has_ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6) as s:
            s.bind(("::1", 0))
        return True
    except OSError:
        return False


LOOPBACKS = ["127.0.0.1", pytest.param("[::1]", marks=pytest.mark.skipif(not has_ipv6_loopback(), reason="no ::1"))]


def get(url: str) -> tuple[int, bytes]:
    with urllib.request.urlopen(url, timeout=10) as response:
        return response.status, response.read()


@pytest.fixture(scope="module")
def default_host_server(tiny_export: Path) -> Iterator[RunningServer]:
    config = server_config(tiny_export, host=ServerConfig().host, http_port=free_port())
    running = RunningServer(config)
    yield running
    running.close()


def test_the_default_host_means_both_families():
    assert ServerConfig().host == "[::]"
    assert addresses("[::]") == [(socket.AF_INET, "0.0.0.0"), (socket.AF_INET6, "::")]
    assert grpc_address("[::]", 50051) == "[::]:50051"


@pytest.mark.parametrize(
    "host, expected",
    [
        ("0.0.0.0", [(socket.AF_INET, "0.0.0.0")]),
        ("127.0.0.1", [(socket.AF_INET, "127.0.0.1")]),
        ("::1", [(socket.AF_INET6, "::1")]),
        ("[::1]", [(socket.AF_INET6, "::1")]),
    ],
)
def test_an_address_of_either_family_is_that_address(host: str, expected):
    assert addresses(host) == expected


def test_a_host_name_means_each_of_its_addresses(monkeypatch):
    """A name's addresses as the resolver gives them (a pod name: IPv6 first, each address once per socket
    type), IPv4 first and each once."""
    resolved = {"translator.test": ["fd00::7", "10.0.0.7", "fd00::7"]}

    def getaddrinfo(host, port, family=0, type=0, proto=0, flags=0):
        if host not in resolved:
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        return [
            (socket.AF_INET6 if ":" in address else socket.AF_INET, socket.SOCK_STREAM, 6, "", (address, 0))
            for address in resolved[host]
        ]

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    assert addresses("translator.test") == [(socket.AF_INET, "10.0.0.7"), (socket.AF_INET6, "fd00::7")]
    with pytest.raises(ListenError, match="resolves to no address"):
        addresses("no-such-host.invalid")


def test_one_free_port_for_every_address():
    sockets = listen("[::]", 0)
    try:
        ports = {sock.getsockname()[1] for sock in sockets}
        families = [sock.family for sock in sockets]
        assert len(ports) == 1, ports
        assert families[0] == socket.AF_INET and (len(families) == 2 or not has_ipv6_loopback()), families
    finally:
        for sock in sockets:
            sock.close()


def test_a_port_in_use_is_a_clear_error():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        with pytest.raises(ListenError, match=r"cannot listen on 127\.0\.0\.1:\d+"):
            listen("127.0.0.1", taken.getsockname()[1])


@pytest.mark.parametrize("loopback", LOOPBACKS)
def test_http_and_metrics_answer_on_both_loopbacks(default_host_server: RunningServer, loopback: str):
    server = default_host_server.server
    status, body = get(f"http://{loopback}:{server.http_port}/languages")
    assert status == 200 and b'"code": "en"' in body.replace(b'":"', b'": "'), body[:200]
    status, body = get(f"http://{loopback}:{server.metrics_port}/metrics")
    assert status == 200 and b"translate_model_info" in body, body[:200]


@pytest.mark.parametrize("loopback", LOOPBACKS)
def test_grpc_answers_on_both_loopbacks(default_host_server: RunningServer, loopback: str):
    with grpc.insecure_channel(f"{loopback}:{default_host_server.server.port}") as channel:
        models = translate_pb2_grpc.TranslatorStub(channel).ListModels(translate_pb2.ListModelsRequest(), timeout=10)
    assert models.models, models


def test_the_startup_line_names_the_bound_addresses(tiny_export: Path, caplog):
    caplog.set_level(logging.INFO, logger="server.app")
    running = RunningServer(server_config(tiny_export, host="127.0.0.1", http_port=free_port()))
    try:
        port, http_port, metrics_port = running.server.port, running.server.http_port, running.server.metrics_port
    finally:
        running.close()
    line = next(r.getMessage() for r in caplog.records if r.getMessage().startswith("serving "))
    expected = f"gRPC on 127.0.0.1:{port}, HTTP API on 127.0.0.1:{http_port}, metrics on 127.0.0.1:{metrics_port}"
    assert expected in line, line
    # RunningServer's own loop (python -m server: uvloop)
    assert line.endswith(f"; the page at http://127.0.0.1:{http_port}/; event loop: asyncio"), line


def test_the_page_the_startup_line_names_answers_under_the_default_host(default_host_server: RunningServer):
    url = default_host_server.server.page_url
    assert url == f"http://127.0.0.1:{default_host_server.server.http_port}/"
    status, body = get(url)
    assert status == 200 and body.startswith(b"<!doctype html>"), body[:200]


def test_without_the_http_api_the_startup_line_names_no_page(tiny_export: Path, caplog):
    caplog.set_level(logging.INFO, logger="server.app")
    running = RunningServer(server_config(tiny_export, host="127.0.0.1", http_port=0))
    running.close()
    line = next(r.getMessage() for r in caplog.records if r.getMessage().startswith("serving "))
    assert "HTTP API on off" in line and "page" not in line, line
