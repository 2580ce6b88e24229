"""Language detection: /detect, source "auto" on both front ends, and its accuracy on Multi30k."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from common.corpus import corpus_path, read_lines
from proto import translate_pb2
from server.detect import LanguageDetector
from server.errors import InvalidRequest
from testkit.servers import RunningServer, free_port, http, server_config

GERMAN, ENGLISH = "Ein Mann fährt mit dem Fahrrad die Straße entlang.", "A man rides his bike down the street."


@pytest.fixture(scope="module")
def detector() -> LanguageDetector:
    return LanguageDetector(["en", "de"])


@pytest.fixture(scope="module")
def two(tiny_export: Path, tiny_reverse_export: Path) -> Iterator[RunningServer]:
    """en→de (tiny-test) and de→en (tiny-de-en), with the HTTP API."""
    server = RunningServer(
        server_config((tiny_export, tiny_reverse_export), http_port=free_port(), max_output_tokens=16)
    )
    yield server
    server.close()


def test_detection_names_the_language_best_first(detector: LanguageDetector):
    german, english = detector.detect(GERMAN), detector.detect(ENGLISH)
    assert german[0].language == "de" and english[0].language == "en"
    assert german[0].confidence > 99 and all(0 <= d.confidence <= 100 for d in german + english)
    assert detector.detect('<p class="note">Zwei <b>Hunde</b> spielen im Schnee.</p>', "html")[0].language == "de"


def test_text_without_words_is_undetectable(detector: LanguageDetector):
    assert detector.detect("12345 !!!") == []
    with pytest.raises(InvalidRequest, match="cannot be detected.*give the source language"):
        detector.best(["12345", "??"])


def test_one_served_language_needs_no_model():
    only = LanguageDetector(["en"])
    assert [d.language for d in only.detect("Ein Mann")] == ["en"] and only.detect("42") == []


def test_a_language_the_detector_does_not_know_is_refused():
    with pytest.raises(ValueError, match="no language detection for xx"):
        LanguageDetector(["en", "xx"])


def snippets(sentences: list[str]) -> list[str]:
    """Each sentence's first one, two or three words, in turn."""
    return [" ".join(s.split()[: 1 + i % 3]) for i, s in enumerate(sentences)]


def test_accuracy_on_multi30k(detector: LanguageDetector, multi30k: Path):
    """Sentences ≥ 99% (100% measured); 1-3-word snippets ≥ 90% (short text is where detectors differ)."""
    for language in ("en", "de"):
        sentences = read_lines(corpus_path(multi30k, "test_2016_flickr", language))
        for texts, floor in ((sentences, 0.99), (snippets(sentences), 0.90)):
            right = sum([d.language for d in detector.detect(text)][:1] == [language] for text in texts) / len(texts)
            assert right >= floor, f"{language}: {right:.1%} of {len(texts)} ({texts[0]!r}, ...)"


def test_http_detect_answers_as_libretranslate(two: RunningServer):
    status, _, body = http(two, "/detect", {"q": GERMAN})
    assert status == 200 and body[0]["language"] == "de" and body[0]["confidence"] > 99, body
    assert set(body[0]) == {"language", "confidence"}
    status, _, body = http(two, "/detect", {"q": ""})
    assert status == 400 and "missing q" in body["error"]


def test_http_auto_translates_with_the_detected_model(two: RunningServer):
    status, headers, auto = http(two, "/translate", {"q": GERMAN, "source": "auto", "target": "en"})
    status_given, _, given = http(two, "/translate", {"q": GERMAN, "source": "de", "target": "en"})
    assert status == status_given == 200, auto
    assert auto["translatedText"] == given["translatedText"] and headers["X-Translation-Model"].startswith("tiny-de-en")
    assert auto["detectedLanguage"]["language"] == "de" and auto["detectedLanguage"]["confidence"] > 99
    assert "detectedLanguage" not in given
    status, _, listed = http(two, "/translate", {"q": [ENGLISH, ENGLISH], "source": "auto", "target": "de"})
    assert status == 200 and [d["language"] for d in listed["detectedLanguage"]] == ["en", "en"], listed


def test_http_auto_errors_name_what_was_detected(two: RunningServer):
    status, _, body = http(two, "/translate", {"q": GERMAN, "source": "auto", "target": "de"})
    assert status == 400 and "detected 'de'" in body["error"] and "de→en" in body["error"], body
    status, _, body = http(two, "/translate", {"q": "1234", "source": "auto", "target": "en"})
    assert status == 400 and "cannot be detected" in body["error"], body


def test_grpc_detect_and_auto(two: RunningServer):
    found = two.stub.Detect(translate_pb2.DetectRequest(text=ENGLISH), timeout=10)
    assert found.languages[0].language == "en" and found.languages[0].confidence > 50
    request = translate_pb2.TranslateRequest(texts=[GERMAN], source_language="auto", target_language="en")
    response = two.stub.Translate(request, timeout=30)
    assert response.model.startswith("tiny-de-en@") and response.detected_language.language == "de"
    plain = two.stub.Translate(translate_pb2.TranslateRequest(texts=[GERMAN], source_language="de"), timeout=30)
    assert not plain.HasField("detected_language") and plain.translations[0].text == response.translations[0].text
    with pytest.raises(grpc.RpcError) as error:
        two.stub.Translate(translate_pb2.TranslateRequest(texts=["§§ 12"], source_language="auto"), timeout=10)
    assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "cannot be detected" in error.value.details()


def test_a_libretranslate_client_detects_and_translates_auto(two: RunningServer):
    libretranslatepy = pytest.importorskip("libretranslatepy")
    client = libretranslatepy.LibreTranslateAPI(f"http://127.0.0.1:{two.server.http_port}/")
    assert client.detect(GERMAN)[0]["language"] == "de"
    assert client.translate(GERMAN, "auto", "en") == client.translate(GERMAN, "de", "en")


def test_the_light_mode_still_names_sentences_and_off_refuses_auto():
    light = LanguageDetector(["en", "de"], "light")
    assert light.detect(GERMAN)[0].language == "de" and light.detect(ENGLISH)[0].language == "en"
    with pytest.raises(InvalidRequest, match=r"detection is off.*--language-detection off"):
        LanguageDetector(["en", "de"], "off").best([GERMAN])


def test_deep_translator_translates_auto(two: RunningServer):
    deep_translator = pytest.importorskip("deep_translator")
    url = f"http://127.0.0.1:{two.server.http_port}/"
    auto = deep_translator.LibreTranslator(source="auto", target="en", api_key="unused", custom_url=url)
    given = deep_translator.LibreTranslator(source="de", target="en", api_key="unused", custom_url=url)
    assert auto.translate(GERMAN) == given.translate(GERMAN)
