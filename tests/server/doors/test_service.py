from __future__ import annotations

import re
import threading
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from proto import translate_pb2
from runtime import offline
from runtime.backend import OrtBackend
from runtime.options import EngineSettings, RuntimeOptions
from runtime.stops import RepetitionGuard
from testkit.sentences import own_sentences
from testkit.servers import RunningServer, server_config


@pytest.mark.parametrize("beam", [1, 3])
def test_translations_equal_the_runtime_decoder(running: RunningServer, tiny_export: Path, beam: int):
    sentences = own_sentences(12)
    expected = offline.translate(
        OrtBackend(tiny_export, RuntimeOptions(settings=EngineSettings(provider="cpu"))),
        sentences,
        beam=beam,
        max_output_tokens=24,
        stop_rules=(RepetitionGuard(),),  # the server's runaway-output guard
    )
    response = running.translate(sentences, beam=beam, mirror_formatting=False)  # as the decoder wrote them
    assert [t.text for t in response.translations] == expected
    assert all(t.input_tokens > 0 and t.segments == 1 for t in response.translations)
    assert response.model.startswith("tiny-test@")


def test_concurrent_requests_are_batched_with_identical_results(running: RunningServer):
    sentences = own_sentences(32)
    one_by_one = [running.translate([s]).translations[0].text for s in sentences]
    batches_before = running.metric("translate_batch_size_sentences_count")
    with ThreadPoolExecutor(32) as pool:
        concurrent = list(pool.map(lambda s: running.translate([s]).translations[0].text, sentences))
    batches = running.metric("translate_batch_size_sentences_count") - batches_before
    assert concurrent == one_by_one
    assert batches < len(sentences), f"{batches} encoder batches for {len(sentences)} requests"


def test_stream_returns_sentences_in_order(running: RunningServer):
    text = "A man is walking on the street. Two dogs are playing in the park! A woman is sitting."
    request = translate_pb2.TranslateRequest(texts=[text, "A cat is sleeping."])
    segments = list(running.stub.TranslateStream(request))
    assert [(s.text_index, s.segment_index) for s in segments] == [(0, 0), (0, 1), (0, 2), (1, 0)]
    assert [s.last_in_text for s in segments] == [False, False, True, True]
    singles = running.translate([s.source for s in segments], mirror_formatting=False).translations  # as streamed
    assert [s.translation for s in segments] == [t.text for t in singles]


def test_a_target_that_is_the_source_answers_the_texts_as_sent(running: RunningServer):
    """As over HTTP and in LibreTranslate: en to en (in any case), or auto on texts with nothing to detect, gives
    the texts back without a model, streamed too."""
    decoded = running.count("translate_confidence_count")
    texts = ["A man is walking. Two dogs are playing.", "a cat is sleeping"]
    same = translate_pb2.TranslateRequest(texts=texts, source_language="en", target_language="EN")
    response = running.stub.Translate(same, timeout=30)
    assert [t.text for t in response.translations] == texts and response.model == ""
    assert not response.HasField("detected_language")
    segments = [(s.text_index, s.translation, s.last_in_text) for s in running.stub.TranslateStream(same, timeout=30)]
    assert segments == [(0, texts[0], True), (1, texts[1], True)]
    letterless = translate_pb2.TranslateRequest(texts=["🙂 👍", "12:30"], source_language="auto", target_language="de")
    response = running.stub.Translate(letterless, timeout=30)
    assert [t.text for t in response.translations] == ["🙂 👍", "12:30"]
    assert (response.detected_language.language, response.detected_language.confidence) == ("de", 0.0)
    english = translate_pb2.TranslateRequest(texts=texts[:1], source_language="auto", target_language="en")
    response = running.stub.Translate(english, timeout=30)
    assert (response.translations[0].text, response.detected_language.language) == (texts[0], "en")
    assert running.count("translate_confidence_count") == decoded
    unknown = translate_pb2.TranslateRequest(texts=["Hi."], source_language="zz", target_language="zz")
    with pytest.raises(grpc.RpcError) as error:
        running.stub.Translate(unknown, timeout=30)
    assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "source='zz'" in error.value.details()


def test_an_inference_thread_wakes_the_event_loop_once_per_segment(running: RunningServer, monkeypatch):
    """Each wake-up of the event loop from an inference thread costs both threads CPU (a self-pipe write and
    read): a finished segment wakes it once, and a job that ends well needs no extra word."""
    wakeups = []
    real = running.loop.call_soon_threadsafe

    def counted(callback, *args, **kwargs):
        if threading.current_thread().name.startswith("inference-"):
            wakeups.append(callback)
        return real(callback, *args, **kwargs)

    monkeypatch.setattr(running.loop, "call_soon_threadsafe", counted)
    text = "A man is walking on the street. Two dogs are playing in the park! A woman is sitting."
    response = running.translate([text, "A cat is sleeping."])
    assert [t.segments for t in response.translations] == [3, 1]
    assert len(wakeups) == 4


@pytest.mark.parametrize(
    ("texts", "options", "message"),
    [
        ([], {}, "texts: at least one text is required"),
        (["A man.", "  "], {}, r"texts\[1\] is empty"),
        (["A man.", "\u200b\ufeff\x7f"], {"pass_through": False}, r"texts\[1\] has nothing to translate"),
        (["a " * 30_000] * 2, {}, r"texts: 120,000 characters, over the limit of 100,000 \(char_limit\)"),
        (["A man."], {"beam_size": 9}, r"options.beam_size=9 is over the limit 8"),
        (["A man."], {"max_output_tokens": 1000}, r"options.max_output_tokens=1000 is over the limit 24"),
    ],
)
def test_invalid_requests_name_the_field(running: RunningServer, texts, options, message):
    request = translate_pb2.TranslateRequest(texts=texts, options=translate_pb2.TranslateOptions(**options))
    with pytest.raises(grpc.RpcError) as error:
        running.stub.Translate(request)
    assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert re.search(message, error.value.details()), error.value.details()
    assert running.translate(["A man is walking."]).translations[0].text  # still serving


def test_model_info_health_and_reflection(running: RunningServer):
    info = running.stub.GetModelInfo(translate_pb2.GetModelInfoRequest())
    assert (info.name, info.source_language, info.target_language, info.provider) == ("tiny-test", "en", "de", "cpu")
    assert (
        info.limits.max_texts == 0 and info.limits.max_output_tokens == 24 and info.limits.long_input_policy == "split"
    )
    health = health_pb2_grpc.HealthStub(running.channel)
    for service in ("", "translation.v1.Translator"):
        assert (
            health.Check(health_pb2.HealthCheckRequest(service=service)).status
            == health_pb2.HealthCheckResponse.SERVING
        )
    stub = reflection_pb2_grpc.ServerReflectionStub(running.channel)
    responses = stub.ServerReflectionInfo(iter([reflection_pb2.ServerReflectionRequest(list_services="")]))
    names = {s.name for r in responses for s in r.list_services_response.service}
    assert {"translation.v1.Translator", "grpc.health.v1.Health"} <= names


DOCUMENTED_METRICS = [
    "translate_requests_total",
    "translate_request_duration_seconds_bucket",
    "translate_queue_wait_seconds_bucket",
    "translate_encoder_duration_seconds_bucket",
    "translate_decoder_step_duration_seconds_bucket",
    "translate_batch_size_sentences_bucket",
    "translate_batch_size_tokens_bucket",
    "translate_batch_padding_ratio_bucket",
    "translate_input_tokens_total",
    "translate_output_tokens_total",
    "translate_queue_depth",
    "translate_inflight_sequences",
    "translate_kv_cache_bytes",
    "translate_memory_budget_bytes",
    "translate_attention_scores_bytes",
    "translate_model_info",
    "process_resident_memory_bytes",
    "translate_cross_attention_cache_bytes",
    "translate_decode_batch_rows_bucket",
    "translate_thread_cpu_seconds_total",
    "translate_lane_paused_seconds_total",
]


def test_metrics_port_exposes_documented_metrics(running: RunningServer):
    before = running.count("translate_input_tokens_total")
    running.translate(["A man is walking.", "walking " * 100 + "."])
    body = urllib.request.urlopen(f"http://127.0.0.1:{running.server.metrics_port}/metrics", timeout=10).read().decode()
    for name in DOCUMENTED_METRICS:
        assert f"\n{name}" in body, name
    assert 'length_bucket="1-16"' in body and 'length_bucket="65-128"' in body
    assert running.metric("translate_memory_budget_bytes") == 512 * 2**20
    assert running.count("translate_input_tokens_total") - before > 100
    assert running.metric("process_resident_memory_bytes") > 10 * 2**20
    assert running.wait_for_metric("translate_inflight_sequences", 0) == 0
    assert running.metric("translate_attention_scores_bytes") > 0


def test_deadline_exceeded_frees_everything(running: RunningServer):
    with pytest.raises(grpc.RpcError) as error:
        running.translate(own_sentences(40), beam=4, timeout=0.001)
    assert error.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    running.translate(["A man is walking."])  # the queue moved on
    assert running.wait_for_metric("translate_inflight_sequences", 0) == 0
    assert running.wait_for_metric("translate_kv_cache_bytes", 0) == 0


@pytest.mark.parametrize(
    ("policy", "code"), [("reject", grpc.StatusCode.INVALID_ARGUMENT), ("truncate", None), ("split", None)]
)
def test_long_input_policies(tiny_export: Path, policy: str, code):
    server = RunningServer(server_config(tiny_export, long_input=policy, long_input_tokens=20, max_output_tokens=16))
    try:
        text = "A man is walking on the street near the water. " * 6
        if code is not None:
            with pytest.raises(grpc.RpcError) as error:
                server.translate([text])
            assert error.value.code() == code and "long-input policy is reject" in error.value.details()
        else:
            translation = server.translate([text]).translations[0]
            assert translation.truncated == (policy == "truncate")
            assert translation.input_tokens <= 20 if policy == "truncate" else translation.segments == 6
        assert server.metric("translate_long_inputs_total", {"policy": policy}) == 1
    finally:
        server.close()


def test_request_over_the_memory_budget_is_refused_at_once(tiny_export: Path):
    server = RunningServer(server_config(tiny_export, memory_budget_mib=1))
    try:
        with pytest.raises(grpc.RpcError) as error:
            server.translate(["walking " * 1000 + "."], beam=8)
        assert error.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "over the memory budget of 1 MiB" in error.value.details()
        assert server.translate(["A man is walking."]).translations[0].text
    finally:
        server.close()
