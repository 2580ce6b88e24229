"""From request texts to the segments the model decodes: validation, sentence
splitting (keeping the text's layout) and the long-input policy."""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import islice

import sentencex

from server.errors import InvalidRequest

LINE_BREAK = re.compile(r"(\s*\n\s*)")  # a line break with the whitespace around it
# A word holding a letter or digit: at least one token, as SentencePiece's pieces never span whitespace. Matched
# only from a word's start (linear in the text), and counted only up to the limit: a text with more such words
# than max_source_tokens is refused before it is parsed or tokenized (4 MiB of "{a} " took 2.5 s of CPU to
# refuse after both; now 0.01 s).
COUNTED_WORD = re.compile(r"(?<!\S)[^\s\w]*\w")


def split_sentences(text: str, language: str = "en") -> list[tuple[str, str]]:
    """The sentences of a text, each with the whitespace that follows it, line breaks included: the text
    is its leading whitespace followed by every sentence and its separator. Lines never share a sentence;
    within a line, Wikimedia's sentencex splits by the language's rules (abbreviations such as "Mr." or
    "z. B.", numbers, quotes)."""
    sentences: list[tuple[str, str]] = []
    parts = LINE_BREAK.split(text)  # lines at even indexes, the breaks between them at odd ones
    for line, line_break in zip(parts[0::2], [*parts[1::2], ""], strict=True):
        for segment in sentencex.segment(language, line):
            body = segment.strip()
            # Whitespace before a sentence (a segment of only whitespace, or one that starts with some, as
            # sentencex leaves the separators Python counts as whitespace, "\x1f" say) follows the one before.
            lead = segment[: len(segment) - len(segment.lstrip())] if body else segment
            if lead and sentences:
                sentences[-1] = (sentences[-1][0], sentences[-1][1] + lead)
            if body:
                sentences.append((body, segment[len(segment.rstrip()) :]))
        if sentences and line_break:
            sentences[-1] = (sentences[-1][0], sentences[-1][1] + line_break)
    return sentences


@dataclass(frozen=True)
class SplitSentence:
    """A sentence of a request's text, tokenized: the first of a sentence's stages through the server (split,
    then queued for the engine (server.jobs.QueuedSentence), decoded (server.answers.DecodedSentence) and,
    with markup, aligned for placement (server.placement.AlignedSentence))."""

    text_index: int
    segment_index: int
    source: str
    ids: list[int]
    truncated: bool = False
    separator: str = " "  # the whitespace that follows it in its text (a line break keeps the layout)
    chunk: int = 0  # a sentence over long_input_tokens is cut into pieces: which piece of it this is


class AfterSplit:
    """What every later stage of a sentence tells of its source (each has the SplitSentence as ``spec``)."""

    spec: SplitSentence

    @property
    def source_tokens(self) -> int:
        return len(self.spec.ids)


@dataclass(frozen=True)
class TextLimits:
    max_texts: int
    max_source_tokens: int
    long_input_tokens: int
    long_input: str  # split | truncate | reject


def _chunks(ids: list[int], size: int) -> list[list[int]]:
    return [ids[i : i + size] for i in range(0, len(ids), size)]


def check_texts(texts: Sequence[str], limits: TextLimits, field: str = "texts", keep_empty: bool = False) -> None:
    """Raises InvalidRequest naming the field for no texts, too many, an empty one (unless kept), or one with
    more words than max_source_tokens."""
    if not texts:
        raise InvalidRequest(f"{field}: at least one text is required")
    if len(texts) > limits.max_texts:
        raise InvalidRequest(
            f"{field}: {len(texts)} texts, the limit is {limits.max_texts} (max_texts); send several requests"
        )
    for i, text in enumerate(texts):
        if not text.strip() and not keep_empty:
            raise InvalidRequest(f"{field}[{i}] is empty")
        check_words(text, limits, f"{field}[{i}]")


def check_words(text: str, limits: TextLimits, name: str) -> None:
    """Raises InvalidRequest when the text has more words than max_source_tokens: it has more tokens."""
    if next(islice(COUNTED_WORD.finditer(text), limits.max_source_tokens, None), None) is not None:
        raise InvalidRequest(
            f"{name} has more than {limits.max_source_tokens} words, so more tokens than the limit "
            f"({limits.max_source_tokens}, max_source_tokens); send it in parts"
        )


def segment_texts(
    texts: Sequence[str],
    tokenize: Callable[[list[str]], list[list[int]]],
    limits: TextLimits,
    on_long_input: Callable[[str], None] = lambda policy: None,
    field: str = "texts",
    keep_empty: bool = False,
    language: str = "en",
    tokenized: Sequence[list[int]] | None = None,
) -> list[list[SplitSentence]]:
    """The sentences of every text, in order, as segments. Raises InvalidRequest naming the field.

    Every text is split into sentences of its ``language`` (the model translates sentences), each
    remembering the whitespace after it (``separator``), so that translations keep the text's lines and
    paragraphs. A text
    over long_input_tokens follows the policy: ``split`` (its sentences are
    translated in one batch; a sentence still over the limit is cut into
    pieces), ``truncate`` (sentences are kept up to long_input_tokens tokens in
    all), or ``reject``. ``tokenized``: the texts' ids, when the caller has them already.
    """
    check_texts(texts, limits, field, keep_empty)
    result: list[list[SplitSentence]] = []
    for i, (text, ids) in enumerate(zip(texts, tokenized or tokenize(list(texts)), strict=True)):
        if not text.strip():
            result.append([])
            continue
        if len(ids) > limits.max_source_tokens:
            raise InvalidRequest(
                f"{field}[{i}] has {len(ids)} tokens; the limit is {limits.max_source_tokens} (max_source_tokens)"
            )
        long = len(ids) > limits.long_input_tokens
        if long:
            on_long_input(limits.long_input)
            if limits.long_input == "reject":
                raise InvalidRequest(
                    f"{field}[{i}] has {len(ids)} tokens, over long_input_tokens={limits.long_input_tokens}, and the "
                    "long-input policy is reject; split the text or ask for the split policy"
                )
        sentences = split_sentences(text, language) or [(text.strip(), "")]
        budget = limits.long_input_tokens if long and limits.long_input == "truncate" else None
        pieces: list[tuple[str, list[int], str, int]] = []
        sources = [sentence for sentence, _ in sentences]
        # A text that is one sentence as sent (the usual request) is tokenized once.
        by_sentence = [ids] if sources == [text] else tokenize(sources)
        for (sentence, separator), sentence_ids in zip(sentences, by_sentence, strict=True):
            if budget is not None:
                sentence_ids = sentence_ids[:budget]
                budget -= len(sentence_ids)
            chunks = _chunks(sentence_ids, limits.long_input_tokens)
            pieces += [(sentence, ids, separator if k == len(chunks) - 1 else " ", k) for k, ids in enumerate(chunks)]
            if budget == 0:
                break
        if not pieces:
            raise InvalidRequest(
                f"{field}[{i}] has nothing to translate: it tokenizes to no tokens (e.g. only zero-width characters)"
            )
        result.append(
            [
                SplitSentence(i, j, source, ids, budget is not None, separator, chunk)
                for j, (source, ids, separator, chunk) in enumerate(pieces)
            ]
        )
    return result
