"""A document's CPU stages around the model do work linear in its length: parsing (markup.parse, in
server/documents/markup.py and server/documents/html_tree.py), segmentation (segment_texts, server/documents/text.py)
and placement (aligned.sentences_for and placement.place, server/documents/aligned.py and
server/documents/placement.py), on documents of 10,000, 50,000 and 100,000 characters. A step that walks the whole piece
once per sentence, atom or element is quadratic: nothing on a tweet, a second of CPU on a 100,000-character piece, and
the worst case is one huge piece (a long paragraph, a text sent as format "text", a run-on sentence cut into chunks).

Work is counted, not timed: the lines each stage executes in its own modules (sys.settrace's "line" events,
every turn of a loop or a comprehension included) are the same on every machine, where the time a shared 2-core
CI runner takes varies by more than the 10x that tells linear from quadratic between 10,000 and 100,000
characters. What runs in C (sentencex, regular expressions, numpy, list and string methods) is not counted;
html.parser is the standard library's, not ours.
"""

from __future__ import annotations

import itertools
import random
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from functools import cache
from types import FrameType

import numpy as np
import pytest

from server.documents import aligned, html_tree, markup, placement, text
from server.documents.markup import WORD, Piece
from server.documents.text import NO_LIMIT, TextLimits, segment_texts
from server.sentences import SplitSentence

SIZES = (10_000, 50_000, 100_000)  # characters; each document's first characters are the smaller ones'
# Linear: the work grows with the length, by up to this factor more (a quadratic stage's grows by its square).
SLACK = 1.2
LIMITS = TextLimits(NO_LIMIT, NO_LIMIT, max_source_tokens=1024, long_input_tokens=128, long_input="split")

SUBJECTS = ["A man", "An old woman", "Two children", "The brown dog", "A girl in a red coat", "Three workers"]
VERBS = ["walks", "is waiting", "runs quickly", "sits quietly", "is reading a book", "looks around"]
PLACES = ["along the river", "in the park", "near the station", "on a wooden bench", "behind the church"]
TIMES = ["", " this morning", " after lunch", " in the rain", " before sunset"]
ATOMS = [" with {name}", " for 5 km", " past https://example.com/map", " at 20 °C"]


def clauses(html: bool, seed: int = 7) -> Iterator[str]:
    """Varied English clauses without a final period, every fifth with an atom; in HTML every fourth with a
    bold word and every seventh after an empty anchor (an element that wraps no word)."""
    rng = random.Random(seed)
    for n in itertools.count():
        subject, verb, where, when = (rng.choice(words) for words in (SUBJECTS, VERBS, PLACES, TIMES))
        if html and n % 4 == 0:
            first, _, last = subject.rpartition(" ")
            subject = f"{first} <b>{last}</b>"
        anchor = f'<a id="s{n}"></a>' if html and n % 7 == 0 else ""
        atom = ATOMS[n // 5 % len(ATOMS)] if n % 5 == 0 else ""
        yield f"{anchor}{subject} {verb} {where}{atom}{when}"


def fill(size: int, parts: Iterator[str]) -> str:
    """The parts, joined, up to the first that reaches ``size`` characters."""
    out, length = [], 0
    for part in parts:
        out.append(part)
        length += len(part)
        if length >= size:
            return "".join(out)
    raise AssertionError("parts ran out")


def paragraphs(html: bool) -> Iterator[str]:
    """Paragraphs of four sentences: HTML's in <p> elements, text's with a blank line after them."""
    sentences = (f"{clause}." for clause in clauses(html))
    while True:
        body = " ".join(itertools.islice(sentences, 4))
        yield f"<p>{body}</p>\n" if html else f"{body}\n\n"


def one_paragraph(size: int, after_clause: str) -> str:
    return "<p>" + fill(size, (clause + after_clause for clause in clauses(html=True))) + "</p>"


# Documents of about ``size`` characters, and their format.
DOCUMENTS: dict[str, Callable[[int], tuple[str, str]]] = {
    "text paragraphs": lambda size: (fill(size, paragraphs(html=False)), "text"),  # one piece: the whole text
    "html paragraphs": lambda size: (fill(size, paragraphs(html=True)), "html"),
    "one html paragraph": lambda size: (one_paragraph(size, ". "), "html"),
    "one html run-on sentence": lambda size: (one_paragraph(size, ", "), "html"),  # cut into chunks
}


class WordTokenizer:
    """An engine's tokenizer without a model: a token per word as WORD finds them (so a unit of placement is
    one token), "▁" on one after whitespace as sentencepiece writes it."""

    def __init__(self) -> None:
        self.pieces: list[str] = []
        self.ids: dict[str, int] = {}

    def tokenize(self, texts: list[str]) -> list[list[int]]:
        return [[self._id(piece) for piece in self._pieces(text)] for text in texts]

    def _pieces(self, text: str) -> Iterator[str]:
        for match in WORD.finditer(text):
            start = match.start()
            yield ("▁" if start == 0 or text[start - 1].isspace() else "") + match.group()

    def _id(self, piece: str) -> int:
        if piece not in self.ids:
            self.ids[piece] = len(self.pieces)
            self.pieces.append(piece)
        return self.ids[piece]

    def source_pieces(self, ids: Sequence[int]) -> list[str]:
        return [self.pieces[i] for i in ids]

    target_pieces = source_pieces

    def detokenize(self, ids: Sequence[Sequence[int]]) -> list[str]:
        return ["".join(self.pieces[i] for i in row).replace("▁", " ").strip() for row in ids]


@dataclass(frozen=True)
class Decoded:
    """A sentence "translated" to itself (aligned.Translated)."""

    spec: SplitSentence
    output: list[int]


@dataclass(frozen=True)
class Prepared:
    """A document as each stage takes it, the stages before it run (as Translations._translate_documents runs
    them)."""

    text: str
    format: str
    runs: list[str]
    tokenized: list[list[int]]
    marked: list[tuple[Piece, list[Decoded]]]  # the pieces with markup or atoms, and their sentences
    aligned: list[list[aligned.AlignedSentence]]


TOKENIZER = WordTokenizer()


def monotone(sentences: Sequence[Decoded]) -> Iterator[np.ndarray]:
    """Each output token aligned to its own source token."""
    return (np.eye(len(s.output), len(s.spec.ids), dtype=np.float32) for s in sentences)


@cache
def prepared(kind: str, size: int) -> Prepared:
    document_text, format = DOCUMENTS[kind](size)
    document = markup.parse(document_text, format)
    runs = [piece.text for piece in document.pieces]
    tokenized = TOKENIZER.tokenize(runs)
    by_piece = segment_texts(runs, TOKENIZER.tokenize, LIMITS, keep_empty=True, tokenized=tokenized)
    marked = [
        (piece, [Decoded(spec, list(spec.ids)) for spec in specs])
        for piece, specs in zip(document.pieces, by_piece, strict=True)
        if not piece.plain and specs
    ]
    sentences = [aligned.sentences_for(TOKENIZER, piece, s, monotone(s)) for piece, s in marked]
    return Prepared(document_text, format, runs, tokenized, marked, sentences)


def parse(p: Prepared) -> object:
    return markup.parse(p.text, p.format)


def segment(p: Prepared) -> object:
    return segment_texts(p.runs, TOKENIZER.tokenize, LIMITS, keep_empty=True, tokenized=p.tokenized)


def align(p: Prepared) -> object:
    return [aligned.sentences_for(TOKENIZER, piece, s, monotone(s)) for piece, s in p.marked]


def place(p: Prepared) -> object:
    return [placement.place(piece, sentences) for (piece, _), sentences in zip(p.marked, p.aligned, strict=True)]


STAGES: dict[str, tuple[Callable[[Prepared], object], tuple[str, ...]]] = {
    "parse": (parse, (markup.__file__, html_tree.__file__)),
    "segment": (segment, (text.__file__,)),
    "sentences_for": (align, (aligned.__file__,)),
    "place": (place, (placement.__file__,)),
}


class _OverBudget(Exception):
    pass


def lines_run(stage: Callable[[Prepared], object], document: Prepared, files: Sequence[str], budget: float) -> int:
    """The lines ``stage`` executes in ``files`` on ``document``; it is stopped once they are over ``budget`` (a
    quadratic stage takes tens of seconds under the tracer), and the count is then budget + 1."""
    count = 0

    def on_line(frame: FrameType, event: str, arg: object) -> Callable | None:
        nonlocal count
        if event == "line":
            count += 1
            if count > budget:
                raise _OverBudget
        return on_line

    def on_call(frame: FrameType, event: str, arg: object) -> Callable | None:
        return on_line if frame.f_code.co_filename in files else None

    previous = sys.gettrace()
    sys.settrace(on_call)
    try:
        stage(document)
    except _OverBudget:
        pass
    finally:
        sys.settrace(previous)
    return count


@pytest.mark.parametrize("kind", DOCUMENTS)
@pytest.mark.parametrize("stage", STAGES)
def test_a_stage_does_work_linear_in_the_documents_length(stage: str, kind: str):
    run, files = STAGES[stage]
    small = prepared(kind, SIZES[0])
    base = lines_run(run, small, files, budget=float("inf"))
    for size in SIZES[1:]:
        large = prepared(kind, size)
        growth = len(large.text) / len(small.text)
        budget = SLACK * growth * base
        count = lines_run(run, large, files, budget)
        assert count <= budget, (
            f"{stage} of {kind}: {len(large.text):,} characters ran over {count / base:.1f}x the lines of "
            f"{len(small.text):,} ({base:,}), for {growth:.1f}x the characters"
        )
        assert count > growth / 2 * base, (
            f"{stage} of {kind}: {count:,} lines for {len(large.text):,} characters and {base:,} for "
            f"{len(small.text):,}: the tracer missed the stage's work"
        )
