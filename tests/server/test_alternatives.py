"""LibreTranslate's alternatives over HTTP and gRPC: up to N other translations per text from the beam's n-best,
the beam widened to N + 1, none unless asked for, and bad values refused by name."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from proto import translate_pb2
from testkit.sentences import own_sentences
from testkit.servers import RunningServer, http, start_server

LIBRETRANSLATE = {"source": "en", "target": "de"}


@pytest.fixture(scope="module")
def server(tiny_export: Path) -> Iterator[RunningServer]:
    running = start_server(tiny_export)  # greedy by default, max_beam_size 8
    yield running
    running.close()


def assert_alternatives(translation: str, alternatives, most: int) -> None:
    assert len(alternatives) <= most and len(set(alternatives)) == len(alternatives), alternatives
    assert translation not in alternatives and all(isinstance(a, str) and a for a in alternatives)


def test_grpc_gives_up_to_n_distinct_alternatives_from_a_beam_of_n_plus_one(server: RunningServer):
    sentences = own_sentences(6)
    response = server.translate(sentences, alternatives=3)
    for translation in response.translations:
        assert_alternatives(translation.text, translation.alternatives, 3)
    assert any(len(t.alternatives) == 3 for t in response.translations)
    beam_4 = server.translate(sentences, beam=4).translations
    assert [t.text for t in response.translations] == [t.text for t in beam_4]  # the beam was widened to 4
    assert not any(t.alternatives for t in beam_4)  # none unless asked for
    wider = server.translate(sentences, beam=6, alternatives=1).translations
    assert all(len(t.alternatives) <= 1 for t in wider) and any(t.alternatives for t in wider)


def test_a_texts_alternatives_join_its_sentences_alternatives(server: RunningServer):
    """Alternative i of a text of several sentences is each sentence's i-th alternative (as Argos Translate,
    LibreTranslate's engine, joins its sentences' hypotheses)."""
    text = "A man is walking on the street. Two dogs are playing in the park."
    options = translate_pb2.TranslateOptions(alternatives=2)
    segments = list(server.stub.TranslateStream(translate_pb2.TranslateRequest(texts=[text], options=options)))
    assert len(segments) == 2 and all(len(s.alternatives) == 2 for s in segments), segments
    for segment in segments:
        assert_alternatives(segment.translation, segment.alternatives, 2)
    whole = server.translate([text], alternatives=2, mirror_formatting=False).translations[0]  # as streamed
    assert whole.text == f"{segments[0].translation} {segments[1].translation}"
    assert list(whole.alternatives) == [f"{segments[0].alternatives[i]} {segments[1].alternatives[i]}" for i in (0, 1)]


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"alternatives": 8}, r"options.alternatives=8 needs a beam of 9, over the limit 8 \(max_beam_size\)"),
        ({"alternatives": 2, "beam_size": 9}, r"options.beam_size=9 is over the limit 8"),
    ],
)
def test_grpc_refuses_more_alternatives_than_the_largest_beam_allows(server: RunningServer, options, message):
    request = translate_pb2.TranslateRequest(texts=["A man."], options=translate_pb2.TranslateOptions(**options))
    with pytest.raises(grpc.RpcError) as error:
        server.stub.Translate(request)
    assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert re.search(message, error.value.details()), error.value.details()


def test_http_answers_alternatives_beside_the_translation_shaped_as_q(server: RunningServer):
    sentences = own_sentences(3)
    expected = server.translate(sentences, alternatives=2).translations
    status, _, body = http(server, "/translate", {"q": sentences, **LIBRETRANSLATE, "alternatives": 2})
    assert status == 200 and body["translatedText"] == [t.text for t in expected]
    assert body["alternatives"] == [list(t.alternatives) for t in expected] and any(body["alternatives"])
    for translation, alternatives in zip(body["translatedText"], body["alternatives"], strict=True):
        assert_alternatives(translation, alternatives, 2)
    status, _, body = http(server, "/translate", form={"q": sentences[0], **LIBRETRANSLATE, "alternatives": "2"})
    assert status == 200 and body["alternatives"] == list(expected[0].alternatives)  # a form's field is text


@pytest.mark.parametrize("alternatives", [0, "0", "", None])
def test_http_gives_no_alternatives_unless_asked(server: RunningServer, alternatives):
    fields = {"q": own_sentences(1)[0], **LIBRETRANSLATE, "alternatives": alternatives}
    status, _, body = http(server, "/translate", {k: v for k, v in fields.items() if v is not None})
    assert status == 200 and body["translatedText"] and "alternatives" not in body


def test_html_alternatives_keep_the_markup(server: RunningServer):
    q = "<p>A man is <b>walking</b> on the street.</p>"
    status, _, body = http(server, "/translate", {"q": q, **LIBRETRANSLATE, "format": "html", "alternatives": 3})
    assert status == 200 and body["alternatives"], body
    assert_alternatives(body["translatedText"], body["alternatives"], 3)
    for alternative in body["alternatives"]:
        assert alternative.startswith("<p>") and alternative.endswith("</p>") and alternative.count("</b>") == 1


@pytest.mark.parametrize(
    ("alternatives", "message"),
    [
        (-1, "alternatives=-1 must be 0 or more"),
        ("-2", "alternatives=-2 must be 0 or more"),
        (8, "alternatives=8 needs a beam of 9, over the limit 8 (max_beam_size): ask for at most 7"),
        ("two", "alternatives='two' must be a whole number"),
        (2.5, "alternatives=2.5 must be a whole number"),
        (True, "alternatives=True must be a whole number"),
        ([1], "alternatives=[1] must be a whole number"),
    ],
)
def test_http_refuses_a_bad_alternatives_with_a_400(server: RunningServer, alternatives, message: str):
    status, _, body = http(server, "/translate", {"q": "A man.", **LIBRETRANSLATE, "alternatives": alternatives})
    assert status == 400 and message in body["error"], body
