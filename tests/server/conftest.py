"""An in-process server on ephemeral ports, over the tiny exported model."""

from __future__ import annotations

import asyncio
import dataclasses
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from proto import translate_pb2, translate_pb2_grpc
from server.app import Server, create_server
from server.config import ServerConfig


class RunningServer:
    """The aio server on its own event loop thread; tests talk to it with sync stubs."""

    def __init__(self, config: ServerConfig) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.server: Server = self.call(self._create(config))
        self.channel = grpc.insecure_channel(f"127.0.0.1:{self.server.port}")
        self.stub = translate_pb2_grpc.TranslatorStub(self.channel)

    async def _create(self, config: ServerConfig) -> Server:
        server = create_server(config)
        await server.start()
        return server

    def call(self, coroutine, timeout: float = 120):
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout)

    def translate(
        self, texts: list[str], beam: int = 0, alternatives: int = 0, **kwargs
    ) -> translate_pb2.TranslateResponse:
        options = translate_pb2.TranslateOptions(beam_size=beam, alternatives=alternatives)
        return self.stub.Translate(translate_pb2.TranslateRequest(texts=texts, options=options), **kwargs)

    def metric(self, name: str, labels: dict[str, str] | None = None) -> float | None:
        """The sum of the samples named ``name`` whose labels include ``labels`` (None when there are none)."""
        wanted = (labels or {}).items()
        values = [
            sample.value
            for family in self.server.metrics.registry.collect()
            for sample in family.samples
            if sample.name == name and wanted <= sample.labels.items()
        ]
        return sum(values) if values else None

    def wait_for_metric(self, name: str, value: float, timeout: float = 5.0) -> float | None:
        """The metric once it equals value (gauges update right after the answer goes out)."""
        deadline = time.monotonic() + timeout
        while self.metric(name) != value and time.monotonic() < deadline:
            time.sleep(0.01)
        return self.metric(name)

    def close(self) -> None:
        self.channel.close()
        self.call(self.server.drain())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


def server_config(model: Path | tuple[Path, ...], **overrides) -> ServerConfig:
    base = ServerConfig(
        model=model,
        provider="cpu",
        port=0,
        metrics_port=0,
        http_port=0,
        warmup=False,
        grace_seconds=5.0,
        cache_mib=0,  # the engine answers every sentence (test_cache.py turns the cache on)
    )
    return dataclasses.replace(base, **overrides)


@pytest.fixture(scope="module")
def running(tiny_export: Path) -> Iterator[RunningServer]:
    server = RunningServer(server_config(tiny_export, max_batch_delay_ms=50.0, max_output_tokens=24))
    yield server
    server.close()
