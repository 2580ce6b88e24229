"""POST /suggest with --suggestions on: LibreTranslate's fields and answers, kept in a JSON-lines file or in a
real Redis that replicas share (off by default: tests/server/doors/test_http.py)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from server.documents.suggestions import RedisSuggestions, suggestion_store
from testkit.servers import RunningServer, http, server_config, start_server


@pytest.fixture(scope="module")
def files_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("files")


@pytest.fixture(scope="module")
def suggesting(tiny_export: Path, files_dir: Path) -> Iterator[RunningServer]:
    server = start_server(tiny_export, suggestions=True, files_dir=files_dir)
    yield server
    server.close()


def kept(files_dir: Path) -> list[dict]:
    """The suggestions in the file, without their time."""
    path = files_dir / "suggestions.jsonl"
    lines = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
    assert all(line.pop("time") > 0 for line in lines)
    return lines


def test_a_suggestion_is_appended_to_the_file_in_the_files_dir(suggesting: RunningServer, files_dir: Path):
    ok = {"method": "HTTP /suggest", "code": "OK"}
    before, lines = suggesting.count("translate_requests_total", ok), len(kept(files_dir))
    suggestion = {"q": "Hello", "s": "Hallo", "source": "EN", "target": "de"}
    assert http(suggesting, "/suggest", suggestion)[::2] == (200, {"success": True})
    form = {"q": "Cat 🐈", "s": "Katze 🐈", "source": "en", "target": "de"}
    assert http(suggesting, "/suggest", form=form)[::2] == (200, {"success": True})
    assert suggesting.count("translate_requests_total", ok) - before == 2
    assert http(suggesting, "/frontend/settings")[2]["suggestions"] is True  # LibreTranslate's page offers it
    assert kept(files_dir)[lines:] == [{**suggestion, "source": "en"}, form]


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"s": "Hallo", "source": "en", "target": "de"}, "Invalid request: missing q parameter"),
        ({"q": "Hello", "source": "en", "target": "de"}, "Invalid request: missing s parameter"),
        ({"q": "Hello", "s": "Hallo", "target": "de"}, "Invalid request: missing source parameter"),
        ({"q": "Hello", "s": "Hallo", "source": "en"}, "Invalid request: missing target parameter"),
        ({"q": "Hello", "s": ["Hallo"], "source": "en", "target": "de"}, "s must be a string"),
    ],
)
def test_a_suggestion_missing_a_field_is_libretranslates_400(
    suggesting: RunningServer, files_dir: Path, fields, message
):
    lines = len(kept(files_dir))
    assert http(suggesting, "/suggest", fields)[::2] == (400, {"error": message})
    assert len(kept(files_dir)) == lines


def test_replicas_push_suggestions_onto_one_redis_list(tiny_export: Path, redis_url: str):
    redis = pytest.importorskip("redis")
    servers = [start_server(tiny_export, suggestions=True, redis_url=redis_url) for _ in range(2)]
    try:
        for server, word in zip(servers, ("Hallo", "Servus"), strict=True):
            suggestion = {"q": "Hello", "s": word, "source": "en", "target": "de"}
            assert http(server, "/suggest", suggestion)[::2] == (200, {"success": True})
    finally:
        for server in servers:
            server.close()
    stored = [json.loads(item) for item in redis.Redis.from_url(redis_url).lrange("translate:suggestions", 0, -1)]
    assert [item["s"] for item in stored] == ["Hallo", "Servus"]


def test_a_suggestion_redis_cannot_take_is_503_not_success(tiny_export: Path):
    server = start_server(tiny_export, suggestions=True, redis_url="redis://127.0.0.1:1/0")  # nothing listens
    try:
        status, _, body = http(server, "/suggest", {"q": "Hello", "s": "Hallo", "source": "en", "target": "de"})
        assert status == 503 and "the suggestion was not stored" in body["error"]
    finally:
        server.close()


def test_the_store_is_redis_else_the_file_named_else_one_in_the_files_dir(tiny_export: Path, tmp_path: Path):
    def store(**overrides):
        return suggestion_store(server_config(tiny_export, **overrides))

    assert store() is None  # off: 403
    assert isinstance(store(suggestions=True, redis_url="redis://127.0.0.1:1/0"), RedisSuggestions)
    assert store(suggestions=True, suggestions_file=tmp_path / "s.jsonl").path == tmp_path / "s.jsonl"
    assert store(suggestions=True, files_dir=tmp_path).path == tmp_path / "suggestions.jsonl"
    assert store(suggestions=True).path == Path.cwd() / "suggestions.jsonl"
