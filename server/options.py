"""What a translation request asks for, whichever front end it came through (``TranslateOptions``): how its
sentences decode, when it must be answered, how its texts are read, finished and flagged."""

from __future__ import annotations

from dataclasses import dataclass

from server.documents.glossary import Glossary
from server.scheduling.jobs import DecodeOptions


@dataclass(frozen=True)
class TranslateOptions:
    """A request's options, built once by its front end (gRPC ``TranslatorService._options``, HTTP
    ``server.doors.http_request.translate_options``) and carried unchanged through ``Translations`` to the job, the
    cache key and the answer: how its sentences decode, when it must be answered, and how its texts are read and
    flagged."""

    decode: DecodeOptions
    deadline: float | None = None  # a time.monotonic() instant
    min_confidence: float | None = None  # sentences under it flag their text low_confidence
    format: str = "text"  # "html": the texts' markup is kept
    field: str = "texts"  # what errors call the texts (LibreTranslate's "q", a file's "file")
    keep_empty: bool = False  # an empty text translates to itself instead of being refused
    # LibreTranslate's finishing of plain texts (server/documents/formatting.py): the source's case and final
    # punctuation on its translation, and a text with no letters as its own translation
    mirror_formatting: bool = True
    pass_through: bool = True
    glossary: Glossary | None = None  # its terms translated as it says (server/documents/glossary.py)
