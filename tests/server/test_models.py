"""Several models in one server: choosing a model (by languages, name or default), ListModels, both front
ends, metrics per model, and the scheduler's lanes per model under one memory budget."""

from __future__ import annotations

import time
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import pytest

from proto import translate_pb2
from runtime import offline
from runtime.backend import OrtBackend
from runtime.options import EngineSettings, RuntimeOptions
from runtime.stops import RepetitionGuard
from server.errors import InvalidRequest
from server.models import Models
from server.operations.metrics import Metrics
from server.scheduling.jobs import DecodeOptions, Job
from server.scheduling.scheduler import Scheduler
from server.sentences import SplitSentence
from testkit.sentences import own_sentences
from testkit.servers import RunningServer, free_port, http, server_config
from tests.server.fake_engine import FakeEngine

LIMIT = 16


def fake(name: str, source: str, target: str, step_seconds: float = 0.0) -> FakeEngine:
    engine = FakeEngine(step_seconds)
    engine.name, engine.source_language, engine.target_language = name, source, target
    return engine


# --- choosing a model ---------------------------------------------------------------------------------


def test_a_request_chooses_by_languages_or_name_and_gets_the_default_otherwise():
    en_de, de_en, en_fr = fake("en-de", "en", "de"), fake("de-en", "de", "en"), fake("en-fr", "en", "fr")
    models = Models([en_de, de_en, en_fr])
    assert models.resolve() is en_de  # nothing named: the first model
    assert models.resolve(source="de", target="en") is de_en
    assert models.resolve(source="de") is de_en and models.resolve(target="fr") is en_fr
    assert models.resolve(model="en-fr") is en_fr and models.resolve(model="en-fr@0") is en_fr
    with pytest.raises(
        InvalidRequest,
        match=r"no model here matches source='fr' target='en'; this server "
        r"translates en→de \(en-de\), de→en \(de-en\), en→fr \(en-fr\)",
    ):
        models.resolve(source="fr", target="en")
    with pytest.raises(InvalidRequest, match=r"no model here matches model='en-de@1'"):
        models.resolve(model="en-de@1")  # another version than the one served
    with pytest.raises(InvalidRequest, match=r"source='en' matches several models \(en-de, en-fr\); give both"):
        models.resolve(source="en")


def test_two_models_of_one_name_are_refused():
    with pytest.raises(ValueError, match="several model folders are named en-de"):
        Models([fake("en-de", "en", "de"), fake("en-de", "de", "en")])


# --- a running two-model server -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def two(tiny_export: Path, tiny_reverse_export: Path) -> Iterator[RunningServer]:
    config = server_config(
        tiny_export,
        max_output_tokens=LIMIT,
        max_batch_delay_ms=5.0,
        http_port=free_port(),
        lanes=(16,),
        lane_replicas=2,
    )
    server = RunningServer(config.__class__(**{**vars(config), "model": (tiny_export, tiny_reverse_export)}))
    yield server
    server.close()


def reference(folder: Path, texts: list[str], beam: int = 1) -> list[str]:
    runtime = OrtBackend(folder, RuntimeOptions(settings=EngineSettings(provider="cpu")))
    return offline.translate(runtime, texts, beam, max_output_tokens=LIMIT, stop_rules=(RepetitionGuard(),))


def translate(server: RunningServer, texts: list[str], **choice) -> translate_pb2.TranslateResponse:
    """As the model wrote it (not mirrored: server/documents/formatting.py), to compare with the reference decoder."""
    options = translate_pb2.TranslateOptions(mirror_formatting=False)
    return server.stub.Translate(translate_pb2.TranslateRequest(texts=texts, options=options, **choice), timeout=60)


def test_each_pair_is_translated_by_its_own_model(two: RunningServer, tiny_export: Path, tiny_reverse_export: Path):
    sentences = own_sentences(6)
    forward, backward = reference(tiny_export, sentences), reference(tiny_reverse_export, sentences)
    assert forward != backward  # the two models differ, so the answers tell which one translated
    by_pair = translate(two, sentences, source_language="de", target_language="en")
    assert [t.text for t in by_pair.translations] == backward and by_pair.model.startswith("tiny-de-en@")
    by_name = translate(two, sentences, model="tiny-test")
    assert [t.text for t in by_name.translations] == forward and by_name.model.startswith("tiny-test@")
    default = translate(two, sentences)  # a one-model client's request: the first model answers
    assert [t.text for t in default.translations] == forward
    stream = list(two.stub.TranslateStream(translate_pb2.TranslateRequest(texts=sentences[:2], source_language="de")))
    assert [s.translation for s in stream] == backward[:2] and {s.model for s in stream} == {by_pair.model}


def test_an_unknown_pair_is_invalid_argument_naming_the_pairs(two: RunningServer):
    unmatched = {"code": "INVALID_ARGUMENT", "model": ""}
    before = two.count("translate_requests_total", unmatched)
    with pytest.raises(grpc.RpcError) as error:
        translate(two, ["Hallo."], source_language="fr", target_language="en")
    assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "this server translates en→de (tiny-test), de→en (tiny-de-en)" in error.value.details()
    assert two.count("translate_requests_total", unmatched) - before == 1


def test_list_models_and_model_info_describe_every_model(two: RunningServer):
    listed = two.stub.ListModels(translate_pb2.ListModelsRequest()).models
    assert [(m.name, m.source_language, m.target_language) for m in listed] == [
        ("tiny-test", "en", "de"),
        ("tiny-de-en", "de", "en"),
    ]
    assert all(m.variant == "fp32" and m.provider == "cpu" and m.limits.max_output_tokens == LIMIT for m in listed)
    assert two.stub.GetModelInfo(translate_pb2.GetModelInfoRequest()).name == "tiny-test"
    chosen = two.stub.GetModelInfo(translate_pb2.GetModelInfoRequest(source_language="de"))
    assert chosen == listed[1]


def test_the_http_api_serves_both_pairs(two: RunningServer):
    status, _, languages = http(two, "/languages")
    assert status == 200 and languages == [
        {"code": "en", "name": "English", "targets": ["de"]},
        {"code": "de", "name": "German", "targets": ["en"]},
    ]
    sentences = own_sentences(3)
    for source, target in (("en", "de"), ("de", "en")):
        grpc_texts = [
            t.text for t in translate(two, sentences, source_language=source, target_language=target).translations
        ]
        fields = {"q": sentences, "source": source, "target": target, "mirror_formatting": False}
        status, headers, body = http(two, "/translate", fields)
        assert status == 200 and body["translatedText"] == grpc_texts
        assert headers["X-Translation-Model"].startswith("tiny-test@" if source == "en" else "tiny-de-en@")
    status, _, body = http(two, "/translate", {"q": "Hallo.", "source": "de", "target": "fr"})
    assert status == 400 and "this server translates en→de (tiny-test), de→en (tiny-de-en)" in body["error"]


def test_metrics_carry_the_model(two: RunningServer):
    names = ("tiny-test", "tiny-de-en")
    counters = ("translate_input_tokens_total", "translate_decoder_step_duration_seconds_count")
    ok = {name: {"method": "Translate", "code": "OK", "model": name} for name in names}
    requests = {name: two.count("translate_requests_total", ok[name]) for name in names}
    before = {(counter, name): two.count(counter, {"model": name}) for counter in counters for name in names}
    for language in ("de", "en"):
        translate(two, own_sentences(2), source_language=language)
        translate(two, [" ".join(own_sentences(3))], source_language=language)  # over 16 tokens: the 17+ lane
    for name in names:
        assert two.count("translate_requests_total", ok[name]) - requests[name] == 2
        assert all(two.count(counter, {"model": name}) > before[counter, name] for counter in counters), name
        assert two.metric("translate_model_info", {"model": name, "variant": "fp32"}) == 1
    body = urllib.request.urlopen(f"http://127.0.0.1:{two.server.metrics_port}/metrics", timeout=5).read().decode()
    for lane in ("1-16/0", "1-16/1", "17+/0", "17+/1"):  # each replica of each size, of the second model too
        assert f'translate_lane_rows{{lane="{lane}",model="tiny-de-en"}}' in body


def test_concurrent_traffic_to_both_models_is_answered_by_each(two: RunningServer, tiny_reverse_export: Path):
    sentences = own_sentences(8)
    backward = reference(tiny_reverse_export, sentences)
    forward = [t.text for t in translate(two, sentences).translations]
    with ThreadPoolExecutor(8) as pool:
        futures = [
            pool.submit(translate, two, [sentence], source_language=pair[0], target_language=pair[1])
            for sentence in sentences
            for pair in (("en", "de"), ("de", "en"))
        ]
        answers = [f.result().translations[0].text for f in futures]
    assert answers[0::2] == forward and answers[1::2] == backward


# --- the scheduler: lanes per model, one budget ---------------------------------------------------------


def _job(engine: FakeEngine, words: int, answers: list, model: str) -> Job:
    text = " ".join(["word"] * words)
    spec = SplitSentence(0, 0, text, engine.tokenize([text])[0])
    on_segment = lambda s: answers.append((model, s.result.tokens))  # noqa: E731
    return Job([spec], DecodeOptions(1, 512), on_segment=on_segment, on_done=lambda e: None, model=model)


def test_each_model_has_its_own_lanes_and_neither_waits_for_the_other():
    """A long decode on one model does not hold up a short request to the other: each model's lanes run on
    their own threads (the fake engines take 2 ms a step)."""
    a, b = fake("a", "en", "de", step_seconds=0.002), fake("b", "de", "en", step_seconds=0.002)
    config = server_config(Path("unused"), lanes=(16,), max_output_tokens=512, lane_replicas=1)
    scheduler = Scheduler([a, b], config, Metrics())
    assert [(lane.model, lane.name) for lane in scheduler.lanes] == [
        ("a", "1-16"),
        ("a", "17+"),
        ("b", "1-16"),
        ("b", "17+"),
    ]
    scheduler.start()
    try:
        answers: list = []
        scheduler.submit(_job(a, 120, answers, "a"))  # about 120 steps, 0.25 s
        time.sleep(0.02)
        scheduler.submit(_job(b, 3, answers, "b"))
        deadline = time.monotonic() + 10
        while len(answers) < 2 and time.monotonic() < deadline:
            time.sleep(0.005)
        assert [model for model, _ in answers] == ["b", "a"]
        assert answers[0][1] == list(reversed(b.tokenize(["word word word"])[0]))
        assert b.steps and a.steps  # each model's batches ran on its own engine
    finally:
        scheduler.stop(5)


def test_the_models_share_one_memory_budget():
    """What one model holds counts against the other's admissions."""
    a, b = fake("a", "en", "de"), fake("b", "de", "en")
    config = server_config(Path("unused"), lanes=(), max_output_tokens=512, memory_budget_mib=1, lane_replicas=1)
    scheduler = Scheduler([a, b], config, Metrics())  # not started: the test admits by hand
    lane_a, lane_b = scheduler.lanes
    for lane, engine in ((lane_a, a), (lane_b, b)):
        lane.load(engine)
    scheduler.submit(_job(a, 200, [], "a"))
    first = scheduler._admit(lane_a)
    scheduler._encode_and_join(lane_a, first)
    assert first and scheduler.memory.reserved_bytes == first[0].reserved_bytes
    scheduler.submit(_job(b, 200, [], "b"))  # fits the budget alone, not beside model a's segment
    assert first[0].reserved_bytes + lane_b.waiting[0].reserved_bytes > scheduler.memory.budget_bytes
    assert scheduler._admit(lane_b) == []
    scheduler._leave(first[0])
    assert len(scheduler._admit(lane_b)) == 1
