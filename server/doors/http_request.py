"""Reading a LibreTranslate request (server/doors/http.py): its fields, from a JSON object or a form over those of its
query string, the values of q, alternatives and min_confidence in them, and the translation's options they make;
what cannot be read is InvalidRequest, with what to send instead."""

from __future__ import annotations

import json
import time
from typing import Any

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError

from server.config import ServerConfig
from server.documents.detect import Detected
from server.errors import InvalidRequest
from server.interface import Engine
from server.models import Models
from server.options import TranslateOptions
from server.scheduling.jobs import decode_options

FORM_TYPES = ("application/x-www-form-urlencoded", "multipart/form-data")


async def request_fields(request: web.Request) -> dict[str, Any]:
    """The request's fields from a JSON object or a form (a form's repeated q is a list), over those of its
    query string: LibreTranslate reads both, and clients such as deep-translator send only the latter."""
    return {**_multi(request.query), **await _body_fields(request)}


async def _body_fields(request: web.Request) -> dict[str, Any]:
    if request.content_type in FORM_TYPES:
        try:
            form = await request.post()
        except (ValueError, HttpProcessingError) as e:  # bytes not of the charset, a multipart that will not parse
            raise InvalidRequest(f"the form body cannot be read ({e}); send {' or '.join(FORM_TYPES)}") from e
        return _multi(form)
    body = _decoded(await request.read(), request.charset or "utf-8")
    if not body.strip():
        return {}
    try:
        fields = json.loads(body)
    except json.JSONDecodeError as e:
        raise InvalidRequest(f"the body is not valid JSON ({e.msg} at character {e.pos}); send a JSON object") from e
    if not isinstance(fields, dict):
        raise InvalidRequest("the body must be a JSON object with q, source and target")
    try:  # JSON's \ud800 escapes make strings that no encoder (the tokenizer's included) can take
        json.dumps(fields, ensure_ascii=False).encode()
    except UnicodeEncodeError as e:
        raise InvalidRequest(
            f"the body holds a lone surrogate escape ({e.object[e.start : e.end]!r}); escape characters "
            "outside the Basic Multilingual Plane as surrogate pairs, or send them as UTF-8"
        ) from e
    return fields


def _multi(values) -> dict[str, Any]:
    """A form's or query string's fields; a repeated q is a list."""
    fields: dict[str, Any] = dict(values)
    if len(qs := values.getall("q", [])) > 1:
        fields["q"] = list(qs)
    return fields


def _decoded(body: bytes, charset: str) -> str:
    try:
        return body.decode(charset)
    except LookupError as e:
        raise InvalidRequest(f"charset={charset!r} is unknown; send JSON in UTF-8") from e
    except UnicodeDecodeError as e:
        raise InvalidRequest(
            f"the body is not valid {charset} (byte {body[e.start]:#04x} at offset {e.start}); send JSON in UTF-8"
        ) from e


def texts_of(fields: dict[str, Any]) -> tuple[list[str], bool]:
    """q as a list of texts, and whether it came as a list."""
    q = fields.get("q")
    if q is None or q == "" or q == []:
        raise InvalidRequest("Invalid request: missing q parameter")
    if isinstance(q, str):
        return [q], False
    if isinstance(q, list) and all(isinstance(text, str) for text in q):
        return q, True
    raise InvalidRequest("q must be a string or a list of strings")


def alternatives_of(fields: dict[str, Any]) -> int:
    """LibreTranslate's alternatives: a whole number, 0 when absent or empty (a form's field is text)."""
    value = fields.get("alternatives")
    if value in (None, ""):
        return 0
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        return int(value)
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    raise InvalidRequest(f"alternatives={value!r} must be a whole number, e.g. 3")


def min_confidence_of(fields: dict[str, Any]) -> float | None:
    """Our min_confidence: a number, None when absent or empty."""
    value = fields.get("min_confidence")
    if value in (None, ""):
        return None
    try:
        return float(value)
    except (TypeError, ValueError):
        raise InvalidRequest(f"min_confidence={value!r} must be a number, e.g. -1.0") from None


def switch_of(fields: dict[str, Any], name: str) -> bool:
    """A default-on switch (mirror_formatting, pass_through): JSON true/false, or a form's true/false/1/0;
    on when absent or empty."""
    value = fields.get(name)
    if value is None or value == "" or isinstance(value, bool):  # not 1 or 0 in JSON: a number is no switch
        return value is not False
    if isinstance(value, str) and value.strip().lower() in ("true", "1", "false", "0"):
        return value.strip().lower() in ("true", "1")
    raise InvalidRequest(f"{name}={value!r} must be true or false")


def translate_options(fields: dict[str, Any], config: ServerConfig) -> TranslateOptions:
    """A /translate request's options: LibreTranslate's alternatives, format and our min_confidence,
    mirror_formatting and pass_through; the server's beam and output limit; http_timeout_s to answer in; its texts
    are "q", and an empty one is kept."""
    return TranslateOptions(
        decode_options(config, alternatives=alternatives_of(fields)),
        deadline=time.monotonic() + config.http_timeout_s,
        min_confidence=min_confidence_of(fields),
        format=str(fields.get("format") or "text"),
        field="q",
        keep_empty=True,
        mirror_formatting=switch_of(fields, "mirror_formatting"),
        pass_through=switch_of(fields, "pass_through"),
    )


def file_options(format: str, config: ServerConfig) -> TranslateOptions:
    """A file's options: the server's decoding, one http_timeout_s for all its texts, and its texts as the model
    wrote them (a file's lines and paragraphs are not mirrored, as LibreTranslate's files are not)."""
    deadline = time.monotonic() + config.http_timeout_s
    return TranslateOptions(
        decode_options(config), deadline, None, format, "file", keep_empty=True, mirror_formatting=False
    )


def model_of(
    models: Models, fields: dict[str, Any], texts: list[str], options: TranslateOptions
) -> tuple[Engine | None, Detected | None]:
    """The model of the request's source and target languages (both required, as in LibreTranslate), and what was
    detected when the source is "auto"; no model when the texts are in the target language already
    (``Models.choose``)."""
    source, target = fields.get("source"), fields.get("target")
    pairs = models.describe()
    for name, value in (("source", source), ("target", target)):
        if not value:
            raise InvalidRequest(f"Invalid request: missing {name} parameter (this server translates {pairs})")
        if not isinstance(value, str):
            raise InvalidRequest(f"{name} must be a language code, e.g. {models.default.source_language!r}")
    return models.choose(texts, "", source, target, options.format, options.pass_through)
