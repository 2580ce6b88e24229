"""The pieces benchmarks/service_overhead.py splits the service's CPU with: the serving core driven in
process, and the model-less gRPC floor server."""

from __future__ import annotations

import asyncio
import sys
import time
from concurrent import futures
from pathlib import Path
from types import SimpleNamespace

import grpc

from proto import translate_pb2, translate_pb2_grpc
from testkit.sentences import own_sentences

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import grpc_floor  # noqa: E402
import service_overhead  # noqa: E402

from runtime import offline


def test_the_floor_server_answers_each_text_with_itself_after_its_delay(monkeypatch):
    events: list[str] = []

    async def sleep(seconds: float) -> None:
        events.append(f"asleep {seconds}")
        await asyncio.sleep(seconds)
        events.append("awake")

    monkeypatch.setattr(grpc_floor, "asyncio", SimpleNamespace(sleep=sleep))

    async def exchange() -> translate_pb2.TranslateResponse:
        server = grpc.aio.server()
        translate_pb2_grpc.add_TranslatorServicer_to_server(grpc_floor.Echo(0.2), server)
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
                reply = await translate_pb2_grpc.TranslatorStub(channel).Translate(
                    translate_pb2.TranslateRequest(texts=["one", "two"])
                )
                events.append("answered")
                return reply
        finally:
            await server.stop(None)

    reply = asyncio.run(exchange())
    assert [t.text for t in reply.translations] == ["one", "two"]
    assert events == ["asleep 0.2", "awake", "answered"]


def test_the_synchronous_floor_server_holds_a_thread_per_request_for_its_delay(monkeypatch):
    events: list[str] = []

    def sleep(seconds: float) -> None:
        events.append(f"asleep {seconds}")
        time.sleep(seconds)
        events.append("awake")

    monkeypatch.setattr(grpc_floor, "time", SimpleNamespace(sleep=sleep))
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    translate_pb2_grpc.add_TranslatorServicer_to_server(grpc_floor.SyncEcho(0.2), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            translate = translate_pb2_grpc.TranslatorStub(channel).Translate
            calls = [translate.future(translate_pb2.TranslateRequest(texts=[str(i)])) for i in range(3)]
            replies = [call.result(10) for call in calls]
    finally:
        server.stop(None)
    assert [r.translations[0].text for r in replies] == ["0", "1", "2"]
    assert sorted(events) == ["asleep 0.2"] * 3 + ["awake"] * 3
    third = [i for i, event in enumerate(events) if event.startswith("asleep")][2]
    assert events.index("awake") < third  # two threads: the third request waits until one of them is free


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


def test_offline_batches_go_by_length_or_in_arrival_order(tiny_export: Path, monkeypatch):
    from runtime.backend import OrtBackend
    from runtime.options import EngineSettings
    from runtime.translate_file import runtime_options

    model = OrtBackend(tiny_export, runtime_options(EngineSettings(provider="cpu", intra_op_threads=1)))
    texts = own_sentences(10)
    ids = model.tokenizer.encode_source(texts)
    translate_ids, batches = service_overhead.translate_ids, []

    def recording(backend, sources, *args):
        batches.append([list(s) for s in sources])
        return translate_ids(backend, sources, *args)

    monkeypatch.setattr(service_overhead, "translate_ids", recording)
    assert service_overhead.offline(model, texts, 4, 2, by_length=False) > 0
    assert sorted(batches) == sorted([ids[i : i + 4] for i in range(0, 10, 4)])  # consecutive, in file order
    batches.clear()
    service_overhead.offline(model, texts, 4, 2)

    def sorted_runs(batches: list[list[list[int]]]) -> bool:
        lengths = sorted(([len(s) for s in b] for b in batches), key=min)
        return all(max(a) <= min(b) for a, b in zip(lengths, lengths[1:], strict=False))

    assert sorted(len(s) for b in batches for s in b) == sorted(map(len, ids))
    assert sorted_runs(batches) and not sorted_runs([ids[i : i + 4] for i in range(0, 10, 4)])


def test_the_ort_clock_counts_cpu_inside_runs_only_while_entered(tiny_export: Path):
    from onnxruntime.capi import onnxruntime_inference_collection as collection

    from runtime.backend import OrtBackend
    from runtime.options import EngineSettings
    from runtime.translate_file import runtime_options

    model = OrtBackend(tiny_export, runtime_options(EngineSettings(provider="cpu", intra_op_threads=1)))
    sources = model.tokenizer.encode_source(own_sentences(6))
    originals = collection.Session.run, collection.Session.run_with_iobinding
    started = time.thread_time()
    with service_overhead.OrtClock() as clock:
        offline.translate_ids(model, sources, 2, 32)
    spent = time.thread_time() - started
    assert 0 < clock.seconds <= spent
    assert (collection.Session.run, collection.Session.run_with_iobinding) == originals
    counted = clock.seconds
    offline.translate_ids(model, sources, 2, 32)
    assert clock.seconds == counted
