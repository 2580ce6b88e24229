"""Language detection for ``source: "auto"`` and ``/detect``: which served language a text is in, or which
language no model reads it is in.

lingua (its models ship inside its wheel; nothing is downloaded) weighs a text twice: among the served source
languages (and NEAR, in accurate mode) in the ``--language-detection`` mode, and among all 75 languages it knows
by their trigrams (its light mode, whatever the server's). A request's texts are detected together, as one
language: one request is translated by one model. ``best`` (source "auto") answers a served language, or refuses
with InvalidRequest (400 / INVALID_ARGUMENT, which server/models.py completes with the server's pairs):

- a language no model reads: a NEAR one NEAR_ODDS times likelier than the served language found, or any other
  FAR_ODDS times likelier by trigrams (names it: "source=auto detected French (fr, 100%), ...");
- uncertain: the served language found less than MIN_LEAD times likelier than the next served one (under
  52.4% where two are served; "A man" is English 51%, German 49%);
- nothing to detect: no letters, or too few, of any language lingua knows ("12345").

Nonsense mostly reads as some language no model reads ("asdfgh qwerty zxcv" as Maori) and is refused as that.
``detect`` (/detect) reports without refusing: the unserved language first, with the others lingua weighed, where
it is the verdict; else the served languages, their shares of the served languages' likelihoods. The
confidences both report are calibrated (SHARPNESS) so that clear text scores near 100, as LibreTranslate's do.

Measured on test_2016_flickr with en and de served (``python benchmarks/language_detection.py``, 2026-11-27, AMD
EPYC x86-64, 2 cores, AVX-512; benchmarks/language_detection.md). Before, lingua weighed the served languages
alone: +82 / +10 MiB, 100% of the sentences right, French ones taken for English or German.

| mode | resident (against off) | sentences right, en / de | first 1-3 words right | French refused | per sentence |
|---|---|---|---|---|---|
| accurate (every n-gram model; the default) | +184 MiB | 99.7% / 99.9% | 85.5% / 98.6% | 99.6% as French | 0.4 ms |
| light (trigrams only) | +77 MiB | 99.6% / 99.9% | 64.0% / 98.4% | 97.7% as French | 0.2 ms |

"off" refuses "auto".
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
# Languages whose accurate models the accurate mode holds beside the served ones: the most spoken Latin-script
# languages after English (Spanish, French, Portuguese). Latin script is where trigrams alone, all the light mode
# has, confuse short texts ("Le chat dort sur le canapé." reads as Tagalog). The three add about 60 MiB resident
# (+124 MiB without them, +184 with), the accurate models of all 75 languages 1.2 GiB.
NEAR = ("es", "fr", "pt")
# How much likelier than the served language found a language no model reads must be to be the verdict: a NEAR
# one by its accurate models, any other by lingua's trigrams, which err more on short texts. Measured on
# test_2016_flickr (benchmarks/language_detection.md): NEAR_ODDS 2 and 3 both keep 99.7% of the English sentences
# and refuse 99.6% and 99.0% of the French ones as French (73% and 55% of their first 1-3 words); FAR_ODDS 30 and
# 100 keep 99.4% and 99.7% (accurate) or 99.3% and 99.6% (light) of the English sentences (the rest read as
# Danish, Tagalog, Sotho...), and 100 still names "Le chat dort sur le canapé." French rather than Tagalog.
NEAR_ODDS = 2.0
FAR_ODDS = 100.0
# The served language found must be this many times likelier than the next served one (52.4% of two): every
# test_2016_flickr sentence clears it in both modes; in accurate mode "A man" and "An" (English 51%) do not.
MIN_LEAD = 1.1
# The confidences reported (/detect, detectedLanguage) are lingua's raised to this power and renormalised (as a
# lower softmax temperature sharpens, keeping the order): lingua's own stay moderate on whole clear sentences (92%
# English for "A man rides his bike down the street.", LibreTranslate's 100), 62.5% of test_2016_flickr's English
# sentences scoring 95 or more. Measured there with en and de served
# (``python benchmarks/language_detection.py``, accurate mode; the sentences' top confidence, 5th percentile /
# median / share ≥ 95):
#   power 1: en 83.2 / 96.7 / 62.5%, de 97.5 / 100 / 97.9%
#   power 2: en 96.1 / 99.9 / 96.3%, de 99.9 / 100 / 99.8%
#   power 3: en 99.2 / 100 / 99.1%, de 100 / 100 / 99.9%
# while a coin toss stays one ("A man": 51.2 → 53.6) and the first 1-3 words detected wrongly stay unsure
# (median 55 → 72 English, 62 → 86 German; 3 → 8 of the 47 reach 95). Decisions (MIN_LEAD, the odds) read the
# likelihoods before it.
SHARPNESS = 3


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


def _name(code: str) -> str:
    """'French' for 'fr'."""
    return _lingua_language(code).name.title()


def _build(builder, mode: LanguageDetection):
    if mode == "light":
        builder = builder.with_low_accuracy_mode()
    return builder.with_preloaded_language_models().build()


def _likelihoods(detector, text: str) -> dict[str, float]:
    """Language code → lingua's confidence (0-1, summing to 1), best first, those with no chance left out."""
    return {
        value.language.iso_code_639_1.name.lower(): value.value
        for value in detector.compute_language_confidence_values(text)
        if value.value > 0
    }


def _calibrated(likelihoods: dict[str, float], sharpness: float) -> dict[str, float]:
    """The likelihoods raised to ``sharpness``, summing to 1, in their order."""
    sharpened = {code: value**sharpness for code, value in likelihoods.items()}
    total = sum(sharpened.values()) or 1.0
    return {code: value / total for code, value in sharpened.items()}


def _listed(likelihoods: dict[str, float], sharpness: float) -> list[Detected]:
    found = (Detected(code, round(100 * value, 2)) for code, value in _calibrated(likelihoods, sharpness).items())
    return [detected for detected in found if detected.confidence > 0]


class LanguageDetector:
    """Which served language a text is in, or that it is in none: lingua over the served languages and
    ``near_languages`` in the server's mode (their likelihoods: ``near``), and over all 75 languages it knows by
    trigrams (``everyone``). Its confidences are calibrated at ``sharpness`` (SHARPNESS; 1: lingua's own)."""

    def __init__(
        self, languages: Iterable[str], mode: LanguageDetection = "accurate", sharpness: float = SHARPNESS
    ) -> None:
        self.languages = sorted(set(languages))
        self.mode, self.sharpness = mode, sharpness
        # Light mode holds trigrams only, which ``everyone`` weighs already for NEAR.
        self.near_languages = NEAR if mode == "accurate" else ()
        self._near = self._everyone = None
        if mode == "off":  # lingua is not even imported
            return
        known = {code: _lingua_language(code) for code in {*self.languages, *self.near_languages}}
        if unknown := sorted(code for code, language in known.items() if language is None):
            raise ValueError(f"no language detection for {', '.join(unknown)} (lingua knows ISO 639-1 codes)")
        from lingua import LanguageDetectorBuilder

        self._near = _build(LanguageDetectorBuilder.from_languages(*known.values()), mode)
        # Light whatever the mode: the accurate models of all 75 languages hold 1.2 GiB (NEAR).
        self._everyone = _build(LanguageDetectorBuilder.from_all_languages(), "light")

    def detect(self, text: str, format: str = "text") -> list[Detected]:
        """The languages text may be in, best first: a language no model reads first where it is the verdict
        (with the others lingua weighed), else the served languages (those with no chance left out; none for
        text without letters of any language lingua knows)."""
        near, everyone = self._read(text, format)
        if unserved := self._unserved(near, everyone):
            return _listed(unserved[1], self.sharpness)
        return _listed(self._served(near), self.sharpness)

    def best(self, texts: Sequence[str], format: str = "text") -> Detected:
        """The served language of texts taken together; InvalidRequest when they are in a language no model
        reads, in none that can be told, or in one not MIN_LEAD times likelier than the next served one."""
        near, everyone = self._read("\n".join(texts), format)
        if unserved := self._unserved(near, everyone):
            language, likelihoods = unserved
            raise InvalidRequest(
                f"source=auto detected {_name(language)} ({language}, {100 * likelihoods[language]:.0f}%), which "
                f"no model here translates from (they read {', '.join(self.languages)})"
            )
        if not (served := self._served(near)):
            raise InvalidRequest(
                "source=auto: the language of the text cannot be detected (it has no words, or too few, of any "
                "language the detector knows); give the source language"
            )
        (language, share), *others = served.items()
        if others and share < MIN_LEAD * others[0][1]:
            raise InvalidRequest(
                f"source=auto: the language of the text is uncertain ({_name(language)} {100 * share:.0f}%, "
                f"{_name(others[0][0])} {100 * others[0][1]:.0f}%; detection needs {MIN_LEAD} times the next); "
                "give the source language"
            )
        return Detected(language, round(100 * _calibrated(served, self.sharpness)[language], 2))

    def _read(self, text: str, format: str) -> tuple[dict[str, float], dict[str, float]]:
        """The likelihoods of text's languages among the served ones and ``near_languages``, and among all
        lingua knows."""
        if self.mode == "off":
            raise InvalidRequest("language detection is off on this server (--language-detection off); give source")
        if format == "html":
            text = TAG.sub(" ", text[: 4 * DETECT_CHARS])
        text = text[:DETECT_CHARS]
        return _likelihoods(self._near, text), _likelihoods(self._everyone, text)

    def _served(self, near: dict[str, float]) -> dict[str, float]:
        """The served languages' shares of their likelihoods together, best first."""
        served = {code: value for code, value in near.items() if code in self.languages}
        return {code: value / sum(served.values()) for code, value in served.items()}

    def _unserved(self, near: dict[str, float], everyone: dict[str, float]) -> tuple[str, dict[str, float]] | None:
        """The language no model reads that is the verdict, if one is, and the likelihoods that found it: one
        beyond ``near_languages``, FAR_ODDS times likelier by trigrams than the language ``near`` found; else one
        of ``near_languages``, NEAR_ODDS times likelier than the served language found."""
        far = next((code for code in everyone if code not in self.languages and code not in self.near_languages), None)
        if far and everyone[far] >= FAR_ODDS * everyone.get(next(iter(near), ""), 0.0):
            return far, everyone
        served = next((code for code in near if code in self.languages), "")
        unserved = next((code for code in near if code not in self.languages), None)
        if unserved and near[unserved] >= NEAR_ODDS * near.get(served, 0.0):
            return unserved, near
        return None
