"""Capitals translated as text: a sentence in capitals reaches the model in the case it learnt (sentence case, a
word its vocabulary writes in fewer pieces capitalized, English's "I"), one character for one, and its translation
comes back in capitals, over HTTP, gRPC and the stream alike; an all-lower-case text is read in that case too where
its translation is lower-cased anyway. (The tiny model's words are not asserted, only which input it read and the
case of what comes back.)"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from proto import translate_pb2
from runtime.manifest import read_manifest
from runtime.tokenizer import Tokenizer
from server.documents import casing
from server.documents.formatting import mirror
from server.documents.text import TextLimits, segment_texts
from testkit.servers import RunningServer, http, start_server

LIMITS = TextLimits(batch_limit=16, char_limit=10_000, max_source_tokens=64, long_input_tokens=512, long_input="split")


def pieces_by_length(capitalized: set[str]):
    """A tokenizer whose vocabulary writes the words in ``capitalized`` in one piece capitalized and two lower-case,
    and every other word in one piece either way (a piece per character for anything else it is asked)."""

    def tokenize(texts: list[str]) -> list[list[int]]:
        out = []
        for text in texts:
            word = text.lower()
            if text.isalpha() and text.islower() and word in capitalized:
                out.append([1, 2])
            elif text.isalpha():
                out.append([1])
            else:
                out.append([ord(c) for c in text])
        return out

    return tokenize


def test_a_sentence_in_capitals_is_read_in_sentence_case_with_the_vocabularys_capitals():
    tokenize = pieces_by_length({"john", "york", "haired"})
    sentences = ["JOHN AND I WALK IN NEW YORK.", "„ZWEI HUNDE“ SPIELEN.", "STRASSE UND ÇA!", "A RED-HAIRED (JOHN)"]
    cased = casing.model_case(sentences, tokenize, "en")
    # "haired" inside "red-haired" is no word of its own: the vocabulary's "Haired" is not its case
    assert cased == ["John and I walk in new York.", "„Zwei hunde“ spielen.", "Strasse und ça!", "A red-haired (John)"]
    assert [len(c) for c in cased] == [len(s) for s in sentences]  # one character for one
    assert casing.model_case(["I SEE"], tokenize, "de") == ["I see"]  # "i" is a capital in English only
    assert casing.model_case(["İSTANBUL"], tokenize, "en") == ["İstanbul"]  # "İ".lower() is two characters: kept


@pytest.mark.parametrize(
    ("sentence", "capitals"),
    [("A MAN RIDES.", True), ("NASA", True), ("I", False), ("A.", False), ("The NASA launch.", False), ("123", False)],
)
def test_capitals_means_no_lower_case_letter_and_two_capitals(sentence: str, capitals: bool):
    assert casing.in_capitals(sentence) is capitals


def test_segments_keep_the_source_as_sent_and_mark_the_sentences_in_capitals():
    tokenize = pieces_by_length(set())
    text = "A man rides. TWO DOGS PLAY IN THE SNOW!"
    ((first, second),) = segment_texts([text], tokenize, LIMITS)
    assert (first.source, first.capitals) == ("A man rides.", False)
    assert (second.source, second.capitals) == ("TWO DOGS PLAY IN THE SNOW!", True)
    assert second.ids == tokenize(["Two dogs play in the snow!"])[0]
    assert first.ids == tokenize(["A man rides."])[0]
    lower = "a man rides. two dogs play."
    as_sent = segment_texts([lower], tokenize, LIMITS)[0]
    assert [s.ids for s in as_sent] == tokenize(["a man rides.", "two dogs play."])
    read = segment_texts([lower, "Mixed case. two dogs play."], tokenize, LIMITS, lower_case=True)
    assert [s.ids for s in read[0]] == tokenize(["A man rides.", "Two dogs play."])  # an all-lower-case text
    assert read[1][1].ids == tokenize(["two dogs play."])[0]  # not all lower case: read as sent
    assert not any(s.capitals for text in read for s in text)


def test_a_long_sentence_in_capitals_is_cut_with_each_part_as_sent():
    tokenize = pieces_by_length(set())
    words = " ".join(["WORD"] * 30) + ", " + " ".join(["OTHER"] * 30) + "."
    limits = TextLimits(16, 10_000, max_source_tokens=40, long_input_tokens=512, long_input="split")
    parts = segment_texts([words], tokenize, limits)[0]
    assert len(parts) > 1 and all(p.capitals for p in parts)
    assert all(p.source in words and p.source.isupper() for p in parts)
    assert all(len(p.ids) <= 40 for p in parts)
    assert tokenize([parts[0].source[0] + parts[0].source[1:].lower()])[0] == parts[0].ids


@pytest.fixture(scope="module")
def running(tiny_export: Path) -> Iterator[RunningServer]:
    server = start_server(tiny_export)
    yield server
    server.close()


def model_case(model: Path, sentence: str) -> str:
    tokenizer = Tokenizer.load(model, read_manifest(model, verify=False)["tokenizer"])
    return casing.model_case([sentence], tokenizer.encode_source, "en")[0]


def translated(running: RunningServer, q: str, **fields) -> str:
    status, _, body = http(running, "/translate", {"q": q, "source": "en", "target": "de", **fields})
    assert status == 200, body
    return body["translatedText"]


def test_capitals_come_back_in_capitals_on_every_front_door(running: RunningServer, tiny_export: Path):
    source = "TWO DOGS ARE PLAYING IN THE SNOW!"
    expected = translated(running, model_case(tiny_export, source), mirror_formatting=False).upper()
    assert expected and translated(running, source, mirror_formatting=False) == expected
    assert running.translate([source], mirror_formatting=False).translations[0].text == expected
    options = translate_pb2.TranslateOptions(mirror_formatting=False)
    stream = running.stub.TranslateStream(translate_pb2.TranslateRequest(texts=[source], options=options), timeout=30)
    (segment,) = list(stream)
    assert (segment.source, segment.translation) == (source, expected)
    html = translated(running, f"<p>{source}</p>", format="html", mirror_formatting=False)
    assert html.startswith("<p>") and html.endswith("</p>") and html[3:-4].upper() == html[3:-4]
    mixed = translated(running, f"A man sleeps. {source}", mirror_formatting=False)
    assert mixed.endswith(" " + expected)
    assert mixed.removesuffix(" " + expected) == translated(running, "A man sleeps.", mirror_formatting=False)


def test_an_all_lower_case_text_is_read_in_the_models_case_where_it_is_mirrored(
    running: RunningServer, tiny_export: Path
):
    source = "a girl in a red dress runs"
    cased = model_case(tiny_export, source)
    assert cased != source
    unmirrored = translated(running, source, mirror_formatting=False)
    assert unmirrored != translated(running, cased, mirror_formatting=False)  # the tiny model reads them apart
    assert translated(running, source) == mirror(source, translated(running, cased, mirror_formatting=False))
    assert running.translate([source], mirror_formatting=False).translations[0].text == unmirrored  # as sent


def test_german_capitalizes_the_form_its_vocabulary_ranks_more_common_where_both_take_as_many_pieces():
    ranks = {"kind": [40], "Kind": [7], "spielt": [9], "Spielt": [300], "der": [5], "Der": [50]}
    tokenize = lambda texts: [ranks.get(text, [ord(c) for c in text]) for text in texts]  # noqa: E731
    assert casing.model_case(["DER KIND SPIELT."], tokenize, "de") == ["Der Kind spielt."]
    assert casing.model_case(["DER KIND SPIELT."], tokenize, "en") == ["Der kind spielt."]  # a tie stays lower
