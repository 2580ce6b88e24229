"""Continuous vs static batching on the running server."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from export.runtime import OrtModel, RuntimeOptions
from server.engine import Engine
from server.metrics import Metrics
from server.scheduler import LONG_ADMISSIONS, Job, Scheduler
from server.text import SegmentSpec
from tests.conftest import own_sentences
from tests.server.conftest import RunningServer, server_config

LONG_TEXT = " ".join(
    f"A man is walking near the water number {i} and a dog follows him" for i in range(6)
)  # one long sentence


@pytest.fixture(scope="module", params=["static", "continuous"])
def scheduled(request, tiny_export: Path):
    server = RunningServer(server_config(tiny_export, scheduler=request.param, max_output_tokens=200, long_input_tokens=400,
                                         max_batch_delay_ms=10.0, memory_budget_mib=64))  # fmt: skip
    yield request.param, server
    server.close()


@pytest.mark.parametrize("beam", [1, 3])
def test_translations_identical_under_both_schedulers(scheduled, tiny_export: Path, beam: int):
    _, server = scheduled
    sentences = own_sentences(15) + [LONG_TEXT]  # continuous: the long one decodes in its own lane
    with ThreadPoolExecutor(16) as pool:
        results = list(pool.map(lambda s: server.translate([s], beam=beam).translations[0].text, sentences))
    reference = OrtModel(tiny_export, RuntimeOptions(provider="cpu")).translate(
        sentences, beam=beam, max_output_tokens=200
    )
    assert results == reference


def test_short_requests_finish_before_a_long_one(scheduled):
    name, server = scheduled
    finished: dict[str, float] = {}

    def timed(label: str, text: str) -> None:
        server.translate([text])
        finished[label] = time.monotonic()

    with ThreadPoolExecutor(9) as pool:
        pool.submit(timed, "long", LONG_TEXT)
        time.sleep(0.05)  # the long one is decoding when the short ones arrive
        for i, sentence in enumerate(own_sentences(8)):
            pool.submit(timed, f"short{i}", sentence)
    shorts = [t for label, t in finished.items() if label != "long"]
    if name == "continuous":
        assert max(shorts) < finished["long"], "short requests must not wait for the long one"
    else:
        assert min(shorts) > finished["long"], "static batching makes arrivals wait for the running batch"


@pytest.mark.parametrize("long_input", ["one sentence", "document"])
def test_long_and_short_requests_decode_in_separate_lanes(scheduled, long_input: str):
    """Lanes go by request size: a document of short sentences is long work too."""
    name, server = scheduled
    lanes = {"1-64", "65+"} if name == "continuous" else {"1+"}
    peak = dict.fromkeys(lanes, 0.0)
    text = LONG_TEXT if long_input == "one sentence" else " ".join(own_sentences(40)[20:])
    done = threading.Event()

    def sample() -> None:  # from before the first request: a small model finishes a document in milliseconds
        while not done.is_set():
            for lane in lanes:
                peak[lane] = max(peak[lane], server.metric("translate_lane_rows", {"lane": lane}) or 0.0)
            time.sleep(0.001)

    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        with ThreadPoolExecutor(9) as pool:
            futures = [pool.submit(server.translate, [text])]
            time.sleep(0.01)
            futures += [pool.submit(server.translate, [sentence]) for sentence in own_sentences(8)]
            for f in futures:
                f.result()
    finally:
        done.set()
        sampler.join()
    assert all(rows > 0 for rows in peak.values()), peak
    deadline = time.monotonic() + 5  # gauges update right after the answers go out
    while any(server.metric("translate_lane_rows", {"lane": lane}) for lane in lanes) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert all(server.metric("translate_lane_rows", {"lane": lane}) == 0 for lane in lanes)


def test_cache_never_exceeds_the_budget(scheduled):
    _, server = scheduled
    budget = server.metric("translate_memory_budget_bytes")
    peak = 0.0
    with ThreadPoolExecutor(24) as pool:
        futures = [pool.submit(server.translate, [LONG_TEXT], beam=4) for _ in range(24)]
        while not all(f.done() for f in futures):
            used = server.metric("translate_kv_cache_bytes") + server.metric("translate_cross_attention_cache_bytes")
            peak = max(peak, used)
            time.sleep(0.002)
        for f in futures:
            f.result()
    assert 0 < peak <= budget


def test_continuous_admission_by_lane(tiny_export: Path):
    """Unit test of one admission round (no inference thread): short requests pass a document that waits,
    a document enters its lane at most LONG_ADMISSIONS sentences per long-lane turn, first come first
    served within a lane."""
    config = server_config(tiny_export, scheduler="continuous", lanes="16", lane_step_every=4, max_batch_size=64)
    engine = Engine(config)
    scheduler = Scheduler(engine, config, Metrics())

    def job(sentences: list[str]) -> Job:
        ids = engine.tokenize(sentences)
        specs = [SegmentSpec(0, i, s, row) for i, (s, row) in enumerate(zip(sentences, ids, strict=True))]
        return Job(specs, beam=1, max_output_tokens=16, on_segment=lambda s: None, on_done=lambda e: None)

    document = job(own_sentences(20))  # 20 short sentences, well over 16 tokens in all: the long lane
    shorts = [job(["A dog runs."]) for _ in range(3)]
    for j in [document, *shorts]:
        scheduler.submit(j)
    assert {s.lane for s in document.segments} == {1} and shorts[0].segments[0].lane == 0
    # The short lane is empty: the long lane steps this iteration and takes its first sentences.
    admitted = scheduler._admit()
    assert [s for s in admitted if s.job is document] == document.segments[:LONG_ADMISSIONS]
    assert [s.job for s in admitted if s.job is not document] == shorts
    scheduler._encode_and_join(admitted)
    # With short rows running, the long lane takes arrivals only on the iterations it steps.
    late_short = job(["A cat sleeps."])
    scheduler.submit(late_short)
    scheduler.iteration = 1  # the next iteration (2) is not a long-lane turn
    assert [s.job for s in scheduler._admit()] == [late_short]
    scheduler.iteration = 3  # the next iteration (4) is one
    assert scheduler._admit() == document.segments[LONG_ADMISSIONS : 2 * LONG_ADMISSIONS]
