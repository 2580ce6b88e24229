"""The models one server holds, and which of them a request means.

A request names a model by name (``name`` or ``name@version``), by its languages, or both; a request that
names nothing gets the default model (the first ``--model``), so the clients of a one-model server need not
change. Exactly one model must match what the request names; otherwise the caller hears which pairs the
server has (``InvalidRequest``).
"""

from __future__ import annotations

from collections.abc import Sequence

from server.config import LanguageDetection
from server.documents.detect import Detected, LanguageDetector
from server.documents.formatting import nothing_to_translate
from server.errors import InvalidRequest
from server.interface import Engine

AUTO = "auto"  # the source language that asks the server to detect it


def _letterless(texts: Sequence[str]) -> bool:
    """Texts, one at least not blank, of which none has a letter."""
    return any(map(nothing_to_translate, texts)) and all(nothing_to_translate(t) or not t.strip() for t in texts)


def pair(engine: Engine) -> str:
    return f"{engine.source_language}→{engine.target_language}"


def model_name(engine: Engine | None) -> str:
    """An engine's ``name@version`` as responses give it (gRPC's ``model``, HTTP's ``X-Translation-Model``); ""
    before a request's model is known."""
    return f"{engine.name}@{engine.version}" if engine is not None else ""


class Models:
    def __init__(self, engines: Sequence[Engine], detection: LanguageDetection = "accurate") -> None:
        if not engines:
            raise ValueError("a server needs at least one model")
        names = [engine.name for engine in engines]
        if duplicated := sorted({name for name in names if names.count(name) > 1}):
            raise ValueError(
                f"several model folders are named {', '.join(duplicated)}; each model needs its own name (the "
                "\"name\" in its checkpoint's config.json, carried into the export's manifest)"
            )
        self.engines = list(engines)
        self.detector = LanguageDetector((engine.source_language for engine in self.engines), detection)

    def __iter__(self):
        return iter(self.engines)

    def __len__(self) -> int:
        return len(self.engines)

    @property
    def default(self) -> Engine:
        return self.engines[0]

    @property
    def names(self) -> list[str]:
        return [engine.name for engine in self.engines]

    @property
    def languages(self) -> set[str]:
        """Every language code a model reads or writes."""
        return {code for engine in self.engines for code in (engine.source_language, engine.target_language)}

    def describe(self) -> str:
        """'en→de (en-de-transformer), de→en (de-en-transformer)'."""
        return ", ".join(f"{pair(engine)} ({engine.name})" for engine in self.engines)

    def choose(
        self,
        texts: Sequence[str],
        model: str = "",
        source: str = "",
        target: str = "",
        format: str = "text",
        pass_through: bool = True,
    ) -> tuple[Engine | None, Detected | None]:
        """A translation request's model (codes in any case), and what was detected for source "auto"; no
        model where LibreTranslate answers the texts as sent: a source that is the target, "auto" detecting
        the target's language, or "auto" on texts that pass through whole (``pass_through`` in format "text":
        no letter in any, server/documents/formatting.py), which have no language to detect and are reported as the
        target's with confidence 0. InvalidRequest names the detected language when no model takes it, and the
        server's pairs whenever detection fails."""
        source, target = source.lower(), target.lower()
        if source == AUTO:
            if pass_through and format == "text" and target in self.languages and _letterless(texts):
                return None, Detected(target, 0.0)
            detected = self.detect(texts, format)
            if detected.language == target:
                return None, detected
            return self.resolve_detected(detected, model, target), detected
        if source and source == target and source in self.languages:
            return None, None
        return self.resolve(model, source, target), None

    def detect(self, texts: Sequence[str], format: str = "text") -> Detected:
        """The served source language of texts taken together; InvalidRequest names the server's pairs when
        detection fails."""
        try:
            return self.detector.best(texts, format)
        except InvalidRequest as error:
            raise InvalidRequest(f"{error}; this server translates {self.describe()}") from error

    def resolve_detected(self, detected: Detected, model: str = "", target: str = "") -> Engine:
        """The model for texts detected in ``detected``'s language; InvalidRequest names it when none takes it."""
        try:
            return self.resolve(model, detected.language, target)
        except InvalidRequest as error:
            raise InvalidRequest(
                f"source=auto detected {detected.language!r} ({detected.confidence:.0f}%), but {error}"
            ) from error

    def resolve(self, model: str = "", source: str = "", target: str = "") -> Engine:
        """The one model that matches every field given (empty fields match any), or the default when none
        is given. Raises InvalidRequest naming the server's pairs when none or several match."""
        if not (model or source or target):
            return self.default
        source, target = source.lower(), target.lower()
        matches = [
            engine
            for engine in self.engines
            if model in ("", engine.name, f"{engine.name}@{engine.version}")
            and source in ("", engine.source_language)
            and target in ("", engine.target_language)
        ]
        if len(matches) == 1:
            return matches[0]
        asked = " ".join(
            f"{field}={value!r}" for field, value in (("model", model), ("source", source), ("target", target)) if value
        )
        if not matches:
            raise InvalidRequest(f"no model here matches {asked}; this server translates {self.describe()}")
        raise InvalidRequest(
            f"{asked} matches several models ({', '.join(e.name for e in matches)}); give both languages or the "
            "model's name"
        )
