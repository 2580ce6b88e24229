"""How callers should reach the service: the gRPC service config that ``server.client`` and the load
generator use, and that the README shows for other languages' clients.

Round robin over every address the target resolves to (a headless Service's ``dns:///`` name gives one
per pod), and retries with exponential backoff, at most 5 attempts (gRPC's limit) within the call's deadline, of
``UNAVAILABLE`` (a replica draining, restarting or unreachable) and ``CANCELLED``: gRPC cancels the calls
a server received in the instant it stops (seen in tests/server/test_faults.py's rolling restart), and a
caller's own cancellation ends the call, so it is never retried. A translation is idempotent, so a retry
never does harm. The other codes are not retried here (README: "Which codes a caller may retry").

A replica that comes back is reached again within RECONNECT_MAX_MS: gRPC's default reconnect backoff
(1 s, growing 1.6× up to 120 s) left every replica of a rolling restart in backoff at once on a loaded
2-core machine, and 8 requests lost their 4 attempts (tests/server/test_faults.py failed 2 runs in 5 with
a busy core beside it, on this code and on the commit before).
"""

from __future__ import annotations

import json

import grpc

SERVICE = "translation.v1.Translator"
SERVICE_CONFIG = {
    "loadBalancingConfig": [{"round_robin": {}}],
    "methodConfig": [
        {
            "name": [{"service": SERVICE}],
            "timeout": "60s",  # a default deadline; the caller's own deadline wins when shorter
            "retryPolicy": {
                "maxAttempts": 5,
                "initialBackoff": "0.1s",
                "maxBackoff": "2s",
                "backoffMultiplier": 2,
                "retryableStatusCodes": ["UNAVAILABLE", "CANCELLED"],
            },
        }
    ],
}
RECONNECT_INITIAL_MS, RECONNECT_MAX_MS = 100, 1000  # a replica that is back is tried again within a second
CHANNEL_OPTIONS = [
    ("grpc.service_config", json.dumps(SERVICE_CONFIG)),
    ("grpc.enable_retries", 1),
    ("grpc.initial_reconnect_backoff_ms", RECONNECT_INITIAL_MS),
    ("grpc.min_reconnect_backoff_ms", RECONNECT_INITIAL_MS),
    ("grpc.max_reconnect_backoff_ms", RECONNECT_MAX_MS),
]


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
