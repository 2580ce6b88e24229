"""Suggested translations (LibreTranslate's ``POST /suggest``), kept for whoever improves the models.

Each is one JSON object ``{"q", "s", "source", "target", "time"}`` (the text, the suggested translation, the
lower-cased language codes, and seconds since the epoch): pushed onto the Redis list ``translate:suggestions``
where ``--redis-url`` is set, so that every replica's land in one place, else appended as one line to
``--suggestions-file`` (by default ``suggestions.jsonl`` in ``--files-dir``, else in the working directory).
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

from server.config import ServerConfig
from server.errors import InvalidRequest, Unavailable

REDIS_LIST = "translate:suggestions"
FILE_NAME = "suggestions.jsonl"
FIELDS = ("q", "s", "source", "target")


def suggestion_of(fields: dict[str, Any]) -> dict[str, Any]:
    """The suggestion in a request's fields, each of q, s, source and target a string that is not empty."""
    suggestion: dict[str, Any] = {}
    for name in FIELDS:
        value = fields.get(name)
        if not value:
            raise InvalidRequest(f"Invalid request: missing {name} parameter")
        if not isinstance(value, str):
            raise InvalidRequest(f"{name} must be a string")
        suggestion[name] = value.lower() if name in ("source", "target") else value
    return suggestion | {"time": round(time.time(), 3)}


class FileSuggestions:
    """One JSON line per suggestion, appended (O_APPEND: replicas sharing the file never interleave a line)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    async def add(self, suggestion: dict[str, Any]) -> None:
        line = json.dumps(suggestion, ensure_ascii=False) + "\n"
        await asyncio.to_thread(self._append, line.encode())

    def _append(self, line: bytes) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path, "ab") as file:
            file.write(line)


class RedisSuggestions:
    """Each suggestion pushed onto one Redis list that every replica shares."""

    def __init__(self, url: str) -> None:
        import redis.asyncio

        self.redis = redis.asyncio.from_url(url, socket_timeout=0.5, socket_connect_timeout=0.5)

    async def add(self, suggestion: dict[str, Any]) -> None:
        try:
            await self.redis.rpush(REDIS_LIST, json.dumps(suggestion, ensure_ascii=False))
        except Exception as e:  # a suggestion not kept must not look kept: the caller may send it again
            raise Unavailable(f"the suggestion was not stored (Redis: {type(e).__name__}); try again later") from e


def suggestion_store(config: ServerConfig) -> FileSuggestions | RedisSuggestions | None:
    """Where this server keeps suggestions; None when --suggestions is off."""
    if not config.suggestions:
        return None
    if config.redis_url:
        return RedisSuggestions(config.redis_url)
    return FileSuggestions(config.suggestions_file or (config.files_dir or Path.cwd()) / FILE_NAME)
