"""The module's in-process server (testkit/servers.py) on ephemeral ports, over the tiny exported model."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from testkit.servers import RunningServer, server_config


@pytest.fixture(scope="module")
def running(tiny_export: Path) -> Iterator[RunningServer]:
    server = RunningServer(server_config(tiny_export, max_batch_delay_ms=50.0, max_output_tokens=24))
    yield server
    server.close()
