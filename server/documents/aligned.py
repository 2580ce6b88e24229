"""A translated piece's sentences as placement reads them (``AlignedSentence``): each output unit (a word, or
closing punctuation) and the source word it is aligned to, from where each output token looked in its source
(the model's cross-attention, read by ``export/aligner.py``'s graph); server/documents/placement.py puts markup and
atoms back around them.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import numpy as np

from server.documents import casing
from server.documents.markup import CLOSING_PUNCTUATION, Piece
from server.sentences import SplitSentence

if TYPE_CHECKING:
    from server.interface import Engine


class Translated(Protocol):
    """A translated sentence of the piece (server.answers.DecodedSentence; ``sentences_for`` makes it an
    ``AlignedSentence``)."""

    spec: SplitSentence
    output: list[int]


def unit_spans(pieces: Sequence[str]) -> list[tuple[int, int]]:
    """Tokens grouped into the units markup is placed around: words ("▁" starts one), with closing
    punctuation a unit of its own (so "<b>Hund</b>." and not "<b>Hund.</b>"); what WORD finds in text."""
    spans: list[tuple[int, int]] = []
    for i, piece in enumerate(pieces):
        punctuation = CLOSING_PUNCTUATION.match(piece) is not None
        if (
            spans
            and not piece.startswith("▁")
            and punctuation == (CLOSING_PUNCTUATION.match(pieces[spans[-1][0]]) is not None)
        ):
            spans[-1] = (spans[-1][0], i + 1)
        else:
            spans.append((i, i + 1))
    return spans


def source_words(pieces: Sequence[str]) -> list[int]:
    """The word (unit_spans) of each source token."""
    words = []
    for word, (start, end) in enumerate(unit_spans(pieces)):
        words += [word] * (end - start)
    return words


def align_units(alignment: np.ndarray, words: Sequence[int], spans: Sequence[tuple[int, int]]) -> list[int | None]:
    """The source word each output unit is aligned to: the word with the most attention from the unit's
    tokens (alignment: output tokens × source tokens; ``spans``: consecutive, from token 0 to the alignment's last
    row, as unit_spans makes them from the same output); None when the unit attended to nothing."""
    if not len(words) or not len(spans):
        return [None] * len(spans)
    # Columns from the first word on: a later chunk of a long sentence numbers its words from the sentence's start,
    # and a column per word before it would make the chunks' cost quadratic in the sentence.
    first = min(words)
    columns = np.asarray(words[: alignment.shape[1]]) - first
    one_word = np.zeros((len(columns), max(words) - first + 1), np.float32)  # source token × its word
    one_word[np.arange(len(columns)), columns] = 1.0
    by_word = alignment[:, : len(columns)] @ one_word  # output token × source word
    starts = [start for start, _ in spans]
    by_unit = np.add.reduceat(by_word[: spans[-1][1]], starts, axis=0)  # output unit × source word
    best, scores = by_unit.argmax(axis=1).tolist(), by_unit.max(axis=1).tolist()
    return [
        first + word if end > start and score > 0 else None
        for word, score, (start, end) in zip(best, scores, spans, strict=True)
    ]


@dataclass(frozen=True)
class AlignedSentence:
    """One translated sentence of a piece, ready for placement."""

    start: int  # where it starts in the piece's text
    units: list[str]  # its translation's units (unit_spans), detokenized
    leading_space: list[bool]  # per unit: a word start (a space before it, but for the first)
    aligned: list[int | None]  # per unit: the sentence's source word it is aligned to
    separator: str  # the whitespace after it


def sentences_for(
    engine: Engine, piece: Piece, sentences: Sequence[Translated], alignments: Iterator[np.ndarray]
) -> list[AlignedSentence]:
    """The piece's sentences as ``place`` takes them: where each starts in the piece's text, its output
    units and the source word each is aligned to (chunks of one long sentence become one sentence)."""
    placed: list[AlignedSentence] = []
    position = 0
    for chunks in _whole_sentences(sentences):
        found = piece.text.find(chunks[0].spec.source, position)
        start = found if found >= 0 else position
        units: list[str] = []
        spaces: list[bool] = []
        aligned: list[int | None] = []
        last_unit: _SourceUnit | None = None
        for s in chunks:
            alignment = next(alignments)
            pieces = engine.target_pieces(s.output)
            spans = unit_spans(pieces)
            written = engine.detokenize([s.output[a:b] for a, b in spans])
            units += [casing.written(unit, s.spec.capitals) for unit in written]
            spaces += [pieces[a].startswith("▁") for a, _ in spans]
            source = engine.source_pieces(s.spec.ids)
            words = _chunk_words(source, last_unit)
            aligned += align_units(alignment, words, spans)
            last_unit = _last_unit(source, words, last_unit)
        placed.append(AlignedSentence(start, units, spaces, aligned, chunks[-1].spec.separator))
        position = start + len(chunks[0].spec.source)
    return placed


def _whole_sentences(sentences: Sequence[Translated]) -> Iterator[list[Translated]]:
    """The sentences, each with the later chunks of it that follow it."""
    chunks: list[Translated] = []
    for s in sentences:
        if chunks and not s.spec.chunk:
            yield chunks
            chunks = []
        chunks.append(s)
    if chunks:
        yield chunks


@dataclass(frozen=True)
class _SourceUnit:
    """The last unit of a sentence's source so far, which the first token of its next chunk may continue."""

    word: int  # its number in the sentence
    first_piece: str  # the token it starts with


def _chunk_words(pieces: Sequence[str], last_unit: _SourceUnit | None) -> list[int]:
    """The word (unit_spans) of each source token of a chunk, numbered in the whole sentence, from the unit the
    chunks before it ended with (None: it is the first) without reading those chunks again."""
    if last_unit is None:
        return source_words(pieces)
    return [last_unit.word + word for word in source_words([last_unit.first_piece, *pieces])[1:]]


def _last_unit(pieces: Sequence[str], words: list[int], before: _SourceUnit | None) -> _SourceUnit | None:
    """The last unit of a sentence's source once a chunk (its tokens' ``pieces`` and ``words``) is added."""
    if not words or (before is not None and words[-1] == before.word):  # the chunk only continues that unit
        return before
    return _SourceUnit(words[-1], pieces[words.index(words[-1])])
