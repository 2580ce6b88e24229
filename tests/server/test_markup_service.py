"""Markup and placeholders over gRPC and HTTP, end to end on the tiny model: real-looking HTML comes
back well-formed with every tag, attribute and placeholder; bad markup is INVALID_ARGUMENT / 400."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from proto import translate_pb2
from server.documents.markup import parse
from server.doors.door import SHORT_REQUEST_CHARS
from testkit.sentences import own_sentences
from testkit.servers import RunningServer, http, start_server
from tests.runtime.spies import counted

SNIPPETS = [
    '<p>A man in a <b>red</b> shirt rides a <a href="https://example.com/?a=1&amp;b=2" title="Bikes &amp; more">bike'
    "</a>.</p>",
    "<ul><li>Two <i>dogs</i> play in the <em>white snow</em>.</li><li>A <b>young <i>girl</i></b> swims.</li></ul>",
    '<div class="card"><h2>Welcome, {name}!</h2><p>You have %d new messages at <a href="/inbox">your inbox</a>.'
    "</p></div>",
    '<p>A man <img src="man.png" alt="A man"/> with an <span class="notranslate">Acme</span> hat.<br>A dog'
    " &amp; a cat run.</p><script>if (a < b) { c = '<b>'; }</script>",
    "<table><tr><td>Price</td><td>€10.50 for 5 km</td></tr></table><!-- footer --><p>Mail jane@example.org or "
    "see <code>--help</code>.</p>",
]
PLACEHOLDERS = ["{name}", "{0}", "%s", "%1$s", "${x}", "https://example.com/a?b=1", "jane@example.org", "5 km"]


def start_tags(html: str) -> Counter:
    return Counter(re.findall(r"<[a-zA-Z][^>]*>", html))


def skeleton(html: str) -> list[str]:
    """The block structure: every tag but the inline ones that may move, in order."""
    return [t for t in re.findall(r"</?[a-zA-Z][^>]*>", html) if not re.match(r"</?(b|i|em|a|span)\b", t)]


@pytest.fixture(scope="module")
def server(tiny_export: Path) -> Iterator[RunningServer]:
    running = start_server(tiny_export, max_output_tokens=24)
    yield running
    running.close()


def translate(server: RunningServer, texts: list[str], format: str) -> translate_pb2.TranslateResponse:
    """Text as the model wrote it, as HTML is (not mirrored: server/documents/formatting.py)."""
    options = translate_pb2.TranslateOptions(format=format, mirror_formatting=False)
    return server.stub.Translate(translate_pb2.TranslateRequest(texts=texts, options=options))


def test_html_comes_back_well_formed_with_every_tag_and_attribute(server: RunningServer):
    translations = translate(server, SNIPPETS, "html").translations
    for snippet, translation in zip(SNIPPETS, translations, strict=True):
        out = translation.text
        parse(out, "html")  # well-formed, or MarkupError
        assert start_tags(out) == start_tags(snippet)
        assert skeleton(out) == skeleton(snippet)
        assert translation.output_tokens > 0 and translation.segments >= 1
    assert "<script>if (a < b) { c = '<b>'; }</script>" in translations[3].text
    assert "<!-- footer -->" in translations[4].text and "<code>--help</code>" in translations[4].text
    for protected in ["{name}", "%d", "€10.50", "5 km", "jane@example.org"]:
        assert sum(t.text.count(protected) for t in translations) == sum(s.count(protected) for s in SNIPPETS)


@pytest.mark.parametrize("format", ["text", "html"])
def test_placeholders_come_back_byte_identical(server: RunningServer, format: str):
    texts = [f"A man gives {p} to the dog." for p in PLACEHOLDERS]
    for placeholder, translation in zip(PLACEHOLDERS, translate(server, texts, format).translations, strict=True):
        assert translation.text.count(placeholder) == 1, translation.text


def test_text_without_markup_translates_as_plain_text(server: RunningServer):
    sentences = own_sentences(3)
    plain = [t.text for t in translate(server, sentences, "text").translations]
    assert [t.text for t in translate(server, sentences, "html").translations] == plain
    assert [t.text for t in translate(server, [f"<p>{s}</p>" for s in sentences], "html").translations] == [
        f"<p>{t}</p>" for t in plain
    ]


@pytest.mark.parametrize(
    ("text", "format", "message"),
    [
        ("<p>A <b>man</p>", "html", "</p> at line 1, column 12 while <b> from line 1, column 6 is still open"),
        ("<p>never closed", "html", "<p> at line 1, column 1 is never closed"),
        ("A dog.", "xml", "format='xml' is not supported; use one of text, html"),
    ],
)
def test_bad_markup_is_invalid_argument_and_the_server_stays_up(server: RunningServer, text, format, message):
    with pytest.raises(grpc.RpcError) as error:
        translate(server, [text], format)
    assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT and message in error.value.details()
    assert translate(server, ["A dog."], "html").translations[0].text


def test_streaming_takes_plain_text_only(server: RunningServer):
    request = translate_pb2.TranslateRequest(
        texts=["<b>A dog.</b>"], options=translate_pb2.TranslateOptions(format="html")
    )
    with pytest.raises(grpc.RpcError) as error:
        list(server.stub.TranslateStream(request))
    assert (
        error.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "use Translate for markup" in error.value.details()
    )


def test_http_format_html_answers_as_grpc_does(server: RunningServer):
    expected = [t.text for t in translate(server, SNIPPETS[:2], "html").translations]
    status, _, body = http(server, "/translate", {"q": SNIPPETS[:2], "source": "en", "target": "de", "format": "html"})
    assert (status, body["translatedText"]) == (200, expected)


def test_a_short_requests_markup_is_placed_from_its_sentences_own_encoder_call(server: RunningServer):
    """A short request's sentences with markup keep their encoder's output from their decoding, so placing the
    markup encodes none of them again; a document's (over SHORT_REQUEST_CHARS) are encoded again, not held while the
    rest of it decodes."""
    engine = next(iter(server.server.scheduler.engines.values()))
    aligner, calls = engine.backend.aligner, Counter()
    encode = aligner.encode
    aligner.encode = counted(calls, "encode", encode)
    fresh = own_sentences(120)[100:]  # not translated by this module's other tests (the cache would answer them)
    try:
        short = [f"<p>{sentence[:12]}<b>{sentence[12:]}</b></p>" for sentence in fresh[:2]]
        translations = translate(server, short, "html").translations
        assert [start_tags(t.text) for t in translations] == [start_tags(s) for s in short]
        assert calls["encode"] == 0
        document = "<p><b>" + " ".join(fresh[2:] + own_sentences(60)) + "</b></p>"
        assert len(document) > SHORT_REQUEST_CHARS
        translate(server, [document], "html")
        assert calls["encode"] > 0
    finally:
        aligner.encode = encode
