"""The module's in-process server (testkit/servers.py) on ephemeral ports, over the tiny exported model; a real
Redis for what replicas share."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from testkit.servers import RunningServer, server_config


@pytest.fixture(scope="module")
def running(tiny_export: Path) -> Iterator[RunningServer]:
    server = RunningServer(server_config(tiny_export, max_batch_delay_ms=50.0, max_output_tokens=24))
    yield server
    server.close()


@pytest.fixture(scope="module")
def redis_url(tmp_path_factory) -> Iterator[str]:
    if shutil.which("redis-server") is None:
        pytest.skip("redis-server not installed (Debian redis-server; .ci/run installs it)")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    folder = tmp_path_factory.mktemp("redis")
    process = subprocess.Popen(
        ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--dir", str(folder)],
        stdout=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                break
        time.sleep(0.05)
    yield f"redis://127.0.0.1:{port}/0"
    process.terminate()
    process.wait(10)
