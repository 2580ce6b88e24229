"""The three front doors answer a request alike: gRPC Translate, gRPC TranslateStream (its sentences put back
together as a client does) and HTTP POST /translate give the same translations, alternatives and glossary terms for
the same texts; markup goes through Translate and HTTP only. Mirroring is off on every door (gRPC's default, HTTP's
mirror_formatting=false) except where a test compares it."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from proto import translate_pb2
from server.documents import casing
from server.documents.formatting import mirror
from testkit.sentences import OWN_SENTENCES, own_sentences
from testkit.servers import RunningServer, http, start_server

ENGLISH = [english for english, _ in OWN_SENTENCES]
# Sentences on lines, and a blank line and an indent between its paragraphs: the layout a client puts back
LONG_TEXT = f"{ENGLISH[0]} {ENGLISH[1]}\n{ENGLISH[2]}\n\n  {ENGLISH[3]} {ENGLISH[4]}"
GLOSSARY = {"man": "Kerl", "black dog": "Rabenhund"}  # "man" is in ENGLISH[0] and ENGLISH[9], "black dog" in ENGLISH[6]


@pytest.fixture(scope="module")
def server(tiny_export: Path) -> Iterator[RunningServer]:
    running = start_server(tiny_export)  # greedy by default, max_beam_size 8
    yield running
    running.close()


def request(texts: list[str], **options) -> translate_pb2.TranslateRequest:
    return translate_pb2.TranslateRequest(
        texts=texts, source_language="en", target_language="de", options=translate_pb2.TranslateOptions(**options)
    )


def by_translate(server: RunningServer, texts: list[str], **options) -> list[translate_pb2.Translation]:
    return list(server.stub.Translate(request(texts, **options)).translations)


def by_stream(server: RunningServer, texts: list[str], **options) -> list[tuple[str, list[str], dict[str, int]]]:
    """Each text's translation, alternatives and glossary terms applied from its streamed sentences, as a client
    puts them together: each sentence's translation in place of its source in the text, the whitespace around
    them kept; alternative i takes each sentence's i-th alternative, or its translation where it has fewer."""
    segments = list(server.stub.TranslateStream(request(texts, **options)))
    answers = []
    for t, text in enumerate(texts):
        parts = [s for s in segments if s.text_index == t]
        assert [s.segment_index for s in parts] == list(range(len(parts)))
        assert [s.last_in_text for s in parts] == [False] * (len(parts) - 1) + [True]
        translation = in_place(text, parts, [s.translation for s in parts])
        count = max(len(s.alternatives) for s in parts)
        alternatives = [
            in_place(text, parts, [s.alternatives[i] if i < len(s.alternatives) else s.translation for s in parts])
            for i in range(count)
        ]
        applied = dict(sum((Counter(s.glossary_applied) for s in parts), Counter()))
        answers.append((translation, [a for a in dict.fromkeys(alternatives) if a != translation], applied))
    return answers


def in_place(text: str, segments: list[translate_pb2.TranslationSegment], translations: list[str]) -> str:
    """The text with each segment's source replaced by its translation."""
    pieces, position = [], 0
    for segment, translation in zip(segments, translations, strict=True):
        start = text.index(segment.source, position)
        pieces += [text[position:start], translation]
        position = start + len(segment.source)
    return "".join(pieces) + text[position:]


def by_http(server: RunningServer, texts: list[str], **fields) -> dict:
    status, _, body = http(server, "/translate", {"q": texts, "source": "en", "target": "de", **fields})
    assert status == 200, body
    return body


@pytest.mark.parametrize(
    "texts",
    [[ENGLISH[1]], ENGLISH[:6], [LONG_TEXT, ENGLISH[7]]],
    ids=["one sentence", "several texts", "several sentences and lines"],
)
def test_the_doors_give_the_same_translations(server: RunningServer, texts: list[str]):
    """Each text's translation is the same through every door, its lines kept."""
    translated = [t.text for t in by_translate(server, texts)]
    assert [text for text, _, _ in by_stream(server, texts)] == translated
    assert by_http(server, texts, mirror_formatting=False)["translatedText"] == translated
    assert [t.count("\n") for t in translated] == [t.count("\n") for t in texts] and all(translated)


@pytest.mark.parametrize("texts", [own_sentences(4), [LONG_TEXT]], ids=["sentences", "several sentences and lines"])
def test_the_doors_give_the_same_alternatives(server: RunningServer, texts: list[str]):
    """Two alternatives widen the greedy default beam to 3 on every door."""
    translated = by_translate(server, texts, alternatives=2)
    expected = [(t.text, list(t.alternatives)) for t in translated]
    assert [(text, alternatives) for text, alternatives, _ in by_stream(server, texts, alternatives=2)] == expected
    body = by_http(server, texts, alternatives=2, mirror_formatting=False)
    assert list(zip(body["translatedText"], body["alternatives"], strict=True)) == expected
    assert any(alternatives for _, alternatives in expected)


def test_the_doors_apply_a_glossary_alike(server: RunningServer):
    """A request's own glossary gives the same translations and the same terms applied through every door."""
    texts = [ENGLISH[0], ENGLISH[6], ENGLISH[9], ENGLISH[1]]
    translated = by_translate(server, texts, glossary=GLOSSARY)
    expected = [(t.text, dict(t.glossary_applied)) for t in translated]
    assert [applied for _, applied in expected] == [{"man": 1}, {"black dog": 1}, {"man": 1}, {}]
    assert "Kerl" in expected[0][0] and "Rabenhund" in expected[1][0]
    assert [(text, applied) for text, _, applied in by_stream(server, texts, glossary=GLOSSARY)] == expected
    body = by_http(server, texts, glossary=GLOSSARY, mirror_formatting=False)
    assert list(zip(body["translatedText"], body["glossaryApplied"], strict=True)) == expected


def test_translate_and_http_keep_markup_alike_and_the_stream_refuses_it(server: RunningServer):
    """HTML gets the same translation from Translate and HTTP; TranslateStream takes plain text only."""
    texts = [f"<p>{ENGLISH[0]}</p><p>A <b>black dog</b> is running.</p>", f'<a href="/x">{ENGLISH[2]}</a>']
    translated = [t.text for t in by_translate(server, texts, format="html")]
    assert by_http(server, texts, format="html")["translatedText"] == translated
    assert translated[0].startswith("<p>") and translated[1].startswith('<a href="/x">')
    with pytest.raises(grpc.RpcError) as refused:
        by_stream(server, texts, format="html")
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "use Translate" in refused.value.details()


def test_translate_mirrors_as_http_does_when_asked(server: RunningServer):
    """gRPC's mirror_formatting=true finishes texts (sentence case, lower case, capitals) as HTTP does by default."""
    texts = [ENGLISH[0], ENGLISH[1].lower().rstrip("."), ENGLISH[2].upper()]
    mirrored = [t.text for t in by_translate(server, texts, mirror_formatting=True)]
    assert by_http(server, texts)["translatedText"] == mirrored
    assert mirrored != [t.text for t in by_translate(server, texts)]


def test_only_http_mirrors_by_default(server: RunningServer):
    """gRPC without mirror_formatting answers the model's output for the text as sent; HTTP, by default, translates
    an all-lower-case text as the model reads it (server/documents/casing.py) and mirrors the source's case and final
    punctuation onto that translation (server/documents/formatting.py)."""
    text = ENGLISH[1].lower().rstrip(".")
    (model_output,) = by_translate(server, [text])
    assert by_stream(server, [text])[0][0] == model_output.text
    engine = server.server.models.default
    (as_read,) = casing.model_case([text], engine.tokenize, engine.source_language)
    (read_output,) = by_translate(server, [as_read])
    mirrored = mirror(text, read_output.text)
    assert by_http(server, [text])["translatedText"] == [mirrored]
    assert mirrored != model_output.text


def test_a_glossary_leaves_mirroring_as_it_is(server: RunningServer):
    """HTTP's default mirroring finishes every text of a request with a glossary: a text without a term as without
    the glossary, one with a term as its model output with the source's final punctuation and case."""
    texts = [ENGLISH[1], ENGLISH[0], ENGLISH[1].lower().rstrip(".")]
    plain = by_http(server, texts)["translatedText"]
    glossed = by_http(server, texts, glossary=GLOSSARY)["translatedText"]
    assert [glossed[0], glossed[2]] == [plain[0], plain[2]]
    (output,) = by_translate(server, [ENGLISH[0]], glossary=GLOSSARY)
    assert "Kerl" in output.text and glossed[1] == mirror(ENGLISH[0], output.text)
