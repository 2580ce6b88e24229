"""From request texts to the segments the model decodes: validation, sentence
splitting and the long-input policy."""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from server.errors import InvalidRequest

# A sentence ends at . ! ? … (optionally followed by closing quotes/brackets) before whitespace.
SENTENCE_END = re.compile(r"(?<=[.!?…])[\"'”’)\]]*\s+")


def split_sentences(text: str) -> list[str]:
    return [s.strip() for s in SENTENCE_END.split(text) if s.strip()]


@dataclass(frozen=True)
class SegmentSpec:
    text_index: int
    segment_index: int
    source: str
    ids: list[int]
    truncated: bool = False


@dataclass(frozen=True)
class TextLimits:
    max_texts: int
    max_source_tokens: int
    long_input_tokens: int
    long_input: str  # split | truncate | reject


def _chunks(ids: list[int], size: int) -> list[list[int]]:
    return [ids[i : i + size] for i in range(0, len(ids), size)]


def segment_texts(
    texts: Sequence[str],
    tokenize: Callable[[list[str]], list[list[int]]],
    limits: TextLimits,
    on_long_input: Callable[[str], None] = lambda policy: None,
    field: str = "texts",
    keep_empty: bool = False,
) -> list[list[SegmentSpec]]:
    """The sentences of every text, in order, as segments. Raises InvalidRequest naming the field.

    Every text is split into sentences (the model translates sentences). A text
    over long_input_tokens follows the policy: ``split`` (its sentences are
    translated in one batch; a sentence still over the limit is cut into
    pieces), ``truncate`` (sentences are kept up to long_input_tokens tokens in
    all), or ``reject``.
    """
    if not texts:
        raise InvalidRequest(f"{field}: at least one text is required")
    if len(texts) > limits.max_texts:
        raise InvalidRequest(
            f"{field}: {len(texts)} texts, the limit is {limits.max_texts} (max_texts); send several requests"
        )
    for i, text in enumerate(texts):
        if not text.strip() and not keep_empty:
            raise InvalidRequest(f"{field}[{i}] is empty")
    result: list[list[SegmentSpec]] = []
    for i, (text, ids) in enumerate(zip(texts, tokenize(list(texts)), strict=True)):
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
        sentences = split_sentences(text) or [text]
        budget = limits.long_input_tokens if long and limits.long_input == "truncate" else None
        pieces: list[tuple[str, list[int]]] = []
        for sentence, sentence_ids in zip(sentences, tokenize(sentences), strict=True):
            if budget is not None:
                sentence_ids = sentence_ids[:budget]
                budget -= len(sentence_ids)
            pieces += [(sentence, chunk) for chunk in _chunks(sentence_ids, limits.long_input_tokens)]
            if budget == 0:
                break
        if not pieces:
            raise InvalidRequest(
                f"{field}[{i}] has nothing to translate: it tokenizes to no tokens (e.g. only zero-width characters)"
            )
        result.append(
            [SegmentSpec(i, j, source, chunk, truncated=budget is not None) for j, (source, chunk) in enumerate(pieces)]
        )
    return result
