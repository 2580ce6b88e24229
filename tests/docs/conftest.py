"""What the docs tests share: a live ``python -m server`` of this checkout, serving the default models as
``make serve`` does (exporting them first where they are missing), on free ports."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from server.config import DEFAULT_MODELS
from testkit.servers import free_port, start_subprocess_server

EXPORT_AND_START_S = 600  # a fresh clone exports both default models before serving


@dataclass(frozen=True)
class LiveServer:
    grpc_port: int
    http_port: int
    metrics_port: int


@pytest.fixture(scope="session")
def live_server() -> Iterator[LiveServer]:
    first, *others = DEFAULT_MODELS
    more = [flag for folder in others for flag in ("--model", str(folder))]
    http_port = free_port()
    process, grpc_port, metrics_port = start_subprocess_server(
        first, *more, "--http-port", str(http_port), start_timeout_s=EXPORT_AND_START_S
    )
    try:
        yield LiveServer(grpc_port, http_port, metrics_port)
    finally:
        process.terminate()
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
