"""What pages read from the HTTP API (server/doors/http.py): our page at / (server/page/: plain HTML and JavaScript
on the API, no build step) and its files, and what LibreTranslate's page reads: the languages with their names
(/languages) and its settings (/frontend/settings)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from aiohttp import web

from server.config import ServerConfig
from server.documents.files import SUFFIXES
from server.models import AUTO, Models
from server.operations.keys import KeyGuard

# ISO 639-1 names for /languages (LibreTranslate's "name"); a code not listed is its own name.
LANGUAGE_NAMES = {
    AUTO: "Auto Detect",
    "ar": "Arabic",
    "cs": "Czech",
    "da": "Danish",
    "de": "German",
    "el": "Greek",
    "en": "English",
    "es": "Spanish",
    "fi": "Finnish",
    "fr": "French",
    "hu": "Hungarian",
    "it": "Italian",
    "ja": "Japanese",
    "ko": "Korean",
    "nl": "Dutch",
    "pl": "Polish",
    "pt": "Portuguese",
    "ro": "Romanian",
    "ru": "Russian",
    "sv": "Swedish",
    "tr": "Turkish",
    "uk": "Ukrainian",
    "zh": "Chinese",
}
PAGE = Path(__file__).resolve().parents[1] / "page"  # server/page/
# The page at / (plain HTML and JavaScript on this API, no build step), its files and their types.
PAGE_FILES = {
    "/": ("index.html", "text/html"),
    "/page.js": ("page.js", "text/javascript"),
    "/page.css": ("page.css", "text/css"),
}
# The page runs only its own files and talks only to this server.
PAGE_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'",
    "X-Content-Type-Options": "nosniff",
}
FRONTEND_TIMEOUT_MS = 500  # how long LibreTranslate's page waits after typing before it translates


def page_file(file: str, content_type: str) -> web.Response:
    """One of the page's files (PAGE_FILES)."""
    body = (PAGE / file).read_bytes()
    return web.Response(body=body, content_type=content_type, charset="utf-8", headers=PAGE_HEADERS)


def languages(models: Models) -> list[dict[str, Any]]:
    """Each source language with the targets the server translates it into, in model order."""
    targets: dict[str, list[str]] = {}
    for engine in models:
        targets.setdefault(engine.source_language, []).append(engine.target_language)
    return [{"code": code, "name": LANGUAGE_NAMES.get(code, code), "targets": codes} for code, codes in targets.items()]


def frontend_settings(models: Models, keys: KeyGuard, config: ServerConfig) -> dict[str, Any]:
    """LibreTranslate's page settings: the characters a request may hold (-1: any), whether keys are on and
    required, whether /suggest takes suggestions, the file formats it translates; the page starts from auto
    (where detection is on) and the default model's target."""
    default = models.default
    target = default.target_language
    source = AUTO if config.language_detection != "off" else default.source_language
    return {
        "charLimit": config.char_limit,
        "frontendTimeout": FRONTEND_TIMEOUT_MS,
        "apiKeys": keys.enabled,
        "keyRequired": keys.anonymous is None,
        "suggestions": config.suggestions,
        "filesTranslation": True,
        "supportedFilesFormat": list(SUFFIXES),
        "language": {
            "source": {"code": source, "name": LANGUAGE_NAMES.get(source, source)},
            "target": {"code": target, "name": LANGUAGE_NAMES.get(target, target)},
        },
    }
