"""LibreTranslate's finishing over HTTP: case and final punctuation mirrored, text without letters passed
through, each turned off by its request field (the tiny model's words are not asserted, only their form)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from proto import translate_pb2
from server.documents.formatting import mirror, nothing_to_translate
from testkit.servers import RunningServer, http, start_server


@pytest.fixture(scope="module")
def running(tiny_export: Path) -> Iterator[RunningServer]:
    server = start_server(tiny_export)
    yield server
    server.close()


def translated(running: RunningServer, q: str, **fields) -> str:
    status, _, body = http(running, "/translate", {"q": q, "source": "en", "target": "de", **fields})
    assert status == 200, body
    return body["translatedText"]


@pytest.mark.parametrize(
    ("source", "translation", "expected"),
    [
        ("a man is sleeping", "Ein Mann schläft.", "ein mann schläft"),
        ("A MAN IS SLEEPING!", "Ein Mann schläft.", "EIN MANN SCHLÄFT!"),
        ("A man is sleeping?", "ein Mann schläft", "Ein Mann schläft?"),
        ("a Man", " Ein Mann.\n", " ein Mann\n"),
        ("42 Men", "42 Männer.", "42 Männer"),
    ],
)
def test_mirror_takes_the_sources_case_and_final_punctuation(source: str, translation: str, expected: str):
    assert mirror(source, translation) == expected


def test_only_text_without_letters_has_nothing_to_translate():
    assert nothing_to_translate("🙂 👍") and nothing_to_translate("12:30 — 42%")
    assert not nothing_to_translate("") and not nothing_to_translate("  ")
    assert not nothing_to_translate("🙂 ok") and not nothing_to_translate("日本")


def test_case_and_final_punctuation_are_mirrored_unless_turned_off(running: RunningServer):
    lower = translated(running, "a man is sleeping on a bench")
    assert lower == lower.lower() and lower[-1] not in ".!?"
    upper = translated(running, "TWO DOGS ARE PLAYING IN THE SNOW!")
    assert upper == upper.upper() and upper.endswith("!")
    for source in ("a man is sleeping on a bench", "TWO DOGS ARE PLAYING IN THE SNOW!"):
        as_written = translated(running, source, mirror_formatting=False)
        assert translated(running, source) == mirror(source, as_written)
    status, _, body = http(running, "/translate", {"q": "x", "source": "en", "target": "de", "mirror_formatting": 2})
    assert status == 400 and "mirror_formatting=2 must be true or false" in body["error"]


def test_text_without_letters_comes_back_unless_turned_off(running: RunningServer):
    decoded = lambda: running.count("translate_input_tokens_total")
    before = decoded()
    q = ["🙂 👍", "A man.", "12:30 — 42%"]
    status, _, body = http(running, "/translate", {"q": q, "source": "en", "target": "de"})
    assert status == 200 and body["translatedText"][0::2] == ["🙂 👍", "12:30 — 42%"]
    one_sentence = decoded() - before
    form = {"q": "🚀 🌍 ✨", "source": "en", "target": "de", "pass_through": "false"}
    status, _, _ = http(running, "/translate", form=form)
    assert status == 200 and decoded() - before > one_sentence  # the model read it


def test_grpc_finishes_as_http_does_when_asked_and_gives_the_models_output_by_default(running: RunningServer):
    source = "two dogs are playing in the snow"
    assert running.translate([source], mirror_formatting=True).translations[0].text == translated(running, source)
    as_written = running.translate([source], mirror_formatting=False).translations[0].text
    assert as_written == translated(running, source, mirror_formatting=False)
    unset = running.stub.Translate(translate_pb2.TranslateRequest(texts=[source]), timeout=30).translations[0].text
    assert unset == as_written
    emoji = translate_pb2.TranslateRequest(texts=["🙂 👍"])
    assert running.stub.Translate(emoji, timeout=30).translations[0].text == "🙂 👍"


def test_text_passed_through_counts_against_the_requests_limits(running: RunningServer):
    """Text without letters comes back without the model, but not without the request's bounds: its characters
    count against --char-limit with the others'."""
    limit = running.server.config.char_limit
    q = ["A man is sleeping.", "🙂" * limit]
    status, _, body = http(running, "/translate", {"q": q, "source": "en", "target": "de"})
    assert status == 400 and "(char_limit)" in body["error"]
