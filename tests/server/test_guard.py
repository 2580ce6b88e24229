"""Runaway output is stopped and flagged, and every translation carries its confidence, over gRPC.
The tiny random-weight model loops on almost any input ("rororo..."), which makes it a good adversary."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from proto import translate_pb2
from testkit.sentences import own_sentences
from testkit.servers import RunningServer, http, server_config, start_server

HOSTILE = [
    "J",
    "a",
    "ha " * 60,
    "!!!!!!!!!!!!!!!!",
    "😀😀😀😀😀😀",
    "ro ro ro ro ro ro ro ro",
    "Hello! How are you? I am fine.",
]


@pytest.fixture(scope="module")
def server(tiny_export: Path) -> Iterator[RunningServer]:
    running = RunningServer(server_config(tiny_export, max_output_tokens=256))
    yield running
    running.close()


def test_hostile_inputs_finish_within_the_guards_bound_flagged(server: RunningServer):
    repetition = {"model": "tiny-test", "reason": "repetition"}
    before = server.count("translate_output_guard_total", repetition)
    with ThreadPoolExecutor(len(HOSTILE)) as pool:  # under load: all at once, beside a beam search
        futures = [pool.submit(server.translate, [text]) for text in HOSTILE]
        beam = pool.submit(server.translate, HOSTILE[:3], beam=4)
        translations = [f.result().translations[0] for f in futures] + list(beam.result().translations)
    for translation in translations:  # never past the length bound of 2 x source + 10 tokens per sentence
        assert translation.output_tokens <= translation.segments * 10 + 2 * (
            translation.input_tokens + translation.segments
        )
    assert {t.guard for t in translations} <= {"", "repetition", "length"}
    flagged = sum(t.guard == "repetition" for t in translations)
    assert flagged >= len(translations) // 2
    # A text is flagged when one of its sentences was stopped; each stopped sentence is counted.
    counted = server.count("translate_output_guard_total", repetition) - before
    assert flagged <= counted <= sum(t.segments for t in translations), (flagged, counted)


def test_every_translation_carries_its_confidence(server: RunningServer):
    before = server.count("translate_confidence_count", {"model": "tiny-test"})
    sentences = own_sentences(3)
    translations = server.translate(sentences).translations
    assert all(-20 < t.confidence < 0 and not t.low_confidence for t in translations)
    request = translate_pb2.TranslateRequest(texts=[" ".join(sentences)])
    segments = list(server.stub.TranslateStream(request))
    assert [s.confidence for s in segments] == pytest.approx([t.confidence for t in translations], abs=1e-6)
    weights = [s.output_tokens + (s.guard == "") for s in segments]  # eos counts where it ended the sentence
    whole = server.translate([" ".join(sentences)]).translations[0].confidence
    assert whole == pytest.approx(
        sum(s.confidence * w for s, w in zip(segments, weights, strict=True)) / sum(weights), rel=0.05
    )
    observed = len(translations) + 2 * len(segments)  # the three sentences, streamed, then as one text
    assert server.count("translate_confidence_count", {"model": "tiny-test"}) - before == observed


def test_min_confidence_flags_and_never_drops(server: RunningServer):
    sentences = own_sentences(4)
    plain = server.translate(sentences, mirror_formatting=False).translations  # as gRPC answers by default
    scores = sorted(t.confidence for t in plain)
    threshold = (scores[1] + scores[2]) / 2  # two fall under it
    options = translate_pb2.TranslateOptions(min_confidence=threshold)
    flagged = server.stub.Translate(translate_pb2.TranslateRequest(texts=sentences, options=options)).translations
    assert [t.text for t in flagged] == [t.text for t in plain]
    assert [t.low_confidence for t in flagged] == [t.confidence < threshold for t in plain]
    assert sum(t.low_confidence for t in flagged) == 2
    segments = server.stub.TranslateStream(translate_pb2.TranslateRequest(texts=sentences, options=options))
    assert [s.low_confidence for s in segments] == [t.low_confidence for t in flagged]


def test_the_http_api_gives_confidence_and_flags(server: RunningServer, tiny_export: Path):
    running = start_server(tiny_export, max_output_tokens=256)
    try:
        sentences = own_sentences(2)
        expected = server.translate(sentences).translations
        status, _, body = http(running, "/translate", {"q": sentences, "source": "en", "target": "de"})
        assert status == 200 and body["confidence"] == pytest.approx([t.confidence for t in expected], abs=1e-4)
        status, _, body = http(running, "/translate", {"q": "J", "source": "en", "target": "de", "min_confidence": 0})
        assert status == 200 and "low_confidence" in body["flags"] and isinstance(body["confidence"], float)
        status, _, body = http(running, "/translate", {"q": "J", "source": "en", "target": "de", "min_confidence": "x"})
        assert status == 400 and "min_confidence='x' must be a number" in body["error"]
    finally:
        running.close()
