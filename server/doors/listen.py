"""The addresses a port listens on: every port (gRPC, HTTP, metrics) reachable over IPv4 and IPv6 by default.

``--host`` is the wildcard ``[::]`` (every address of both families), an address of either family
(``0.0.0.0``, ``127.0.0.1``, ``::1``, brackets optional), or a host name (every address it resolves to).
The HTTP and metrics ports get one listening socket per address, made here; asyncio and the standard
library's HTTP server would otherwise bind one family only (asyncio sets ``IPV6_V6ONLY`` on ``[::]``;
prometheus_client binds ``0.0.0.0``). gRPC takes the same host and binds it itself (dual-stack on ``[::]``).
"""

from __future__ import annotations

import errno
import logging
import socket
import threading
from collections.abc import Sequence
from wsgiref.simple_server import WSGIRequestHandler

from prometheus_client import CollectorRegistry, make_wsgi_app
from prometheus_client.exposition import ThreadingWSGIServer

log = logging.getLogger(__name__)

WILDCARDS = {"", "::", "*"}  # after brackets are stripped: every address of both families
# Connections the kernel queues for a listener before the server accepts them: past it, a new connection's SYN is
# dropped and its client retries in 1, 3, 7 s..., which a flood turned into health checks waiting 20 s. 4096 is
# Linux's default net.core.somaxconn (it caps this) and holds a few seconds of a flood while the loop refuses it.
BACKLOG = 4096
# The family is missing on this host (an IPv6-disabled kernel or an IPv4-less pod): that family is skipped.
FAMILY_MISSING = {errno.EAFNOSUPPORT, errno.EADDRNOTAVAIL, errno.EPROTONOSUPPORT}


class ListenError(OSError):
    """No address of --host could be bound."""


def bare(host: str) -> str:
    """The host without IPv6 brackets: "[::1]" → "::1"."""
    return host[1:-1] if host.startswith("[") and host.endswith("]") else host


def hostport(address: str, port: int) -> str:
    """An address and port as callers write them: 127.0.0.1:5000, [::1]:5000."""
    return f"[{address}]:{port}" if ":" in address else f"{address}:{port}"


def grpc_address(host: str, port: int) -> str:
    """gRPC's listening address for host; the wildcard is "[::]", which gRPC binds dual-stack."""
    host = bare(host)
    return hostport("::" if host in WILDCARDS else host, port)


def local_address(host: str) -> str:
    """Where a caller on the same host reaches a server listening on host: the IPv4 loopback for a wildcard
    (as a cluster's callers, most of them IPv4), else host itself."""
    host = bare(host)
    return "127.0.0.1" if host in WILDCARDS | {"0.0.0.0"} else host


def addresses(host: str) -> list[tuple[socket.AddressFamily, str]]:
    """Every (family, address) that host means, IPv4 first."""
    host = bare(host)
    if host in WILDCARDS:
        return [(socket.AF_INET, "0.0.0.0"), (socket.AF_INET6, "::")]
    try:
        infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as e:
        raise ListenError(
            f"--host {host!r} resolves to no address ({e.strerror}): give an IP address or a known name"
        ) from e
    found = dict.fromkeys((family, sockaddr[0]) for family, _, _, _, sockaddr in infos)
    return sorted(found, key=lambda pair: pair[0] != socket.AF_INET)


def listen(host: str, port: int) -> list[socket.socket]:
    """Listening TCP sockets on port for every address of host; port 0 picks one free port for all of them.
    Where host means several addresses, one whose family this host lacks is skipped (and logged)."""
    wanted = addresses(host)
    sockets: list[socket.socket] = []
    try:
        for family, address in wanted:
            sock = _listen_one(family, address, port, optional=len(wanted) > 1)
            if sock is not None:
                sockets.append(sock)
                port = port or sock.getsockname()[1]  # the first socket's free port, for every other address
    except BaseException:
        for sock in sockets:
            sock.close()
        raise
    if not sockets:
        raise ListenError(f"--host {host!r}: no address of either family can be bound on this host")
    return sockets


def _listen_one(family: socket.AddressFamily, address: str, port: int, optional: bool) -> socket.socket | None:
    sock = None
    try:
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if family == socket.AF_INET6:  # the IPv4 socket has IPv4; without this they would collide
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        sock.bind((address, port))
        sock.listen(BACKLOG)
        return sock
    except OSError as e:
        if sock is not None:
            sock.close()
        if optional and e.errno in FAMILY_MISSING:
            log.info("not listening on %s: %s (no %s here)", hostport(address, port), e.strerror, family.name)
            return None
        raise ListenError(e.errno, f"cannot listen on {hostport(address, port)}: {e.strerror}") from e


def bound(sockets: Sequence[socket.socket]) -> list[str]:
    """What each socket listens on, as callers write it."""
    return [hostport(*sock.getsockname()[:2]) for sock in sockets]


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args) -> None:  # scrapes are counted, not logged
        pass


class _MetricsServer(ThreadingWSGIServer):
    """prometheus_client's threaded WSGI server on a socket made by listen()."""

    def __init__(self, sock: socket.socket, registry: CollectorRegistry) -> None:
        super().__init__(sock.getsockname()[:2], _QuietHandler, bind_and_activate=False)
        self.socket.close()
        self.socket = sock
        self.server_address = sock.getsockname()
        self.server_name, self.server_port = self.server_address[:2]
        self.setup_environ()
        self.set_app(make_wsgi_app(registry))


class MetricsEndpoint:
    """The Prometheus scrape port on every address of host, each served by a daemon thread."""

    def __init__(self, host: str, port: int, registry: CollectorRegistry) -> None:
        self.servers = [_MetricsServer(sock, registry) for sock in listen(host, port)]
        self.port = self.servers[0].server_port
        self.addresses = bound([server.socket for server in self.servers])
        for server in self.servers:
            threading.Thread(target=server.serve_forever, name="metrics-http", daemon=True).start()

    def shutdown(self) -> None:
        for server in self.servers:
            server.shutdown()
            server.server_close()
