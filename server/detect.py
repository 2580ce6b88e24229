"""Language detection for ``source: "auto"`` and ``/detect``, among the languages the served models read.

lingua (its models ship inside its wheel; nothing is downloaded), restricted to the served source languages. A
request's texts are detected together, as one language: one request is translated by one model. Measured on
test_2016_flickr restricted to en and de (2-core x86-64), by ``--language-detection``:

| mode | resident memory (against off) | sentences right (en / de) | their first 1-3 words right (en / de) |
|---|---|---|---|
| accurate (lingua's every n-gram model; the default) | +72 MiB | 100% / 100% | 97.7% / 99.2% |
| light (its trigrams only) | +10 MiB | 99.8% / 100% | 64.8% / 98.8% |

py3langid, restricted the same way, named 100% of the sentences and 89% of random 1-3-word snippets (lingua
accurate 96%). A sentence costs lingua accurate about 0.1 ms. "off" refuses "auto".
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from server.config import LanguageDetection
from server.errors import InvalidRequest

# Detection reads a text's first characters only: enough to tell a language, and a bounded cost (the front
# ends detect on their event loop).
DETECT_CHARS = 2000
TAG = re.compile(r"<[^>]*>")  # markup's tags say nothing of its language (and their names look English)


@dataclass(frozen=True)
class Detected:
    language: str  # ISO 639-1, as the models name their languages
    confidence: float  # 0-100, as LibreTranslate gives it


def _lingua_language(code: str):
    from lingua import IsoCode639_1, Language

    try:
        return Language.from_iso_code_639_1(IsoCode639_1.from_str(code))
    except ValueError:
        return None


class LanguageDetector:
    def __init__(self, languages: Iterable[str], mode: LanguageDetection = "accurate") -> None:
        self.languages = sorted(set(languages))
        self.mode = mode
        self._detector = None
        if mode == "off":  # lingua is not even imported
            return
        known = {code: _lingua_language(code) for code in self.languages}
        if unknown := sorted(code for code, language in known.items() if language is None):
            raise ValueError(f"no language detection for {', '.join(unknown)} (lingua knows ISO 639-1 codes)")
        if len(self.languages) > 1:
            from lingua import LanguageDetectorBuilder

            builder = LanguageDetectorBuilder.from_languages(*known.values())
            if mode == "light":
                builder = builder.with_low_accuracy_mode()
            self._detector = builder.with_preloaded_language_models().build()

    def detect(self, text: str, format: str = "text") -> list[Detected]:
        """The languages text may be in, best first (those with no chance left out; none for text without
        letters of any of them)."""
        if self.mode == "off":
            raise InvalidRequest("language detection is off on this server (--language-detection off); give source")
        if format == "html":
            text = TAG.sub(" ", text[: 4 * DETECT_CHARS])
        text = text[:DETECT_CHARS]
        if self._detector is None:  # one language served: text in it, if it has letters at all
            return [Detected(self.languages[0], 100.0)] if any(c.isalpha() for c in text) else []
        values = self._detector.compute_language_confidence_values(text)
        return [
            Detected(value.language.iso_code_639_1.name.lower(), round(100 * value.value, 2))
            for value in values
            if value.value > 0
        ]

    def best(self, texts: Sequence[str], format: str = "text") -> Detected:
        """The language of texts taken together; InvalidRequest when none can be told."""
        found = self.detect("\n".join(texts), format)
        if not found:
            raise InvalidRequest(
                f"source=auto: the language of the text cannot be detected (it has no words of "
                f"{', '.join(self.languages)}); give the source language"
            )
        return found[0]
