"""How callers should reach the service: the gRPC service config and channel options that ``client.client``
and the load generator use, and that other languages' clients can take as they are
(deploy/grpc/service-config.json is the same service config; docs/serving.md, "Silent failures", gives the
reason for each number).

Round robin over every address the target resolves to (a headless Service's ``dns:///`` name gives one
per pod) whose health service says the translator is SERVING (a draining replica keeps its listener open for its
grace period, answering NOT_SERVING), and retries with exponential backoff, at most 5 attempts (gRPC's limit)
within the call's deadline, of ``UNAVAILABLE`` (a replica restarting or unreachable, or one draining that a call
reached before its health check said so) and ``CANCELLED``: gRPC cancels the calls a server received in the
instant it stops (seen in tests/server/test_faults.py's rolling restart), and a caller's own cancellation ends
the call, so it is never retried. A translation is idempotent, so a retry never does harm. The other codes are
not retried here (README: "Which codes a caller may retry").

Deadlines per method: a translation may wait behind a full queue (benchmarks/overload.md: p99 7.6 s at twice
the capacity) and a long text decodes for seconds, so 60 s; the others answer from memory, so 10 s.

A replica that comes back is reached again within RECONNECT_MAX_MS: gRPC's default reconnect backoff
(1 s, growing 1.6× up to 120 s) left every replica of a rolling restart in backoff at once on a loaded
2-core machine, and 8 requests lost their 4 attempts (tests/server/test_faults.py failed 2 runs in 5 with
a busy core beside it, on this code and on the commit before).

A replica that goes silent (its host gone, its packets dropped, its process frozen) answers nothing and
refuses nothing: without keepalive, calls sent to it waited for their deadline, and a 20 s blackhole held
calls for up to 55 s (TCP's retransmissions back off past the blackhole's end). A ping every
KEEPALIVE_TIME_MS, given up on after KEEPALIVE_TIMEOUT_MS, closes such a connection (gRPC also sets
TCP_USER_TIMEOUT to the timeout, so unacknowledged data closes it as soon), its calls fail UNAVAILABLE and
are retried on another replica, and round robin skips it until it connects again: in
tests/server/test_netns_faults.py no call took longer than 2.4 s in a blackhole, a link flap, a frozen
process or a host restart. Every call stuck on a silent replica costs its caller up to time + timeout, so both
are short; pings are 17 bytes each way per connection, and the server allows one a second
(ServerConfig.min_client_ping_interval_s). Go and Java clients raise a keepalive time under 10 s to 10 s.
gRPC's ping timeout (grpc.http2.ping_timeout_ms, 60 s by default) bounds the keepalive ping too, so it is
set to the keepalive timeout.

Hedging (hedgingPolicy) is not used: gRPC's C core (Python, C++, Ruby, PHP) and Go do not implement it, and
a method config holds a retry policy or a hedging policy, not both; the keepalive bounds the same tail.
"""

from __future__ import annotations

import json

import grpc

SERVICE = "translation.v1.Translator"
RETRY_POLICY = {
    "maxAttempts": 5,
    "initialBackoff": "0.1s",
    "maxBackoff": "2s",
    "backoffMultiplier": 2,
    "retryableStatusCodes": ["UNAVAILABLE", "CANCELLED"],
}
QUICK_METHODS = ("Detect", "GetModelInfo", "ListModels")
# Default deadlines; the caller's own deadline wins when shorter.
SERVICE_CONFIG = {
    "loadBalancingConfig": [{"round_robin": {}}],
    # Round robin skips a replica whose health service says the translator is NOT_SERVING (draining after
    # SIGTERM, or still warming up) while its connection stays open (gRPC's client-side health checking).
    "healthCheckConfig": {"serviceName": SERVICE},
    "methodConfig": [
        {"name": [{"service": SERVICE}], "timeout": "60s", "retryPolicy": RETRY_POLICY},
        {
            "name": [{"service": SERVICE, "method": method} for method in QUICK_METHODS],
            "timeout": "10s",
            "retryPolicy": RETRY_POLICY,
        },
    ],
}
RECONNECT_INITIAL_MS, RECONNECT_MAX_MS = 100, 1000  # a replica that is back is tried again within a second
KEEPALIVE_TIME_MS, KEEPALIVE_TIMEOUT_MS = 2000, 2000  # a silent replica's calls are retried within about 4 s
CHANNEL_OPTIONS = [
    ("grpc.service_config", json.dumps(SERVICE_CONFIG)),
    ("grpc.enable_retries", 1),
    ("grpc.initial_reconnect_backoff_ms", RECONNECT_INITIAL_MS),
    ("grpc.min_reconnect_backoff_ms", RECONNECT_INITIAL_MS),
    ("grpc.max_reconnect_backoff_ms", RECONNECT_MAX_MS),
    ("grpc.keepalive_time_ms", KEEPALIVE_TIME_MS),
    ("grpc.keepalive_timeout_ms", KEEPALIVE_TIMEOUT_MS),
    ("grpc.http2.ping_timeout_ms", KEEPALIVE_TIMEOUT_MS),
    ("grpc.keepalive_permit_without_calls", 1),  # an idle connection to a silent replica is found before use
    ("grpc.http2.max_pings_without_data", 0),  # and goes on pinging without calls (gRPC stops after 2)
]


def target_problem(target: str) -> str | None:
    """Why ``target`` is not an address a channel reaches, in one line (None: it is one): host:port,
    [IPv6]:port, dns:///name:port (dns://server/name:port), ipv4: or ipv6: and a list of those, or unix:PATH.
    gRPC itself would take a URL or a bad port for a name it cannot resolve, a missing port for 443 and a port
    over 65535 modulo 65536, and say so only when a call's deadline ran out."""
    if target.startswith(("unix:", "unix-abstract:")):
        return None
    if target.startswith(("ipv4:", "ipv6:")):  # a list of addresses: ipv4:10.0.0.1:50051,10.0.0.2:50051
        addresses = target[5:].removeprefix("//").split(",")
        problems = (target_problem(address) for address in addresses if "://" not in address)
        return next((f"{target!r}: {problem}" for problem in problems if problem), None)
    address = target
    if "://" in target:
        scheme, _, rest = target.partition("://")
        if scheme != "dns":
            host = rest.split("/")[0] or "127.0.0.1:50051"
            return f"{target!r} is a URL: give host:port ({host}), or dns:///name:port for every address of a name"
        address = rest.partition("/")[2]
    if address.startswith("["):
        host, bracket, port = address[1:].partition("]:")
        if not bracket:
            return f"{target!r}: an IPv6 address is written [address]:port, e.g. [::1]:50051"
    else:
        host, colon, port = address.rpartition(":")
        if not colon:
            return f"{target!r} has no port: give host:port, e.g. {address or '127.0.0.1'}:50051"
        if ":" in host:
            return f"{target!r}: an IPv6 address is written in brackets with its port, e.g. [::1]:50051"
    if not host:
        return f"{target!r} has no host: give host:port, e.g. 127.0.0.1{address}"
    if not port.isdigit() or not 0 < int(port) < 65536:
        return f"{target!r}: the port must be a number from 1 to 65535"
    return None


def channel(target: str, credentials: grpc.ChannelCredentials | None = None, options=()) -> grpc.Channel:
    """A blocking channel with the service config."""
    options = [*CHANNEL_OPTIONS, *options]
    if credentials is None:
        return grpc.insecure_channel(target, options=options)
    return grpc.secure_channel(target, credentials, options=options)


def aio_channel(target: str, credentials: grpc.ChannelCredentials | None = None, options=()) -> grpc.aio.Channel:
    """An asyncio channel with the service config."""
    options = [*CHANNEL_OPTIONS, *options]
    if credentials is None:
        return grpc.aio.insecure_channel(target, options=options)
    return grpc.aio.secure_channel(target, credentials, options=options)
