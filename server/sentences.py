"""A sentence's first stage through the server, which every later one builds on: split from its text and tokenized
(``SplitSentence``, made by server/documents/text.py), then queued for the engine
(server/scheduling/jobs.py's ``QueuedSentence``), decoded (server/answers.py's ``DecodedSentence``) and, with
markup, aligned for placement (server/documents/aligned.py's ``AlignedSentence``). It lives apart from the
documents and from the scheduling that both speak of it."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SplitSentence:
    """A sentence of a request's text, tokenized: the first of its stages (see the module's doc)."""

    text_index: int
    segment_index: int
    source: str
    ids: list[int]
    truncated: bool = False
    separator: str = " "  # the whitespace that follows it in its text (a line break keeps the layout)
    # A sentence over the segment bound (server.documents.text.TextLimits.sentence_tokens) is cut: which piece this is
    chunk: int = 0
    capitals: bool = False  # written in capitals: translated in the model's case, its translation in capitals
    align: bool = False  # its translation is aligned to it (markup or terms to place): its encoder's output is kept


class AfterSplit:
    """What every later stage of a sentence tells of its source (each has the SplitSentence as ``spec``)."""

    spec: SplitSentence

    @property
    def source_tokens(self) -> int:
        return len(self.spec.ids)
