"""Container health check: ``python healthcheck.py [SERVICE]`` exits 0 while the server's gRPC
health service reports SERVING for SERVICE (default: the Translator service), 1 otherwise.

Docker's HEALTHCHECK and docker compose run it; Kubernetes probes the same health service
natively over plaintext, and through this script (an exec probe) when TLS is on. It calls the IPv4
loopback (127.0.0.1) when the server listens on every address, as a cluster's callers do. The host,
port and whether TLS is on are read as the server reads them (TRANSLATE_PORT, TRANSLATE_TLS_CERT, ...), so
the check follows overrides made through the environment. With TLS it verifies the server against
TRANSLATE_HEALTHCHECK_CA (default: the server's own certificate file, for a self-signed one) by the
name TRANSLATE_HEALTHCHECK_SERVER_NAME (default localhost), and with mutual TLS presents
TRANSLATE_HEALTHCHECK_CERT and TRANSLATE_HEALTHCHECK_KEY (default: the server's own pair).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from server.config import ServerConfig, parse_config
from server.doors.listen import hostport, local_address

TRANSLATOR_SERVICE = "translation.v1.Translator"


def channel(config: ServerConfig) -> grpc.Channel:
    target = hostport(local_address(config.host), config.port)
    if config.tls_cert is None:
        return grpc.insecure_channel(target)
    environ = os.environ
    ca = Path(environ.get("TRANSLATE_HEALTHCHECK_CA", config.tls_cert)).read_bytes()
    key = cert = None
    if config.tls_client_ca is not None:  # mutual TLS: the server asks for a client certificate
        key = Path(environ.get("TRANSLATE_HEALTHCHECK_KEY", config.tls_key)).read_bytes()
        cert = Path(environ.get("TRANSLATE_HEALTHCHECK_CERT", config.tls_cert)).read_bytes()
    name = environ.get("TRANSLATE_HEALTHCHECK_SERVER_NAME", "localhost")
    credentials = grpc.ssl_channel_credentials(ca, key, cert)
    return grpc.secure_channel(target, credentials, options=[("grpc.ssl_target_name_override", name)])


def main(argv: list[str]) -> int:
    service = argv[0] if argv else TRANSLATOR_SERVICE
    with channel(parse_config([])) as health:
        try:
            reply = health_pb2_grpc.HealthStub(health).Check(health_pb2.HealthCheckRequest(service=service), timeout=3)
        except grpc.RpcError as error:
            print(f"unhealthy: {error.code().name}: {error.details()}", file=sys.stderr)
            return 1
    status = health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)
    print(f"{service or '(server)'}: {status}")
    return 0 if reply.status == health_pb2.HealthCheckResponse.SERVING else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
