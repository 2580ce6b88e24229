"""How callers should reach the service: the gRPC service config that ``server.client`` and the load
generator use, and that the README shows for other languages' clients.

Round robin over every address the target resolves to (a headless Service's ``dns:///`` name gives one
per pod), and retries with exponential backoff, at most 4 attempts within the call's deadline, of
``UNAVAILABLE`` (a replica draining, restarting or unreachable) and ``CANCELLED``: gRPC cancels the calls
a server received in the instant it stops (seen in tests/server/test_faults.py's rolling restart), and a
caller's own cancellation ends the call, so it is never retried. A translation is idempotent, so a retry
never does harm. The other codes are not retried here (README: "Which codes a caller may retry").
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
                "maxAttempts": 4,
                "initialBackoff": "0.1s",
                "maxBackoff": "2s",
                "backoffMultiplier": 2,
                "retryableStatusCodes": ["UNAVAILABLE", "CANCELLED"],
            },
        }
    ],
}
CHANNEL_OPTIONS = [("grpc.service_config", json.dumps(SERVICE_CONFIG)), ("grpc.enable_retries", 1)]


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
