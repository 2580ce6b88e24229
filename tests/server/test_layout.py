"""Sentence splitting that keeps a text's layout: abbreviations, numbers and quotes stay inside their
sentence; line breaks, blank lines and indentation come back where they were, over gRPC and HTTP; the
command-line client translates a file with blank lines line for line."""

from __future__ import annotations

import io
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from server.documents.text import TextLimits, segment_texts, split_sentences
from testkit.sentences import own_sentences
from testkit.servers import RunningServer, free_port, http, server_config

PARAGRAPHS = [  # written for these tests, after real news and help-page paragraphs
    (
        "en",
        "Mr. Smith rides a bike to work. He lives 3.5 km away, e.g. near the U.S. border! "
        'His wife asked: "Is it safe?" He said yes.',
        [
            "Mr. Smith rides a bike to work.",
            "He lives 3.5 km away, e.g. near the U.S. border!",
            'His wife asked: "Is it safe?"',
            "He said yes.",
        ],
    ),
    (
        "en",
        "Dr. Jones arrived at 10 a.m. on Jan. 5. The meeting lasted two hours.",
        ["Dr. Jones arrived at 10 a.m. on Jan. 5.", "The meeting lasted two hours."],
    ),
    (
        "de",
        "Dr. Müller kam um 10 Uhr an. Er sagte: „Das ist gut.“ Dann ging er z. B. nach Hause.",
        ["Dr. Müller kam um 10 Uhr an.", "Er sagte: „Das ist gut.“", "Dann ging er z. B. nach Hause."],
    ),
    (
        "en",
        "Prices rose 2.5% in Q3. Sales fell... See p. 12 for details. Thanks, Prof. Lee!",
        ["Prices rose 2.5% in Q3.", "Sales fell...", "See p. 12 for details.", "Thanks, Prof. Lee!"],
    ),
]


@pytest.mark.parametrize(("language", "text", "sentences"), PARAGRAPHS)
def test_sentences_split_where_a_reader_would(language: str, text: str, sentences: list[str]):
    assert [sentence for sentence, _ in split_sentences(text, language)] == sentences


def test_the_text_is_its_sentences_and_separators():
    text = "  Title\n\nFirst line. Second sentence.\nThird line\n\n\n   Indented paragraph.  \n"
    pieces = split_sentences(text)
    assert pieces == [
        ("Title", "\n\n"),
        ("First line.", " "),
        ("Second sentence.", "\n"),
        ("Third line", "\n\n\n   "),
        ("Indented paragraph.", "  \n"),
    ]
    assert "  " + "".join(s + sep for s, sep in pieces) == text


def test_a_long_sentence_is_cut_at_clauses_and_words_keeping_its_separator():
    text = "one two three four five six\n\nseven eight, nine ten eleven."
    tokenize = lambda texts: [[len(w) for w in t.split()] for t in texts]  # noqa: E731
    specs = segment_texts([text], tokenize, TextLimits(4, -1, 100, 4, "split"))[0]
    assert [(s.source, s.separator, s.chunk) for s in specs] == [
        ("one two three", " ", 0),
        ("four five six", "\n\n", 1),
        ("seven eight,", " ", 0),
        ("nine ten eleven.", "", 1),
    ]


def test_a_one_sentence_text_is_tokenized_once_and_given_ids_not_again():
    calls: list[list[str]] = []

    def tokenize(texts: list[str]) -> list[list[int]]:
        calls.append(list(texts))
        return [[len(w) for w in t.split()] for t in texts]

    (specs,) = segment_texts(["A dog runs."], tokenize, TextLimits(4, -1, 100, 64, "split"))
    assert calls == [["A dog runs."]] and specs[0].ids == [1, 3, 5]
    calls.clear()
    (specs,) = segment_texts(["A dog runs."], tokenize, TextLimits(4, -1, 100, 64, "split"), tokenized=[[7, 8]])
    assert calls == [] and specs[0].ids == [7, 8]


@pytest.fixture(scope="module")
def server(tiny_export: Path) -> Iterator[RunningServer]:
    running = RunningServer(server_config(tiny_export, max_output_tokens=16, http_port=free_port()))
    yield running
    running.close()


def test_line_breaks_and_paragraphs_come_back_as_sent(server: RunningServer):
    a, b, c, d = own_sentences(4)
    sentences = server.translate([a, b, c, d], mirror_formatting=False).translations  # the layout alone
    t = [s.text for s in sentences]
    text = f"{a} {b}\n{c}\n\n  {d}\n"
    expected = f"{t[0]} {t[1]}\n{t[2]}\n\n  {t[3]}\n"
    assert server.translate([text], mirror_formatting=False).translations[0].text == expected
    fields = {"q": text, "source": "en", "target": "de", "mirror_formatting": False}
    status, _, body = http(server, "/translate", fields)
    assert (status, body["translatedText"]) == (200, expected)


def test_the_client_translates_a_file_with_blank_lines_line_for_line(server: RunningServer):
    lines = own_sentences(3)
    source = f"{lines[0]}\n\n{lines[1]}\n   \n{lines[2]}\n"
    expected = [t.text for t in server.translate(lines, mirror_formatting=False).translations]  # gRPC's default
    result = subprocess.run(
        [sys.executable, "-m", "client.client", "--target", f"127.0.0.1:{server.server.port}"],
        input=source,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [expected[0], "", expected[1], "", expected[2]]
    assert io.StringIO(source).read().count("\n") == result.stdout.count("\n")
