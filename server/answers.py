"""A text's answer from its decoded sentences (``DecodedSentence``, by the engine or from the translation cache):
their translations in the text's layout, its confidence and flags, and its alternatives (server/translations.py
has the way there)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from runtime.search import Hypothesis
from server.documents import casing, markup
from server.interface import Engine
from server.sentences import AfterSplit, SplitSentence


@dataclass(frozen=True)
class TextTranslation:
    text: str
    input_tokens: int  # source tokens as the model saw them (after truncation, if any)
    output_tokens: int  # generated tokens, eos excluded
    segments: int  # sentences (or pieces) the text was translated as
    truncated: bool
    confidence: float  # its sentences' confidences (runtime.search.Hypothesis.score), weighted by their tokens
    guard: str  # why a runaway-output guard stopped one of its sentences ("repetition", "length"), or ""
    low_confidence: bool  # a sentence of it scored under the request's min_confidence
    # Other translations of it, best first, none the same as text (see Translations.translate)
    alternatives: tuple[str, ...] = ()
    # The glossary entries (their source terms) written into it, one per occurrence (server/documents/glossary.py)
    glossary_applied: tuple[str, ...] = ()


@dataclass(frozen=True)
class DecodedSentence(AfterSplit):
    """One sentence's translation, by the engine or from the translation cache."""

    spec: SplitSentence
    result: Hypothesis
    last_in_text: bool  # the text's last segment
    # When it was queued, joined a running batch, was encoded and finished (time.monotonic()); None when
    # the translation cache answered it, without the engine.
    timings: tuple[float, float, float, float] | None = None
    kept: Any = None  # with spec.align, translated by the engine: its encoder's output, for the aligner

    @property
    def queue_seconds(self) -> float:
        """How long it waited to join a running batch."""
        return self.timings[1] - self.timings[0] if self.timings else 0.0

    @property
    def output(self) -> list[int]:
        """Output token ids, eos excluded."""
        return self.result.tokens

    @property
    def alternatives(self) -> list[list[int]]:
        """Output token ids of the other translations kept for it, best first."""
        return [alternative.tokens for alternative in self.result.alternatives]

    @property
    def guard(self) -> str:
        return "" if self.result.stopped == "eos" else self.result.stopped

    def low_confidence(self, min_confidence: float | None) -> bool:
        return min_confidence is not None and self.result.score < min_confidence


def text_confidence(sentences: Sequence[DecodedSentence]) -> float:
    """The mean log-probability of every token chosen for the sentences (each weighted by its tokens, eos
    included); 0 for a text without sentences."""
    weights = [len(s.output) + 1 for s in sentences]
    return sum(s.result.score * w for s, w in zip(sentences, weights, strict=True)) / max(sum(weights), 1)


def leading_whitespace(text: str) -> str:
    return text[: len(text) - len(text.lstrip())]


def trailing_whitespace(text: str) -> str:
    return text[len(text.rstrip()) :] if text.strip() else ""


def by_text(segments: Sequence[DecodedSentence], texts: int) -> list[list[DecodedSentence]]:
    by_text: list[list[DecodedSentence]] = [[] for _ in range(texts)]
    for segment in segments:
        by_text[segment.spec.text_index].append(segment)
    return by_text


def joined(text: str, parts: Sequence[DecodedSentence], outputs: dict[int, str]) -> str:
    """The sentences' translations in the text's layout (see Translations.translate)."""
    joined = "".join(outputs[id(s)] + s.spec.separator for s in parts).rstrip()
    return leading_whitespace(text) + joined + trailing_whitespace(text)


def plain(engine: Engine, texts: Sequence[str], segments: Sequence[DecodedSentence]) -> list[str]:
    """Each text's sentences' translations in the text's layout."""
    outputs = detokenized(engine, segments)
    return [joined(text, parts, outputs) for text, parts in zip(texts, by_text(segments, len(texts)), strict=True)]


def detokenized(engine: Engine, segments: Sequence[DecodedSentence]) -> dict[int, str]:
    """Each segment's translation as its source was written (in capitals where it was: server/documents/casing.py), by
    the segment's id."""
    texts = engine.detokenize([s.output for s in segments])
    return {id(s): casing.written(text, s.spec.capitals) for s, text in zip(segments, texts, strict=True)}


def distinct_alternatives(translation: str, candidates: Sequence[str]) -> tuple[str, ...]:
    """The candidates unlike the translation, each once, in order: two outputs of different tokens may read
    the same."""
    return tuple(dict.fromkeys(other for other in candidates if other != translation))


@dataclass(frozen=True)
class SentenceAnswer:
    """One sentence's finished answer, as a stream sends it (Translations.streamed): the sentence as decoded, its
    translation (as its source was written, the glossary's terms in place), its alternatives unlike it, and the
    glossary entries written into it."""

    decoded: DecodedSentence
    translation: str
    alternatives: tuple[str, ...] = ()
    glossary_applied: tuple[str, ...] = ()


def sentence_answer(engine: Engine, segment: DecodedSentence, translation: str | None = None) -> SentenceAnswer:
    """A sentence's answer: its output and alternatives detokenized as its source was written; ``translation``, where
    given, in place of its output's (a glossary's terms placed in it)."""
    outputs = engine.detokenize([segment.output, *segment.alternatives])
    texts = [casing.written(text, segment.spec.capitals) for text in outputs]
    own = texts[0] if translation is None else translation
    return SentenceAnswer(segment, own, distinct_alternatives(own, texts[1:]))


def summary(texts: Sequence[str], parts: Sequence[DecodedSentence], min_confidence: float | None) -> TextTranslation:
    """A text's translation (texts[0]) with the others as its alternatives."""
    text = texts[0]
    return TextTranslation(
        text=text,
        input_tokens=sum(s.source_tokens for s in parts),
        output_tokens=sum(len(s.output) for s in parts),
        segments=len(parts),
        truncated=any(s.spec.truncated for s in parts),
        confidence=text_confidence(parts),
        guard=next((s.guard for s in sorted(parts, key=lambda s: s.guard != "repetition") if s.guard), ""),
        low_confidence=any(s.low_confidence(min_confidence) for s in parts),
        alternatives=distinct_alternatives(text, texts[1:]),
    )


def as_sent(text: str) -> TextTranslation:
    """A text that is its own translation, without the model: confidence 0, the most a mean log-probability
    can be."""
    return TextTranslation(text, 0, 0, 0, False, 0.0, "", False)


def variants(segments: list[DecodedSentence], alternatives: int) -> list[list[DecodedSentence]]:
    """The segments as translated, then their alternatives: alternative i of a text is each of its sentences'
    i-th alternative, or the sentence's translation where it has fewer (as Argos Translate, LibreTranslate's
    engine, joins its sentences' hypotheses). As many as the sentence with the most has, up to
    ``alternatives``."""
    count = min(alternatives, max((len(s.result.alternatives) for s in segments), default=0))
    return [segments] + [
        [replace(s, result=s.result.alternatives[i]) if i < len(s.result.alternatives) else s for s in segments]
        for i in range(count)
    ]


def unchanged(texts: Sequence[str], format: str) -> list[TextTranslation]:
    """Texts already in the target language as their own translations, their format and markup checked as a
    translation's are; confidence 0, the most a mean log-probability can be."""
    for text in texts:
        markup.parse(text, format)
    return [as_sent(text) for text in texts]
