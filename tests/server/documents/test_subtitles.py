"""Subtitles (server/documents/subtitles.py): what of a cue is translated, and the file written back around
translations."""

from __future__ import annotations

import pytest

from server.documents.subtitles import read_subtitles
from server.errors import InvalidRequest

FILM = (
    "1\r\n00:00:01,000 --> 00:00:02,500\r\n{\\an8}<i>A man in a blue shirt\r\nis walking down the street.</i>\r\n\r\n"
    "2\r\n00:00:03,000 --> 00:00:04,000\r\n- A <b>black</b> dog runs.\r\n-<font color=red>Tom</font> & Jerry.\r\n\r\n"
    "3\r\n00:00:05,000 --> 00:00:06,000\r\n<i>- I told him\r\nto go.\r\n- -5 degrees.</i>\r\n"
)


def test_a_cue_is_a_text_per_speaker_with_its_breaks_and_inner_tags():
    texts, _ = read_subtitles(FILM, "film.srt", vtt=False)
    assert texts == [
        "A man in a blue shirt <!--0-->is walking down the street.",
        'A <span data-cue="0">black</span> dog runs.',
        '<span data-cue="0">Tom</span> &amp; Jerry.',
        "I told him <!--0-->to go.",
        "-5 degrees.",  # a minus sign, not a dash
    ]


def test_what_is_read_writes_back_byte_for_byte():
    texts, write = read_subtitles(FILM, "film.srt", vtt=False)
    assert write(texts) == FILM
    vtt = "WEBVTT\n\nNOTE kept\n\n00:01.000 --> 00:02.000 line:0\n<v Bob>Tom &amp; Jerry &lt;3</v>\n<00:01.500>go.\n"
    texts, write = read_subtitles(vtt, "film.vtt", vtt=True)
    assert texts == ['<span data-cue="0">Tom &amp; Jerry &lt;3</span> <!--1--><!--2-->go.'] and write(texts) == vtt


def test_translations_are_written_in_the_files_terms():
    _, write = read_subtitles(FILM, "film.srt", vtt=False)
    out = write(
        [
            "Ein Mann im blauen Hemd <!--0--> geht die Straße entlang.",
            'Ein <span data-cue="0">schwarzer</span> Hund rennt.',
            '<span data-cue="0">Tom</span> &amp; Jerry.',
            "Ich sagte ihm, <!--0--> er solle gehen.",
            "-5 Grad.",
        ]
    )
    assert [cue.split("\r\n")[:2] for cue in out.split("\r\n\r\n")] == [
        cue.split("\r\n")[:2] for cue in FILM.split("\r\n\r\n")
    ]
    assert [cue.rstrip("\r\n").split("\r\n")[2:] for cue in out.split("\r\n\r\n")] == [
        ["{\\an8}<i>Ein Mann im blauen Hemd", "geht die Straße entlang.</i>"],
        ["- Ein <b>schwarzer</b> Hund rennt.", "-<font color=red>Tom</font> & Jerry."],
        ["<i>- Ich sagte ihm,", "er solle gehen.", "- -5 Grad.</i>"],
    ]
    assert out.endswith("</i>\r\n")
    _, write = read_subtitles("WEBVTT\n\n00:01.000 --> 00:02.000\nTom &amp; Jerry\n", "a.vtt", vtt=True)
    assert write(["Tom &amp; Jerry &lt;3"]) == "WEBVTT\n\n00:01.000 --> 00:02.000\nTom &amp; Jerry &lt;3\n"


@pytest.mark.parametrize(
    "translation, lines",
    [
        (
            "<!--0-->Ein Mann im blauen Hemd geht die Straße entlang.",
            ["Ein Mann im blauen Hemd", "geht die Straße entlang."],
        ),
        (
            "Ein Mann im blauen Hemd geht die Straße entlang. <!--0-->",
            ["Ein Mann im blauen Hemd", "geht die Straße entlang."],
        ),
        ("Gehen. <!--0-->", ["Gehen."]),  # one word: one line, never an empty one
    ],
)
def test_a_break_placed_first_or_last_goes_where_the_sources_was(translation: str, lines: list[str]):
    _, write = read_subtitles(
        "1\n00:00:01,000 --> 00:00:02,000\nA man in a blue shirt\nis walking down the street.\n", "a.srt", vtt=False
    )
    assert write([translation]).split("\n")[2:-1] == lines


def test_tags_closed_elsewhere_or_never_are_kept_as_they_were():
    source = "1\n00:00:01,000 --> 00:00:02,000\n<i>A <b>dog</i> runs</b> {\\i1}fast.\n"
    texts, write = read_subtitles(source, "a.srt", vtt=False)
    assert texts == ['<span data-cue="0">A <!--1-->dog</span> runs<!--2--> <!--3-->fast.']
    assert write(texts) == source


@pytest.mark.parametrize(
    "name, text, message",
    [
        (
            "a.srt",
            "1\nnot a time\nA man.\n",
            r"'a.srt' is not a valid .srt file \(line 1: a subtitle's number and times",
        ),
        ("a.srt", "1\n00:00:01" + "0" * 90 + ",000 --> 00:00:02,000\nA man.\n", "not a valid .srt file"),
        (
            "a.vtt",
            "1\n00:01.000 --> 00:02.000\nA man.\n",
            r"'a.vtt' is not a valid .vtt file \(its first line must be WEBVTT\)",
        ),
    ],
)
def test_a_file_that_is_no_subtitles_is_refused(name: str, text: str, message: str):
    with pytest.raises(InvalidRequest, match=message):
        read_subtitles(text, name, vtt=name.endswith(".vtt"))
