"""The translation cache: an LRU bounded in bytes, and a server that answers repeated sentences from it
without the engine, byte-identical, over gRPC and HTTP."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from proto import translate_pb2
from runtime.search import Hypothesis
from server.cache import ENTRY_OVERHEAD_BYTES, HEADER, TranslationCache
from server.config import ServerConfig
from server.scheduling.jobs import DecodeOptions
from testkit.sentences import own_sentences
from testkit.servers import RunningServer, free_port, http, server_config
from tests.server.fake_engine import FakeEngine


def test_entries_are_kept_by_model_options_and_ids():
    engine, other = FakeEngine(), FakeEngine()
    other.version = "1"
    cache = TranslationCache(1 << 20)
    key = TranslationCache.key(engine, [5, 6, 7], DecodeOptions(beam=4, max_output_tokens=64))
    cache.put(key, Hypothesis([9, 8], -0.25, "repetition"))
    assert cache.get(key) == Hypothesis([9, 8], -0.25, "repetition")
    for different in (
        TranslationCache.key(other, [5, 6, 7], DecodeOptions(4, 64)),  # another version of the weights
        TranslationCache.key(engine, [5, 6, 7], DecodeOptions(1, 64)),  # another beam
        TranslationCache.key(engine, [5, 6, 7], DecodeOptions(4, 32)),  # another output limit
        TranslationCache.key(engine, [5, 6, 7], DecodeOptions(4, 64, alternatives=2)),  # alternatives wanted
        TranslationCache.key(engine, [5, 6], DecodeOptions(4, 64)),
    ):
        assert cache.get(different) is None


def test_an_entry_keeps_its_alternatives():
    cache = TranslationCache(1 << 20)
    key = TranslationCache.key(FakeEngine(), [5, 6, 7], DecodeOptions(4, 64, alternatives=2))
    others = (Hypothesis([9, 7], -0.5, "eos"), Hypothesis([], -1.5, "length"))
    cache.put(key, Hypothesis([9, 8], -0.25, "eos", others))
    assert cache.get(key) == Hypothesis([9, 8], -0.25, "eos", others)


def test_the_least_recently_used_entries_go_first_and_the_bound_holds():
    engine = FakeEngine()
    keys = [TranslationCache.key(engine, [i] * 10, DecodeOptions(1, 64)) for i in range(100)]
    size = len(keys[0]) + HEADER.size + 4 * 10 + ENTRY_OVERHEAD_BYTES
    output = Hypothesis(list(range(10)), -0.5, "eos")
    cache = TranslationCache(3 * size)
    for key in keys[:3]:
        cache.put(key, output)
    assert cache.get(keys[0]) is not None  # now the most recently used
    cache.put(keys[3], output)
    assert cache.get(keys[1]) is None and cache.get(keys[0]) is not None and len(cache) == 3
    for key in keys:
        cache.put(key, output)
        assert cache.bytes <= cache.max_bytes
    assert cache.bytes == 3 * size
    cache.put(TranslationCache.key(engine, [1] * 1000, DecodeOptions(1, 64)), output)  # larger than the bound
    assert cache.bytes == 3 * size and len(cache) == 3


def test_cache_mib_zero_turns_it_off():
    assert ServerConfig(cache_mib=0).cache_bytes == 0 and ServerConfig().cache_mib > 0
    with pytest.raises(ValueError, match="cache_mib=-1 must be 0"):
        ServerConfig(cache_mib=-1)


@pytest.fixture(scope="module")
def cached(tiny_export: Path) -> Iterator[RunningServer]:
    server = RunningServer(server_config(tiny_export, cache_mib=1, max_output_tokens=16, http_port=free_port()))
    yield server
    server.close()


def test_a_repeated_request_is_answered_from_the_cache_without_the_engine(cached: RunningServer, monkeypatch):
    texts = ["A man is walking. Two dogs are playing.", "A woman is sitting on a bench."]
    first = cached.translate(texts)
    model = first.model.split("@")[0]
    assert cached.metric("translate_cache_lookups_total", {"model": model, "result": "miss"}) == 3
    assert cached.metric("translate_cache_entries") == 3 and cached.metric("translate_cache_bytes") > 0

    def no_engine(job):
        raise AssertionError("a cached request reached the scheduler")

    monkeypatch.setattr(cached.server.scheduler, "submit", no_engine)
    again = cached.translate(texts)
    assert again == first  # byte-identical, token counts included
    assert cached.metric("translate_cache_lookups_total", {"model": model, "result": "hit"}) == 3
    stream = list(cached.stub.TranslateStream(translate_pb2.TranslateRequest(texts=texts)))
    assert [s.last_in_text for s in stream] == [False, True, True]
    status, _, body = http(cached, "/translate", {"q": texts, "source": "en", "target": "de"})
    assert status == 200 and body["translatedText"] == [t.text for t in first.translations]


def test_an_answer_without_alternatives_does_not_answer_a_request_for_them(cached: RunningServer):
    texts = own_sentences(9)[7:]
    plain = cached.translate(texts, beam=4)
    model = plain.model.split("@")[0]
    hits = lambda: cached.metric("translate_cache_lookups_total", {"model": model, "result": "hit"})  # noqa: E731
    before = hits()
    wanted = cached.translate(texts, beam=4, alternatives=3)
    assert hits() == before  # both sentences went to the engine again
    assert [t.text for t in wanted.translations] == [t.text for t in plain.translations]
    assert all(t.alternatives for t in wanted.translations) and not any(t.alternatives for t in plain.translations)
    assert cached.translate(texts, beam=4, alternatives=3) == wanted and hits() == before + 2  # now cached


def test_a_partly_cached_request_translates_only_the_rest(cached: RunningServer, monkeypatch):
    known, new = own_sentences(12)[10:]
    expected = cached.translate([known], mirror_formatting=False).translations[0].text
    submitted = []
    submit = cached.server.scheduler.submit
    monkeypatch.setattr(cached.server.scheduler, "submit", lambda job: (submitted.append(job), submit(job)))
    response = cached.translate([f"{new} {known}", known], mirror_formatting=False)
    assert [spec.source for job in submitted for spec in job.specs] == [new]
    assert response.translations[1].text == expected and response.translations[0].text.endswith(expected)


def test_the_cache_stays_within_its_bound_under_distinct_sentences(cached: RunningServer, monkeypatch):
    cache = cached.server.translations.cache
    monkeypatch.setattr(cache, "max_bytes", 20_000)  # a bound 240 short sentences overrun many times
    sentences = own_sentences(240)
    for start in range(0, len(sentences), 60):
        cached.translate(sentences[start : start + 60])
        assert 0 < cached.metric("translate_cache_bytes") <= 20_000
    assert cache.bytes == cached.metric("translate_cache_bytes") and len(cache) < 100
    hits = lambda: cached.metric("translate_cache_lookups_total", {"result": "hit"})  # noqa: E731
    before = hits()
    cached.translate(sentences[-3:])
    assert hits() == before + 3  # the newest are kept
