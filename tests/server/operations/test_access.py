"""Request IDs and access logs: a caller's x-request-id (or a generated one) comes back in trailing
metadata and HTTP headers and names the request's one access-log line; texts stay out unless asked."""

from __future__ import annotations

import json
import logging
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from proto import translate_pb2
from server.operations.access import FRESH_IDS, BatchedLines, request_id
from testkit.sentences import own_sentences
from testkit.servers import RunningServer, free_port, http, server_config
from tests.conftest import ROOT


@pytest.fixture(scope="module")
def server(tiny_export: Path) -> Iterator[RunningServer]:
    running = RunningServer(server_config(tiny_export, max_output_tokens=16, http_port=free_port()))
    yield running
    running.close()


def access_lines(caplog) -> list[dict]:
    return [json.loads(r.getMessage()) for r in caplog.records if r.name == "server.operations.access"]


def test_a_callers_request_id_names_its_answer_and_its_log_line(server: RunningServer, caplog):
    caplog.set_level(logging.INFO, logger="server.operations.access")
    texts = own_sentences(2)
    response, call = server.stub.Translate.with_call(
        translate_pb2.TranslateRequest(texts=texts), metadata=(("x-request-id", "order-42/a"),)
    )
    assert dict(call.trailing_metadata())["x-request-id"] == "order-42/a"
    (line,) = [entry for entry in access_lines(caplog) if entry["request_id"] == "order-42/a"]
    assert line["method"] == "Translate" and line["status"] == "OK" and line["model"] == response.model
    assert line["texts"] == 2 and line["input_tokens"] == sum(t.input_tokens for t in response.translations)
    assert line["output_tokens"] == sum(t.output_tokens for t in response.translations)
    assert 0 <= line["queue_wait_s"] <= line["total_s"]
    assert "text" not in line and not any(texts[0] in r.getMessage() for r in caplog.records)


def test_errors_get_an_id_and_a_line_too(server: RunningServer, caplog):
    caplog.set_level(logging.INFO, logger="server.operations.access")
    with pytest.raises(grpc.RpcError) as error:
        server.stub.Translate(translate_pb2.TranslateRequest(texts=["Hi."], source_language="fr"))
    generated = dict(error.value.trailing_metadata())["x-request-id"]
    assert re.fullmatch("[0-9a-f]{32}", generated), generated
    (line,) = [entry for entry in access_lines(caplog) if entry["request_id"] == generated]
    assert line["status"] == "INVALID_ARGUMENT" and line["model"] == ""


def test_http_requests_carry_their_id(server: RunningServer, caplog):
    caplog.set_level(logging.INFO, logger="server.operations.access")
    status, headers, _ = http(server, "/translate", {"q": "A man is walking.", "source": "en", "target": "de"})
    assert status == 200 and len(headers["X-Request-ID"]) == 32
    (line,) = [entry for entry in access_lines(caplog) if entry["request_id"] == headers["X-Request-ID"]]
    assert line["method"] == "HTTP /translate" and line["status"] == "OK" and line["texts"] == 1
    status, headers, _ = http(server, "/nowhere")
    assert status == 404 and headers["X-Request-ID"]


def test_texts_are_logged_only_when_asked(tiny_export: Path, caplog):
    caplog.set_level(logging.INFO, logger="server.operations.access")
    running = RunningServer(server_config(tiny_export, max_output_tokens=8, access_log_texts=True))
    try:
        running.translate(["A dog is running."])
    finally:
        running.close()
    assert [line["text"] for line in access_lines(caplog)] == [["A dog is running."]]


@pytest.mark.parametrize("given", [None, "", "has space", "x" * 129, "ünïcode"])
def test_unusable_request_ids_are_replaced(given):
    assert len(request_id(given)) == 32 and request_id(given) != given


def test_new_request_ids_are_hex_and_distinct_past_each_draw_from_the_system():
    made = [request_id(None) for _ in range(3 * FRESH_IDS + 1)]
    assert all(re.fullmatch(r"[0-9a-f]{32}", made_id) for made_id in made)
    assert len(set(made)) == len(made)


def test_the_servers_log_records_skip_what_its_lines_never_print():
    """``python -m server``'s logging (its own process: the settings are the process's): a line reads as
    LOG_FORMAT says, from a record without the caller's frame, thread or process name."""
    script = """
import logging
from server.__main__ import configure_logging
configure_logging()
records = []
handler = logging.Handler()
handler.emit = records.append
logging.getLogger("probe").addHandler(handler)
logging.getLogger("probe").warning("written")
(record,) = records
print(record.pathname, record.threadName, record.processName, logging.Formatter().format(record), sep="|")
"""
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "(unknown file)|None|None|written"
    assert re.fullmatch(r"\S+ \S+ WARNING probe: written", done.stderr.strip())


def test_sampling_logs_a_share_of_successes_and_every_error(caplog):
    from server.operations.access import AccessLog, Exchange
    from server.operations.metrics import Metrics

    caplog.set_level(logging.INFO, logger="server.operations.access")
    access = AccessLog(Metrics(), sample=0.25)
    for i in range(400):
        access.finish(Exchange("Translate", f"ok-{i}"), "OK")
    for i in range(20):
        access.finish(Exchange("Translate", f"bad-{i}"), "INVALID_ARGUMENT")
    lines = access_lines(caplog)
    assert 50 < sum(line["status"] == "OK" for line in lines) < 150
    assert sum(line["status"] == "INVALID_ARGUMENT" for line in lines) == 20
    counted = access.metrics.registry.get_sample_value(
        "translate_requests_total", {"method": "Translate", "code": "OK", "model": ""}
    )
    assert counted == 400  # every request is counted


def test_batched_lines_are_written_in_order_within_their_wait_and_at_once_for_a_warning(tmp_path: Path):
    written: list[str] = []

    class Stream:
        def write(self, text: str) -> None:
            written.append(text)

        def flush(self) -> None:
            pass

    handler = BatchedLines(Stream(), seconds=0.2, lines=3)
    handler.setFormatter(logging.Formatter("%(levelname)s %(message)s"))
    logger = logging.getLogger("test.batched")
    logger.addHandler(handler)
    logger.propagate, logger.level = False, logging.INFO
    try:
        logger.info("one")
        logger.info("two")
        assert written == []  # waiting for more, or for its time
        logger.info("three")  # a full batch goes out at once
        assert written == ["INFO one\nINFO two\nINFO three\n"]
        logger.info("four")
        logger.warning("five")  # a warning goes out at once, after what waited
        assert written[1:] == ["INFO four\nWARNING five\n"]
        logger.info("six")
        deadline = time.monotonic() + 5
        while len(written) < 3 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert written[2:] == ["INFO six\n"]  # the writer thread, within its wait
        logger.info("seven")
    finally:
        logger.removeHandler(handler)
        handler.close()
    assert written[3:] == ["INFO seven\n"]  # closing writes what is left
