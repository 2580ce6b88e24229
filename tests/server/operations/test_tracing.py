"""Traces: a request's span continues the caller's trace, carries its request ID, and has the spans of its
sentences' queue wait, encoding and decoding and of its detokenization (the SDK's in-memory exporter)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from proto import translate_pb2
from testkit.sentences import own_sentences
from testkit.servers import RunningServer, free_port, http, server_config

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
CALLER = f"00-{TRACE_ID}-00f067aa0ba902b7-01"  # a W3C traceparent: the caller's span


@pytest.fixture(scope="module")
def spans() -> InMemorySpanExporter:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    trace.set_tracer_provider(provider)  # once per process: the server's tracer is a proxy to it
    return exporter


@pytest.fixture(scope="module")
def server(tiny_export: Path, spans) -> Iterator[RunningServer]:
    running = RunningServer(server_config(tiny_export, max_output_tokens=16, http_port=free_port()))
    yield running
    running.close()


def request_tree(spans: InMemorySpanExporter, request_id: str) -> tuple[object, list]:
    finished = spans.get_finished_spans()
    (root,) = [s for s in finished if s.attributes.get("request.id") == request_id]
    children = [s for s in finished if s.parent is not None and s.parent.span_id == root.context.span_id]
    return root, children


def test_a_request_span_continues_the_callers_trace(server: RunningServer, spans):
    texts = own_sentences(2)
    _, call = server.stub.Translate.with_call(
        translate_pb2.TranslateRequest(texts=texts), metadata=(("traceparent", CALLER), ("x-request-id", "t-1"))
    )
    root, children = request_tree(spans, "t-1")
    assert root.name == "Translate" and format(root.context.trace_id, "032x") == TRACE_ID
    assert root.parent.span_id == int("00f067aa0ba902b7", 16) and root.attributes["rpc.status"] == "OK"
    names = sorted(s.name for s in children)
    assert names == sorted(["queue", "encode", "decode"] * 2 + ["detokenize"])
    for sentence in (0, 1):
        queue, encode, decode = (
            next(s for s in children if s.name == name and s.attributes.get("sentence") == sentence)
            for name in ("queue", "encode", "decode")
        )
        assert root.start_time <= queue.start_time <= queue.end_time <= encode.end_time <= decode.end_time
        assert decode.end_time <= root.end_time


def test_http_requests_and_errors_are_traced(server: RunningServer, spans):
    status, headers, _ = http(server, "/translate", {"q": "A man.", "source": "en", "target": "de"})
    root, children = request_tree(spans, headers["X-Request-ID"])
    assert status == 200 and root.name == "HTTP /translate" and {s.name for s in children} >= {"decode"}
    status, headers, _ = http(server, "/translate", {"q": "A man.", "source": "fr", "target": "de"})
    root, children = request_tree(spans, headers["X-Request-ID"])
    assert status == 400 and root.attributes["rpc.status"] == "INVALID_ARGUMENT" and children == []


def test_one_request_id_in_the_response_the_access_log_and_the_trace(server: RunningServer, spans, caplog):
    import json
    import logging

    caplog.set_level(logging.INFO, logger="server.operations.access")
    _, call = server.stub.Translate.with_call(translate_pb2.TranslateRequest(texts=["A dog runs."]))
    request_id = dict(call.trailing_metadata())["x-request-id"]  # generated: the caller sent none
    logged = [json.loads(r.getMessage()) for r in caplog.records if r.name == "server.operations.access"]
    assert [line["request_id"] for line in logged] == [request_id]
    root, children = request_tree(spans, request_id)
    assert root.name == "Translate" and children
