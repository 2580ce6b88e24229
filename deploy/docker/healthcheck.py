"""Container health check: ``python healthcheck.py [SERVICE]`` exits 0 while the server's gRPC
health service reports SERVING for SERVICE (default: the Translator service), 1 otherwise.

Docker's HEALTHCHECK and docker compose run it; Kubernetes probes the same health service
natively. The port is read as the server reads it (TRANSLATE_PORT, else the default), so the check
follows a port override made through the environment. Plaintext only: with TLS on, probe with
grpc_health_probe -tls instead.
"""

from __future__ import annotations

import sys

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from server.config import parse_config

TRANSLATOR_SERVICE = "translation.v1.Translator"


def main(argv: list[str]) -> int:
    service = argv[0] if argv else TRANSLATOR_SERVICE
    port = parse_config([]).port
    with grpc.insecure_channel(f"localhost:{port}") as channel:
        try:
            reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=service), timeout=3)
        except grpc.RpcError as error:
            print(f"unhealthy: {error.code().name}: {error.details()}", file=sys.stderr)
            return 1
    status = health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)
    print(f"{service or '(server)'}: {status}")
    return 0 if reply.status == health_pb2.HealthCheckResponse.SERVING else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
