"""Property-based tests of the parsers that take any text (hypothesis): sentence splitting and markup never
fail but with a documented error, and give back exactly what they were given."""

from __future__ import annotations

import html
import os

from hypothesis import given, settings
from hypothesis import strategies as st

from server.documents.html_tree import MarkupError
from server.documents.markup import parse
from server.documents.text import split_sentences

# Text shaped like what callers send: words, punctuation, line breaks, markup and its special characters.
ATOMS = st.sampled_from(
    [
        "A",
        "man",
        "Mr.",
        "z. B.",
        "3.5 kg",
        ".",
        "!",
        "?",
        " ",
        "  ",
        "\n",
        "\r\n",
        "\t",
        "<b>",
        "</b>",
        "<i>",
        "</i>",
        "<br>",
        "<p>",
        "</p>",
        "<span class='x'>",
        "</span>",
        "<code>",
        "</code>",
        "&amp;",
        "&lt;",
        "<!-- c -->",
        "{name}",
        "%s",
        "https://example.com/a?b=1",
        "é",
        "ß",
        "\u200b",
        "😀",
        "<",
        ">",
        "&",
        '"',
        "'",
    ]
)
TEXTS = st.lists(st.one_of(ATOMS, st.text(max_size=5)), max_size=40).map("".join)
FUZZ = settings(
    max_examples=int(os.environ.get("FUZZ_EXAMPLES", "300")),
    deadline=None,
    derandomize=not os.environ.get("FUZZ_RANDOM"),
    database=None,
)


@FUZZ
@given(TEXTS)
def test_sentences_put_back_together_are_the_text(text: str):
    sentences = split_sentences(text)
    assert all(sentence and sentence == sentence.strip() for sentence, _ in sentences)
    leading = text[: len(text) - len(text.lstrip())]
    assert leading + "".join(sentence + separator for sentence, separator in sentences) == (
        text if sentences else leading
    )


@FUZZ
@given(TEXTS)
def test_markup_parses_or_says_why_and_renders_back_to_itself(text: str):
    try:
        document = parse(text, "html")
    except MarkupError:
        return
    rendered = document.render(["".join(p.source) for p in document.pieces])
    assert html.unescape(rendered) == html.unescape(text)  # a bare "<" comes back as "&lt;", as HTML wants it
