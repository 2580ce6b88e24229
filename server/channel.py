"""How callers should reach the service: the gRPC service config that ``server.client`` and the load
generator use, and that the README shows for other languages' clients.

Round robin over every address the target resolves to (a headless Service's ``dns:///`` name gives one
per pod), and retries of ``UNAVAILABLE`` (a replica draining, restarting or unreachable: the request never
started, and a translation is idempotent anyway) with exponential backoff, at most 4 attempts within the
call's deadline. The other codes are not retried here (README: "Which codes a caller may retry").
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
                "retryableStatusCodes": ["UNAVAILABLE"],
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
