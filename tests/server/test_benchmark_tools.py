"""The pieces benchmarks/service_overhead.py splits the service's CPU with: the serving core driven in
process, and the model-less gRPC floor server."""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path

import grpc

from proto import translate_pb2, translate_pb2_grpc
from tests.conftest import own_sentences

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import grpc_floor  # noqa: E402
import service_overhead  # noqa: E402


def test_the_floor_server_answers_each_text_with_itself_after_its_delay():
    async def exchange() -> tuple[translate_pb2.TranslateResponse, float]:
        server = grpc.aio.server()
        translate_pb2_grpc.add_TranslatorServicer_to_server(grpc_floor.Echo(0.2), server)
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
                started = time.monotonic()
                reply = await translate_pb2_grpc.TranslatorStub(channel).Translate(
                    translate_pb2.TranslateRequest(texts=["one", "two"])
                )
                return reply, time.monotonic() - started
        finally:
            await server.stop(None)

    reply, seconds = asyncio.run(exchange())
    assert [t.text for t in reply.translations] == ["one", "two"]
    assert seconds >= 0.2


def test_the_in_process_core_translates_every_text_once(tiny_export: Path):
    core = service_overhead.Core(["--model", str(tiny_export), "--max-repeats", "0", "--warmup", "false"])
    try:
        texts = own_sentences(12)
        assert core.cpu(texts, clients=4) > 0
        tokens = core.scheduler.metrics.registry.get_sample_value(
            "translate_input_tokens_total", {"model": core.engine.name}
        )
        assert tokens == sum(len(ids) for ids in core.engine.tokenize(texts))
    finally:
        core.stop()
