"""The module's in-process server (testkit/servers.py) on ephemeral ports, over the tiny exported model; a real
Redis for what replicas share."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from testkit.redis_server import RedisProcess
from testkit.servers import RunningServer, server_config


@pytest.fixture(scope="module")
def running(tiny_export: Path) -> Iterator[RunningServer]:
    server = RunningServer(server_config(tiny_export, max_batch_delay_ms=50.0, max_output_tokens=24))
    yield server
    server.close()


@pytest.fixture(scope="module")
def redis_url(tmp_path_factory) -> Iterator[str]:
    redis = RedisProcess(tmp_path_factory.mktemp("redis"))
    yield redis.url
    redis.stop()
