"""The LibreTranslate-compatible HTTP API against a running server: a real client's flow (libretranslatepy's
form posts), JSON with list q, /languages, every error status, language codes as LibreTranslate reads them,
CORS, /health and a /suggest that is off."""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from proto import translate_pb2
from server.doors.http_request import switch_of
from server.errors import InvalidRequest
from testkit.sentences import own_sentences
from testkit.servers import RunningServer, http, start_server


@pytest.fixture(scope="module")
def server(tiny_export: Path) -> Iterator[RunningServer]:
    running = start_server(tiny_export)
    yield running
    running.close()


def test_a_libretranslate_client_translates_as_grpc_does(server: RunningServer):
    libretranslatepy = pytest.importorskip("libretranslatepy")
    client = libretranslatepy.LibreTranslateAPI(f"http://127.0.0.1:{server.server.http_port}")
    languages = client.languages()
    assert languages == [{"code": "en", "name": "English", "targets": ["de"]}]
    sentences = own_sentences(3)
    expected = [t.text for t in server.translate(sentences).translations]
    assert [client.translate(s, "en", "de") for s in sentences] == expected  # form posts


def test_deep_translators_libretranslate_backend_translates_as_grpc_does(server: RunningServer):
    """deep-translator sends its fields in the query string of a POST (LibreTranslate reads both)."""
    deep_translator = pytest.importorskip("deep_translator")
    url = f"http://127.0.0.1:{server.server.http_port}/"
    client = deep_translator.LibreTranslator(source="en", target="de", api_key="unused", custom_url=url)
    sentences = own_sentences(3)
    expected = [t.text for t in server.translate(sentences).translations]
    assert [client.translate(s) for s in sentences] == expected


def test_json_with_a_list_keeps_order_and_empty_texts(server: RunningServer):
    sentences = own_sentences(4)
    expected = [t.text for t in server.translate(sentences).translations]
    ok = {"method": "HTTP /translate", "code": "OK"}
    before = server.count("translate_requests_total", ok)
    status, headers, body = http(
        server,
        "/translate",
        {"q": [sentences[0], "", *sentences[1:]], "source": "en", "target": "de", "format": "text", "api_key": ""},
    )
    assert status == 200 and body["translatedText"] == [expected[0], "", *expected[1:]]
    assert headers["X-Translation-Model"] == server.translate(["x"]).model
    status, _, body = http(server, "/translate", {"q": sentences[0], "source": "en", "target": "de"})
    assert (status, body["translatedText"]) == (200, expected[0])
    status, _, body = http(server, "/translate", form={"q": sentences[:2], "source": "en", "target": "de"})
    assert (status, body["translatedText"]) == (200, expected[:2])  # a form's repeated q is a list
    assert server.count("translate_requests_total", ok) - before == 3


@pytest.mark.parametrize(
    ("request_body", "message"),
    [
        ({"source": "en", "target": "de"}, "missing q parameter"),
        ({"q": "Hi.", "target": "de"}, "missing source parameter"),
        (
            {"q": "1, 2, 3", "source": "auto", "target": "de", "pass_through": False},
            "the language of the text cannot be detected",
        ),
        ({"q": "Hi.", "source": "zz", "target": "zz"}, "no model here matches source='zz' target='zz'"),
        (
            {"q": "Hi.", "source": "de", "target": "en"},
            "no model here matches source='de' target='en'; this server translates en→de (tiny-test)",
        ),
        ({"q": "Hi.", "source": "en", "target": "de", "format": "xml"}, "format='xml' is not supported"),
        ({"q": "<p>Hi.</b>", "source": "en", "target": "de", "format": "html"}, "</b> at line 1, column 7"),
        ({"q": [1, 2], "source": "en", "target": "de"}, "q must be a string or a list of strings"),
        ({"q": "Hi.", "source": "en", "target": "de", "api_key": 7}, "api_key must be a string"),
        ({"q": "Hi.", "source": "en", "target": "de", "alternatives": "two"}, "alternatives='two' must be a whole"),
        (
            {"q": "<b>" * 500 + "Hi." + "</b>" * 500, "source": "en", "target": "de", "format": "html"},
            "is nested deeper than 100 elements",
        ),
        (
            {"q": "Hi" + "<i></i>" * 2001, "source": "en", "target": "de", "format": "html"},
            "is element 2,001; a text may hold 2,000",
        ),
        (b"{not json", "the body is not valid JSON"),
        (b"\xa7\xff{}", "the body is not valid utf-8 (byte 0xa7 at offset 0)"),
        (b'{"q": "a \\ud800 b", "source": "en", "target": "de"}', "lone surrogate escape ('\\ud800')"),
        ({"q": "Hi. " * 25_001, "source": "en", "target": "de"}, "q: 100,004 characters, over the limit of 100,000"),
    ],
)
def test_bad_requests_are_400_with_a_message(server: RunningServer, request_body, message: str):
    invalid = {"method": "HTTP /translate", "code": "INVALID_ARGUMENT"}
    before = server.count("translate_requests_total", invalid)
    status, _, body = http(server, "/translate", request_body)
    assert status == 400 and message in body["error"], body
    assert server.count("translate_requests_total", invalid) - before == 1


def test_unknown_paths_methods_and_large_bodies_answer_json(server: RunningServer):
    assert http(server, "/nowhere")[0] == 404 and "error" in http(server, "/nowhere")[2]
    status, _, body = http(server, "/translate", method="GET")
    assert status == 405 and body == {"error": "Method Not Allowed"}
    status, _, body = http(server, "/translate", {"q": "x" * (5 << 20), "source": "en", "target": "de"})
    assert status == 413 and "error" in body


def test_overload_is_429_with_retry_after(tiny_export: Path):
    server = start_server(tiny_export, memory_budget_mib=1, default_beam_size=8, max_output_tokens=256)
    try:  # too small for a long text's segments in beam 8
        status, headers, body = http(
            server, "/translate", {"q": "walking " * 1000 + ".", "source": "en", "target": "de"}
        )
        assert status == 429 and "memory budget" in body["error"]
        assert int(headers["Retry-After"]) >= 1
    finally:
        server.close()


def test_deadline_is_504_and_draining_is_503(tiny_export: Path):
    server = start_server(tiny_export, http_timeout_s=1e-6)
    try:
        status, _, body = http(server, "/translate", {"q": "A man is walking.", "source": "en", "target": "de"})
        assert status == 504 and "deadline" in body["error"]
        assert http(server, "/health")[::2] == (200, {"status": "ok"})
        server.server.scheduler.stop_accepting()
        status, _, body = http(server, "/translate", {"q": "A man is walking.", "source": "en", "target": "de"})
        assert status == 503 and "shutting down" in body["error"]
        assert http(server, "/health")[::2] == (503, {"status": "draining"})  # load balancers look elsewhere
    finally:
        server.close()


def test_an_unexpected_failure_is_500_without_details(server: RunningServer, monkeypatch):
    async def broken(*args, **kwargs):
        raise RuntimeError("secret internals")

    monkeypatch.setattr(server.server.translations, "translate", broken)
    status, _, body = http(server, "/translate", {"q": "Hi.", "source": "en", "target": "de"})
    assert status == 500 and "secret" not in body["error"] and "the server logged the details" in body["error"]


def test_a_malformed_multipart_body_is_400(server: RunningServer):
    url = f"http://127.0.0.1:{server.server.http_port}/translate"
    headers = {"Content-Type": "multipart/form-data; boundary=xyz"}
    body = b'--xyz\r\nContent-Disposition: form-data; name="q"\r\n\r\nHi.\r\n--xyz'  # never closed
    request = urllib.request.Request(url, data=body, headers=headers, method="POST")
    with pytest.raises(urllib.error.HTTPError) as error:
        urllib.request.urlopen(request, timeout=30)
    assert error.value.code == 400, error.value.read()
    assert "form body cannot be read" in json.loads(error.value.read())["error"]


def test_the_page_runs_only_its_own_files(server: RunningServer):
    """The page at / (its browser test: test_page.py) and its files, under a policy that allows nothing else."""
    for path, kind in (("/", "text/html"), ("/page.js", "text/javascript"), ("/page.css", "text/css")):
        with urllib.request.urlopen(f"http://127.0.0.1:{server.server.http_port}{path}", timeout=10) as response:
            assert response.headers["Content-Type"].startswith(kind) and response.read()
            assert "default-src 'self'" in response.headers["Content-Security-Policy"]


def test_a_list_of_100_texts_is_answered(server: RunningServer):
    status, _, body = http(server, "/translate", {"q": own_sentences(100), "source": "en", "target": "de"})
    assert status == 200 and len(body["translatedText"]) == 100 and all(body["translatedText"])


def test_a_100000_character_text_translates_whole_keeping_its_layout(server: RunningServer):
    sentences = own_sentences(240)
    paragraphs, size, i = [], 0, 0
    while size < 100_000 - 200:
        lines = ["  ".join(sentences[(i + k) % 240] for k in range(3)) for _ in range(2)]
        paragraphs.append("\n".join(lines))
        size, i = size + len(paragraphs[-1]) + 2, i + 3
    text = "\n\n".join(paragraphs)
    assert len(text) <= 100_000
    status, _, body = http(server, "/translate", {"q": text, "source": "en", "target": "de"})
    assert status == 200, body
    out = body["translatedText"]
    assert out.count("\n\n") == text.count("\n\n") and out.count("\n") == text.count("\n")
    assert all(line.strip() for line in out.split("\n") if line)  # every line (of sentences) translated


def test_a_100000_character_html_document_translates_whole_keeping_its_paragraphs(server: RunningServer):
    """Every <p> comes back in order with its tags, as it translates alone, and each sentence is decoded once."""
    sentences = own_sentences(240)
    distinct = ["<p>" + " ".join(sentences[k : k + 3]) + "</p>" for k in range(0, 240, 3)]
    status, _, body = http(server, "/translate", {"q": distinct, "source": "en", "target": "de", "format": "html"})
    assert status == 200, body
    alone = body["translatedText"]
    paragraphs, size = [], 0
    while size + len(distinct[len(paragraphs) % 80]) + 1 <= 100_000:
        paragraphs.append(distinct[len(paragraphs) % 80])
        size += len(paragraphs[-1]) + 1
    document = "\n".join(paragraphs)
    assert 99_000 < len(document) <= 100_000
    decoded = server.count("translate_confidence_count")
    status, _, body = http(server, "/translate", {"q": document, "source": "en", "target": "de", "format": "html"})
    assert status == 200, body
    assert body["translatedText"] == "\n".join(alone[k % 80] for k in range(len(paragraphs)))
    assert server.count("translate_confidence_count") - decoded == 3 * len(paragraphs)


@pytest.mark.parametrize("text", ["a" * 100_000, "!?.,;:" * 16_666, ".!? " * 25_000], ids=["word", "punct", "stops"])
def test_hostile_long_texts_are_answered_in_bounded_time(server: RunningServer, text: str):
    """Answered, not stuck: http() gives up on an answer that takes over a minute (the work a text's length
    costs is counted in tests/server/test_linear_cost.py)."""
    status, _, body = http(server, "/translate", {"q": text, "source": "en", "target": "de"})
    assert status in (200, 400, 429) and (body.get("translatedText") or body.get("error")), (status, body)


def test_language_codes_are_read_in_any_case_over_http_and_grpc(server: RunningServer):
    sentence = own_sentences(1)[0]
    expected = server.translate([sentence]).translations[0].text
    status, _, body = http(server, "/translate", {"q": sentence, "source": "EN", "target": "De"})
    assert (status, body["translatedText"]) == (200, expected)
    status, _, body = http(server, "/translate", {"q": sentence, "source": "AUTO", "target": "DE"})
    assert (status, body["translatedText"], body["detectedLanguage"]["language"]) == (200, expected, "en")
    options = translate_pb2.TranslateOptions(mirror_formatting=True)  # finished as the HTTP API finishes by default
    request = translate_pb2.TranslateRequest(
        texts=[sentence], source_language="EN", target_language="DE", options=options
    )
    assert server.stub.Translate(request).translations[0].text == expected


def test_a_target_that_is_the_source_answers_the_texts_unchanged(server: RunningServer):
    """As LibreTranslate: en to en, or auto detecting the target's language, gives the texts back (no model)."""
    ok = {"method": "HTTP /translate", "code": "OK"}
    before = server.count("translate_requests_total", ok)
    texts = ["A man is walking.", "<b>Two</b> dogs.", ""]
    status, headers, body = http(server, "/translate", {"q": texts, "source": "en", "target": "EN", "alternatives": 2})
    assert status == 200 and "X-Translation-Model" not in headers
    assert body == {"translatedText": texts, "confidence": [0.0] * 3, "alternatives": [[], [], []]}
    status, _, body = http(server, "/translate", form={"q": "Hi.", "source": "auto", "target": "en"})
    assert (status, body["translatedText"], body["detectedLanguage"]["language"]) == (200, "Hi.", "en")
    assert server.count("translate_requests_total", ok) - before == 2
    status, _, body = http(server, "/translate", {"q": "<p>Hi.</b>", "source": "en", "target": "en", "format": "html"})
    assert status == 400 and "</b> at line 1, column 7" in body["error"]  # checked as a translation's text is


@pytest.mark.parametrize("q", ["🙂 👍", "12345", "?! ... -"], ids=["emoji", "digits", "punctuation"])
def test_auto_on_text_with_nothing_to_translate_answers_it_as_sent(server: RunningServer, q: str):
    """As LibreTranslate: no language to detect, no model to ask; the target's language reported with confidence 0.
    With pass_through off, detection has its say (and fails)."""
    decoded = server.count("translate_confidence_count")
    status, headers, body = http(server, "/translate", {"q": [q, ""], "source": "auto", "target": "de"})
    assert (status, body["translatedText"]) == (200, [q, ""]) and "X-Translation-Model" not in headers
    assert body["detectedLanguage"] == [{"confidence": 0.0, "language": "de"}] * 2
    assert server.count("translate_confidence_count") == decoded
    status, _, body = http(server, "/translate", {"q": q, "source": "auto", "target": "de", "pass_through": False})
    assert status == 400 and "cannot be detected" in body["error"]


def raw(server: RunningServer, path: str, method: str, headers: dict[str, str], body: bytes | None = None):
    """(status, headers) of one request with these headers (a browser's, e.g. Origin)."""
    url = f"http://127.0.0.1:{server.server.http_port}{path}"
    request = urllib.request.Request(url, data=body, headers=headers, method=method)
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, response.headers
    except urllib.error.HTTPError as error:
        return error.code, error.headers


def test_every_answer_allows_any_origin_and_preflights_are_answered(server: RunningServer):
    """LibreTranslate's CORS: a page on another origin can call every route, its preflight (OPTIONS) included."""
    page = {"Origin": "https://page.example"}
    preflight = {**page, "Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": "content-type"}
    for path in ("/translate", "/detect", "/languages", "/health", "/suggest", "/translate_file"):
        status, headers = raw(server, path, "OPTIONS", preflight)
        assert status == 204 and headers["Access-Control-Allow-Origin"] == "*", path
        assert "POST" in headers["Access-Control-Allow-Methods"]
        assert "content-type" in headers["Access-Control-Allow-Headers"].lower()
    body = json.dumps({"q": "Hi.", "source": "en", "target": "de"}).encode()
    status, headers = raw(server, "/translate", "POST", {**page, "Content-Type": "application/json"}, body)
    assert status == 200 and headers["Access-Control-Allow-Origin"] == "*"
    assert "X-Translation-Model" in headers["Access-Control-Expose-Headers"]
    for path, method in (("/translate", "GET"), ("/nowhere", "GET"), ("/nowhere", "OPTIONS")):
        status, headers = raw(server, path, method, page)  # errors too, so a page can read their message
        assert status in (404, 405) and headers["Access-Control-Allow-Origin"] == "*", (path, method)


def test_cors_origins_names_the_pages_allowed(tiny_export: Path):
    server = start_server(tiny_export, cors_origins=("https://a.example", "https://b.example"))
    try:
        status, headers = raw(server, "/languages", "GET", {"Origin": "https://b.example"})
        assert (status, headers["Access-Control-Allow-Origin"], headers["Vary"]) == (200, "https://b.example", "Origin")
        status, headers = raw(server, "/translate", "OPTIONS", {"Origin": "https://evil.example"})
        assert status == 204 and "Access-Control-Allow-Origin" not in headers
        status, headers = raw(server, "/languages", "GET", {"Origin": "https://evil.example"})
        assert status == 200 and "Access-Control-Allow-Origin" not in headers
    finally:
        server.close()


def test_health_is_libretranslates_ok_while_serving(server: RunningServer):
    ok = {"method": "HTTP /health", "code": "OK"}
    before = server.count("translate_requests_total", ok)
    assert http(server, "/health")[::2] == (200, {"status": "ok"})
    assert http(server, "/health", method="POST")[0] == 405  # as LibreTranslate's
    assert server.count("translate_requests_total", ok) - before == 1


def test_suggestions_are_off_by_default_with_libretranslates_403(server: RunningServer):
    suggestion = {"q": "Hello", "s": "Hallo", "source": "en", "target": "de"}
    status, _, body = http(server, "/suggest", suggestion)
    assert (status, body) == (403, {"error": "Suggestions are disabled on this server."})
    assert http(server, "/frontend/settings")[2]["suggestions"] is False


def test_a_switch_is_true_or_false_never_a_number():
    """JSON's 1 and 0 are numbers, not switches (a form's "1" and "0" are its way of writing them)."""
    assert [switch_of({"s": v}, "s") for v in (None, "", True, False, "true", "0", " FALSE ")] == [
        True,
        True,
        True,
        False,
        True,
        False,
        False,
    ]
    for value in (1, 0, 1.0, "yes", [True]):
        with pytest.raises(InvalidRequest, match=r"s=.* must be true or false"):
            switch_of({"s": value}, "s")
