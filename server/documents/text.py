"""From request texts to the segments the model decodes: validation, sentence
splitting (keeping the text's layout) and the long-input policy."""

from __future__ import annotations

import re
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass

import sentencex

from server.documents import casing
from server.errors import InvalidRequest
from server.sentences import SplitSentence

LINE_BREAK = re.compile(r"(\s*\n\s*)")  # a line break with the whitespace around it
CLAUSE_ENDS = (", ", "; ", ": ", " - ", " – ", " — ")  # where a sentence over the token bound is cut first
NO_LIMIT = -1  # --char-limit and --batch-limit: as LibreTranslate's


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
class TextLimits:
    batch_limit: int  # texts per request (NO_LIMIT: any number)
    char_limit: int  # characters per request, all texts together (NO_LIMIT: any number)
    max_source_tokens: int  # tokens per sentence: a longer one is cut
    long_input_tokens: int
    long_input: str  # split | truncate | reject

    @property
    def sentence_tokens(self) -> int:
        """The most tokens a segment holds: no policy lets one over long_input_tokens through."""
        return min(self.max_source_tokens, self.long_input_tokens)


def check_texts(texts: Sequence[str], limits: TextLimits, field: str = "texts", keep_empty: bool = False) -> None:
    """Raises InvalidRequest naming the field for no texts, too many, more characters than char_limit in all, or
    an empty one (unless kept). Cheap (no parsing, no tokenizing): it bounds what the request's later stages cost."""
    if not texts:
        raise InvalidRequest(f"{field}: at least one text is required")
    if limits.batch_limit != NO_LIMIT and len(texts) > limits.batch_limit:
        raise InvalidRequest(
            f"{field}: {len(texts)} texts, the limit is {limits.batch_limit} (batch_limit); send several requests"
        )
    characters = sum(map(len, texts))
    if limits.char_limit != NO_LIMIT and characters > limits.char_limit:
        raise InvalidRequest(
            f"{field}: {characters:,} characters, over the limit of {limits.char_limit:,} (char_limit); "
            "send the text in parts"
        )
    for i, text in enumerate(texts):
        if not text.strip() and not keep_empty:
            raise InvalidRequest(f"{field}[{i}] is empty")


def _chunks(sentence: str, ids: list[int], separator: str, bound: int) -> list[tuple[str, list[int], str]]:
    """The sentence's ids in pieces of ``bound`` tokens, each with the whole sentence as its source."""
    chunks = [ids[i : i + bound] for i in range(0, len(ids), bound)]
    return [(sentence, chunk, separator if k == len(chunks) - 1 else " ") for k, chunk in enumerate(chunks)]


def _cut_at(text: str, size: int) -> int:
    """Where to end the first part of ``text`` of at most ``size`` characters: after its last clause in the
    second half of that window, else at its last space there, else at its last space, else at ``size``."""
    window = text[:size]
    clause = max(window.rfind(end) for end in CLAUSE_ENDS)
    if clause >= size // 2:
        return clause + 1
    space = max(window.rfind(" "), window.rfind("\t"))
    return space if space > 0 else size


def _bounded(
    sentence: str, ids: list[int], separator: str, bound: int, tokenize: Callable[[list[str]], list[list[int]]]
) -> list[tuple[str, list[int], str]]:
    """The sentence as parts of at most ``bound`` tokens (source, ids, the whitespace after it), cut at clause
    or word boundaries into parts of the characters that many tokens took on average (one tokenizer call per
    level, linear in the sentence); a part still over it is cut again, one without spaces at a character."""
    if len(ids) <= bound:
        return [(sentence, ids, separator)] if ids else []
    size = max(1, len(sentence) * bound // len(ids) * 9 // 10)  # a margin: tokens are not spread evenly
    parts: list[tuple[str, str]] = []
    rest = sentence
    while rest:
        end = _cut_at(rest, size) if len(rest) > size else len(rest)
        part, rest = rest[:end], rest[end:]
        gap = rest[: len(rest) - len(rest.lstrip())]
        parts.append((part.strip(), gap if rest.strip() else separator))
        rest = rest[len(gap) :]
    parts = [(part, gap) for part, gap in parts if part]
    if len(parts) == 1:  # nothing to cut at (a single token of many characters): the token level
        return _chunks(sentence, ids, separator, bound)
    ids_of_parts = tokenize([part for part, _ in parts])
    return [
        piece
        for (part, gap), part_ids in zip(parts, ids_of_parts, strict=True)
        for piece in _bounded(part, part_ids, gap, bound, tokenize)
    ]


def _model_sentences(
    splits: Sequence[list[tuple[str, str]]],
    texts: Sequence[str],
    tokenize: Callable[[list[str]], list[list[int]]],
    language: str,
    lower_case: bool,
) -> list[list[tuple[str, str]]]:
    """The splits as the model reads them: a sentence in capitals, or any of an all-lower-case text with
    ``lower_case``, in the model's case (server/documents/casing.py, one tokenizer call for all); the others as they
    are."""
    changed = []
    for t, (split, text) in enumerate(zip(splits, texts, strict=True)):
        lower = lower_case and text.islower()  # once per text: per sentence, a long text's would be quadratic
        changed += [(t, k) for k, (sentence, _) in enumerate(split) if lower or casing.in_capitals(sentence)]
    if not changed:
        return list(splits)
    models = [list(split) for split in splits]
    cased = casing.model_case([splits[t][k][0] for t, k in changed], tokenize, language)
    for (t, k), sentence in zip(changed, cased, strict=True):
        models[t][k] = (sentence, splits[t][k][1])
    return models


def _as_sent(sentence: str, as_read: str, parts: list[tuple[str, list[int], str]]) -> list[tuple[str, list[int], str]]:
    """Parts of a sentence cut from ``as_read`` (the same sentence in another case, one character for one), each
    with its source as the sentence has it."""
    sent, position = [], 0
    for source, ids, gap in parts:
        start = 0 if source == as_read else as_read.find(source, position)
        sent.append((sentence[start : start + len(source)], ids, gap))
        position = start + len(source)
    return sent


def _sentence_ids(
    splits: Sequence[list[tuple[str, str]]],
    texts: Sequence[str],
    tokenize: Callable[[list[str]], list[list[int]]],
    tokenized: Sequence[list[int]] | None,
) -> list[list[list[int]]]:
    """Each text's sentences' ids, in one tokenizer call: a text that is one sentence as sent (the usual
    request) takes its ``tokenized`` ids when the caller has them."""
    given = [
        tokenized is not None and [sentence for sentence, _ in split] == [text]
        for split, text in zip(splits, texts, strict=True)
    ]
    asked = [sentence for split, known in zip(splits, given, strict=True) if not known for sentence, _ in split]
    found = iter(tokenize(asked) if asked else [])
    return [
        [tokenized[i]] if known and tokenized is not None else [next(found) for _ in split]
        for i, (split, known) in enumerate(zip(splits, given, strict=True))
    ]


def segment_texts(
    texts: Sequence[str],
    tokenize: Callable[[list[str]], list[list[int]]],
    limits: TextLimits,
    on_long_input: Callable[[str], None] = lambda policy: None,
    field: str = "texts",
    keep_empty: bool = False,
    language: str = "en",
    tokenized: Sequence[list[int]] | None = None,
    *,
    lower_case: bool = False,
    aligned: Collection[int] = (),
) -> list[list[SplitSentence]]:
    """The sentences of every text, in order, as segments. Raises InvalidRequest naming the field.

    Every text is split into sentences of its ``language`` (the model translates sentences), each
    remembering the whitespace after it (``separator``), so that translations keep the text's lines and
    paragraphs. A sentence over ``limits.sentence_tokens`` is cut at clause or word boundaries into pieces
    within it, never refused. A text over long_input_tokens follows the policy: ``split`` (its sentences are
    translated in one batch), ``truncate`` (sentences are kept up to long_input_tokens tokens in all), or
    ``reject``. ``tokenized``: the texts' ids, when the caller has them already.

    A sentence in capitals is tokenized in the case the model knows (server/documents/casing.py) and marked
    ``capitals``; with ``lower_case``, so is every sentence of an all-lower-case text (its translation is lower-cased
    later). The sentences of the texts at ``aligned`` are marked ``align``.
    """
    check_texts(texts, limits, field, keep_empty)
    splits = [(split_sentences(text, language) or [(text.strip(), "")]) if text.strip() else [] for text in texts]
    models = _model_sentences(splits, texts, tokenize, language, lower_case)
    result: list[list[SplitSentence]] = []
    for i, (split, model, by_sentence) in enumerate(
        zip(splits, models, _sentence_ids(models, texts, tokenize, tokenized), strict=True)
    ):
        if not split:
            result.append([])
            continue
        tokens = sum(map(len, by_sentence))
        long = tokens > limits.long_input_tokens
        if long:
            on_long_input(limits.long_input)
            if limits.long_input == "reject":
                raise InvalidRequest(
                    f"{field}[{i}] has {tokens} tokens, over long_input_tokens={limits.long_input_tokens}, and the "
                    "long-input policy is reject; split the text or ask for the split policy"
                )
        budget = limits.long_input_tokens if long and limits.long_input == "truncate" else None
        pieces: list[tuple[str, list[int], str, int, bool]] = []
        for (sentence, separator), (as_read, _), sentence_ids in zip(split, model, by_sentence, strict=True):
            if budget is not None:
                sentence_ids = sentence_ids[:budget]
                budget -= len(sentence_ids)
            if budget is None:
                parts = _bounded(as_read, sentence_ids, separator, limits.sentence_tokens, tokenize)
            else:  # the kept ids are no longer the text's: cut them as they are
                parts = _chunks(as_read, sentence_ids, separator, limits.sentence_tokens)
            if as_read is not sentence:
                parts = _as_sent(sentence, as_read, parts)
            capitals = casing.in_capitals(sentence)
            pieces += [(source, ids, gap, k, capitals) for k, (source, ids, gap) in enumerate(parts)]
            if budget == 0:
                break
        if not pieces:
            raise InvalidRequest(
                f"{field}[{i}] has nothing to translate: it tokenizes to no tokens (e.g. only zero-width characters)"
            )
        result.append(
            [
                SplitSentence(i, j, source, ids, budget is not None, separator, chunk, capitals, i in aligned)
                for j, (source, ids, separator, chunk, capitals) in enumerate(pieces)
            ]
        )
    return result
