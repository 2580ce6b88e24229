"""Continuous vs static batching on the running server."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from runtime.backend import OrtBackend
from runtime.offline import translate
from runtime.options import EngineSettings, RuntimeOptions
from server.errors import Overloaded
from server.operations.metrics import Metrics
from server.scheduling.fairness import PAUSE_AT_LEAST_SECONDS
from server.scheduling.jobs import Job, QueuedSentence
from server.scheduling.policies import STARVATION_SECONDS
from server.scheduling.scheduler import Scheduler
from testkit.sentences import own_sentences
from testkit.servers import RunningServer, server_config
from tests.server.fake_engine import FakeEngine, fake_job

LONG_TEXT = " ".join(
    f"A man is walking near the water number {i} and a dog follows him" for i in range(6)
)  # one long sentence


@pytest.fixture(
    scope="module",
    params=[("static", "compact"), ("continuous", "compact"), ("continuous", "buckets")],
    ids=["static", "continuous", "continuous-buckets"],
)
def scheduled(request, tiny_export: Path):
    """A server under each scheduler, and continuous batching on both batch layouts (runtime/slotted_rows.py)."""
    scheduler, layout = request.param
    server = RunningServer(
        server_config(
            tiny_export,
            scheduler=scheduler,
            batch_layout=layout,
            max_output_tokens=200,
            long_input_tokens=400,
            max_repeats=0,
            max_batch_delay_ms=10.0,
            memory_budget_mib=64,
            # Short work first by OS priority alone: with a share, a busy first lane leaves the long lane half its
            # core (tested apart), and the tiny model's short requests would no longer surely finish first.
            long_lane_share=0.0,
        )
    )
    yield scheduler, server
    server.close()


def decoded(server, sentence: str, beam: int = 0) -> str:
    """A sentence as the server's model wrote it (its case and final punctuation not mirrored): what the
    engine's offline translation of it is."""
    return server.translate([sentence], beam=beam, mirror_formatting=False).translations[0].text


@pytest.mark.parametrize("beam", [1, 3])
def test_translations_identical_under_both_schedulers(scheduled, tiny_export: Path, beam: int):
    _, server = scheduled
    sentences = own_sentences(15) + [LONG_TEXT]  # continuous: the long one decodes in its own lane
    with ThreadPoolExecutor(16) as pool:
        results = list(pool.map(lambda s: decoded(server, s, beam), sentences))
    reference = translate(
        OrtBackend(tiny_export, RuntimeOptions(settings=EngineSettings(provider="cpu"))),
        sentences,
        beam=beam,
        max_output_tokens=200,  # the fixture's server runs without the guard: long decodes
    )
    assert results == reference


def test_short_requests_finish_before_a_long_one(scheduled):
    """The short requests arrive once the long one decodes. Continuous: the long one's lane steps on only once
    they are answered, which they would not be if they waited for it. Static: they wait for the batch it is in."""
    name, server = scheduled
    lanes = server.server.scheduler.lanes
    longest = max(lane.size_class for lane in lanes)  # static: the one lane
    finished: list[int] = []  # the source tokens of each sentence a lane finishes, in the order they finish
    long_decoding, shorts_answered, held_up = threading.Event(), threading.Event(), threading.Event()
    for lane in lanes:

        def step(step=lane.batch.step, lane=lane):
            if lane.size_class == longest:
                long_decoding.set()
                if name == "continuous" and not held_up.is_set() and not shorts_answered.wait(30):
                    held_up.set()  # the short ones waited for this lane: it steps on unheld
            done = step()
            finished.extend(segment.source_tokens for segment, _ in done)
            return done

        lane.batch.step = step
    try:
        with ThreadPoolExecutor(9) as pool:
            long = pool.submit(server.translate, [LONG_TEXT])
            assert long_decoding.wait(30)
            for short in [pool.submit(server.translate, [sentence]) for sentence in own_sentences(8)]:
                short.result()
            shorts_answered.set()
            long.result()
    finally:
        for lane in lanes:
            del lane.batch.step
    long_tokens = max(finished)
    assert len(finished) == 9 and finished.count(long_tokens) == 1
    if name == "continuous":
        assert not held_up.is_set() and finished[-1] == long_tokens, "short requests must not wait for the long one"
    else:
        assert finished[0] == long_tokens, "static batching makes arrivals wait for the running batch"


@pytest.mark.parametrize("long_input", ["one sentence", "document"])
def test_long_and_short_requests_decode_in_separate_lanes(scheduled, long_input: str):
    """Lanes go by request size: a document of short sentences is long work too."""
    name, server = scheduled
    # Each size's lanes (continuous: a size's replicas count together).
    lanes: dict[int, list[str]] = {}
    for lane in server.server.scheduler.lanes:
        lanes.setdefault(lane.size_class, []).append(lane.name)
    assert len(lanes) == (2 if name == "continuous" else 1)
    peak = dict.fromkeys(lanes, 0)
    text = LONG_TEXT if long_input == "one sentence" else " ".join(own_sentences(40)[20:])
    for lane in server.server.scheduler.lanes:  # the rows of each step, by lane size (a small model's are few)

        def step(step=lane.batch.step, lane=lane):
            peak[lane.size_class] = max(peak[lane.size_class], lane.batch.rows)
            return step()

        lane.batch.step = step
    try:
        with ThreadPoolExecutor(9) as pool:
            futures = [pool.submit(server.translate, [text])]
            time.sleep(0.01)
            futures += [pool.submit(server.translate, [sentence]) for sentence in own_sentences(8)]
            for f in futures:
                f.result()
    finally:
        for lane in server.server.scheduler.lanes:
            del lane.batch.step
    assert all(rows > 0 for rows in peak.values()), peak
    deadline = time.monotonic() + 5  # gauges update right after the answers go out
    names = [lane for group in lanes.values() for lane in group]
    while any(server.metric("translate_lane_rows", {"lane": lane}) for lane in names) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert all(server.metric("translate_lane_rows", {"lane": lane}) == 0 for lane in names)


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


def _unstarted(config) -> tuple[FakeEngine, Scheduler]:
    engine = FakeEngine()
    return engine, Scheduler([engine], config, Metrics())  # not started: the test drives admission itself


@pytest.mark.parametrize(("policy", "replicas"), [("static", 1), ("continuous", 1), ("continuous", 2)])
def test_every_request_gets_its_own_answer_once(policy: str, replicas: int):
    """The scheduler over a fake engine (each source comes back reversed, one token per step): requests of
    several sizes and beams, arriving while others decode, each get exactly their own outputs, once."""
    engine = FakeEngine(step_seconds=0.001)
    config = server_config(
        Path("unused"), scheduler=policy, lanes=(16,), max_batch_size=8, warmup=False, lane_replicas=replicas
    )
    scheduler = Scheduler([engine], config, Metrics())
    scheduler.start()
    answers: dict[int, list] = {}
    done = threading.Semaphore(0)
    jobs = []
    try:
        for i in range(40):
            sentences = own_sentences(1 + i % 3) if i % 7 else [" ".join(own_sentences(3))]
            job = fake_job(
                engine,
                sentences,
                beam=1 + i % 4,
                on_segment=lambda s: answers.setdefault(s.job.id, []).append(s),
                on_done=lambda error: done.release() if error is None else None,
            )
            jobs.append(job)
            scheduler.submit(job)
            time.sleep(0.002 * (i % 2))
        for _ in jobs:
            assert done.acquire(timeout=30)
    finally:
        scheduler.stop(timeout=10)
    for job in jobs:
        segments = answers[job.id]
        assert sorted(s.spec.segment_index for s in segments) == list(range(len(job.specs)))  # each once
        for segment in segments:
            assert segment.result.tokens == list(reversed(segment.spec.ids))[: segment.max_length - 1]
    assert scheduler.memory.reserved_bytes == 0 and scheduler.running == 0
    if policy == "continuous":
        assert len(engine.joins) < len(jobs) * 2  # arrivals joined in groups, not one batch per request
    used = {segment.lane for job in jobs for segment in job.segments}
    assert len(used) == (1 if policy == "static" else 2 * replicas)  # every lane (static: one) took work


def test_a_requests_sentences_spread_over_the_replicas_of_its_size():
    config = server_config(Path("unused"), scheduler="continuous", lanes=(16,), lane_replicas=2)
    engine, scheduler = _unstarted(config)
    assert [lane.name for lane in scheduler.lanes] == ["1-16/0", "1-16/1", "17+/0", "17+/1"]
    short = [fake_job(engine, ["A dog runs."]) for _ in range(3)]
    for job in short:
        scheduler.submit(job)
    assert [job.segments[0].lane for job in short] == [0, 1, 0]
    document = fake_job(engine, own_sentences(5))  # long work: its sentences decode on both cores
    scheduler.submit(document)
    assert [s.lane for s in document.segments] == [2, 3, 2, 3, 2]
    assert [len(lane.waiting) for lane in scheduler.lanes] == [2, 1, 3, 2]


def test_a_replica_out_of_work_takes_the_sentences_its_replicas_have_no_room_for():
    """A replica whose own queue is empty takes, oldest first, the sentences waiting beyond another replica's
    room (max_batch_size), as many as its own room allows; what the other's batch has room for stays."""
    config = server_config(Path("unused"), scheduler="continuous", lanes=(16,), lane_replicas=2, max_batch_size=3)
    engine, scheduler = _unstarted(config)
    busy, idle = scheduler.lanes[:2]
    jobs = [fake_job(engine, ["A dog runs."]) for _ in range(5)]
    for job in jobs:
        job.segments = [QueuedSentence(job, job.specs[0], max_length=16, lane=busy.index)]
        busy.waiting.extend(job.segments)
    queued = [job.segments[0] for job in jobs]
    assert list(scheduler.admissions.stealable(idle)) == queued[3:]
    assert scheduler._admit(idle) == queued[3:] and all(s.lane == idle.index for s in queued[3:])
    assert list(busy.waiting) == queued[:3] and not any(scheduler.admissions.stealable(idle))
    assert scheduler._admit(busy) == queued[:3]


class _Answers:
    """A job's answers as the scheduler gives them: its segments, and the error that ended it (None: done)."""

    def __init__(self) -> None:
        self.segments: list = []
        self.done = threading.Event()
        self.error = None

    def job(self, engine, sentences: list[str]) -> Job:
        return fake_job(engine, sentences, on_segment=self.segments.append, on_done=self._done)

    def _done(self, error) -> None:
        self.error = error
        self.done.set()


def _started(engine: FakeEngine) -> Scheduler:
    config = server_config(Path("unused"), scheduler="continuous", lanes=(64,), warmup=False, lane_replicas=1)
    scheduler = Scheduler([engine], config, Metrics())
    scheduler.start()
    return scheduler


def _decoding(scheduler: Scheduler, engine: FakeEngine, answers: _Answers) -> None:
    """Submit a 13-word sentence (13 steps) and return once its batch has stepped."""
    scheduler.submit(answers.job(engine, ["A man is walking near the water and a dog follows him"]))
    while not engine.steps:
        time.sleep(0.001)


def test_lanes_sleep_until_woken_for_work_of_their_own():
    """Arrivals wake the lane they queue in, not every lane: an idle lane's thread stays asleep while another
    lane decodes."""
    engine = FakeEngine(step_seconds=0.001)
    config = server_config(Path("unused"), scheduler="continuous", lanes=(16,), warmup=False, lane_replicas=2)
    scheduler = Scheduler([engine], config, Metrics())
    scheduler.start()
    woken = dict.fromkeys(scheduler.lanes, 0)
    for lane in scheduler.lanes:
        notify = lane.wake.notify

        def counted(n: int = 1, lane=lane, notify=notify) -> None:
            woken[lane] += 1
            notify(n)

        lane.wake.notify = counted
    answers = [_Answers() for _ in range(4)]
    try:
        for answer in answers:
            scheduler.submit(answer.job(engine, ["A dog runs."]))
            assert answer.done.wait(10) and answer.error is None
    finally:
        scheduler.stop(timeout=10)
    short, long = scheduler.lanes[:2], scheduler.lanes[2:]
    assert sum(woken[lane] for lane in short) >= 4  # one wake-up per arrival ...
    assert all(woken[lane] == 1 for lane in long)  # ... and the long lanes only by the stop


def test_an_encoder_error_fails_the_batch_and_the_lane_goes_on():
    engine = FakeEngine(step_seconds=0.005)
    scheduler = _started(engine)
    running, arriving, later = _Answers(), _Answers(), _Answers()
    try:
        _decoding(scheduler, engine, running)
        engine.encode_error = MemoryError("no room")
        scheduler.submit(arriving.job(engine, ["A dog runs in the park."]))
        assert arriving.done.wait(10) and running.done.wait(10)
        engine.encode_error = None
        scheduler.submit(later.job(engine, ["A cat sleeps."]))
        assert later.done.wait(10)
    finally:
        scheduler.stop(timeout=10)
    # As an error in a step: every job of the lane's batch is answered with INTERNAL, the lane goes on.
    assert type(running.error).__name__ == type(arriving.error).__name__ == "InferenceFailed"
    assert later.error is None and later.segments[0].result.tokens == list(reversed(later.segments[0].spec.ids))
    assert scheduler.memory.reserved_bytes == 0 and scheduler.running == 0


def test_continuous_admission_by_lane():
    """Unit test of admission (no inference threads): requests go to a lane by their whole size, each lane
    admits its own arrivals first come first served, up to max_batch_size per lane."""
    config = server_config(Path("unused"), scheduler="continuous", lanes=(16,), max_batch_size=4, lane_replicas=1)
    engine, scheduler = _unstarted(config)
    short_lane, long_lane = scheduler.lanes
    document = fake_job(engine, own_sentences(20))  # 20 short sentences, well over 16 tokens in all: the long lane
    shorts = [fake_job(engine, ["A dog runs."]) for _ in range(6)]
    for j in [shorts[0], document, *shorts[1:]]:
        scheduler.submit(j)
    assert {s.lane for s in document.segments} == {1} and {j.segments[0].lane for j in shorts} == {0}
    assert list(long_lane.waiting) == document.segments
    assert scheduler._admit(short_lane) == [j.segments[0] for j in shorts[:4]]
    assert scheduler._admit(long_lane) == document.segments[:4]
    long_lane.load(engine)
    for segment in document.segments[:4]:
        long_lane.join(segment)  # as _encode_and_join does
    assert scheduler._admit(long_lane) == []  # the lane is full
    assert scheduler.waiting == 2 + 16
    admitted = [document.segments[:4], [j.segments[0] for j in shorts[:4]]]
    encoding = sum(scheduler.memory.encoding_bytes(engine.name, [s.source_tokens for s in a]) for a in admitted)
    assert scheduler.memory.reserved_bytes == sum(s.reserved_bytes for a in admitted for s in a) + encoding


def test_static_never_moves_work_between_lanes():
    config = server_config(Path("unused"), scheduler="static", lanes=(16,), max_batch_size=4, lane_replicas=2)
    engine, scheduler = _unstarted(config)
    (lane,) = scheduler.lanes  # one lane, one batch: nothing to take from
    assert list(scheduler.admissions.stealable(lane)) == []


def test_a_job_decoding_in_two_lanes_is_answered_once_or_cancelled_from_both():
    """A document whose sentences decode in both replicas of its lane size gets every sentence once; one
    cancelled meanwhile leaves both batches, and nothing stays reserved."""
    engine = FakeEngine(step_seconds=0.02)
    config = server_config(
        Path("unused"), scheduler="continuous", lanes=(16,), max_batch_size=4, warmup=False, lane_replicas=2
    )
    scheduler = Scheduler([engine], config, Metrics())
    scheduler.start()
    done, cancelled = _Answers(), _Answers()
    try:
        whole = done.job(engine, own_sentences(12))
        scheduler.submit(whole)
        assert done.done.wait(30)
        job = cancelled.job(engine, own_sentences(12))
        scheduler.submit(job)
        deadline = time.monotonic() + 10
        while not all(lane.running for lane in scheduler.lanes[2:]) and time.monotonic() < deadline:
            time.sleep(0.0005)
        scheduler.cancel(job)
        assert cancelled.done.wait(10)
        while scheduler.running and time.monotonic() < deadline:
            time.sleep(0.001)
    finally:
        scheduler.stop(timeout=10)
    assert done.error is None and sorted(s.spec.segment_index for s in done.segments) == list(range(12))
    assert {s.lane for s in whole.segments} == {2, 3}  # both replicas of the longer size decoded it
    for segment in done.segments:
        assert segment.result.tokens == list(reversed(segment.spec.ids))[: segment.max_length - 1]
    assert type(cancelled.error).__name__ == "Cancelled"
    assert scheduler.running == 0 and scheduler.waiting == 0 and scheduler.memory.reserved_bytes == 0
    assert all(lane.batch.rows == 0 for lane in scheduler.lanes)


def _paused_while(long_work: list[str], share: float) -> float:
    """Seconds the first lane paused while a short sentence decoded, with the long lane decoding
    ``long_work`` (one request) meanwhile."""
    engine = FakeEngine(step_seconds=0.005)
    config = server_config(
        Path("unused"), scheduler="continuous", lanes=(16,), warmup=False, long_lane_share=share, lane_replicas=1
    )
    scheduler = Scheduler([engine], config, Metrics())
    scheduler.start()
    long, short = _Answers(), _Answers()
    try:
        if long_work:
            scheduler.submit(long.job(engine, long_work))
            while not scheduler.lanes[1].running:
                time.sleep(0.001)
        scheduler.submit(short.job(engine, ["A man is walking near the water and a dog follows him"]))
        assert short.done.wait(10) and short.error is None
        assert not long_work or long.done.wait(10) and long.error is None
    finally:
        scheduler.stop(timeout=10)
    return scheduler.metrics.lane_paused.labels(engine.name, scheduler.lanes[0].name)._value.get()


def test_the_first_lane_pauses_only_while_a_longer_lane_decodes():
    """Longer lanes run at a lower OS priority: while one decodes (a long sentence, or a document of short
    ones), a busy first lane pauses for their share (--long-lane-share). Alone, or with no share set, it never
    pauses."""
    assert _paused_while([LONG_TEXT], share=0.5) >= PAUSE_AT_LEAST_SECONDS
    assert _paused_while(own_sentences(6), share=0.5) >= PAUSE_AT_LEAST_SECONDS
    assert _paused_while([], share=0.5) == 0.0
    assert _paused_while([LONG_TEXT], share=0.0) == 0.0


def test_a_segment_starving_for_room_stops_other_lanes():
    """A long segment that has waited STARVATION_SECONDS for memory that short requests keep taking makes
    every other lane wait until it fits."""
    config = server_config(Path("unused"), scheduler="continuous", lanes=(16,), lane_replicas=1)
    engine, scheduler = _unstarted(config)
    short_lane, long_lane = scheduler.lanes
    document = fake_job(engine, [" ".join(own_sentences(4))])  # one long sentence
    scheduler.submit(document)
    long = document.segments[0]
    scores = engine.memory.encoder_scores_bytes(1, long.source_tokens)
    held = scheduler.memory.budget_bytes - long.reserved_bytes - scores + 1
    scheduler.memory.reserved_bytes = held
    assert scheduler._admit(long_lane) == [] and scheduler.admissions.starving is None  # not waited long enough yet
    scheduler.submit(fake_job(engine, ["A dog runs."]))
    assert len(scheduler._admit(short_lane)) == 1  # shorts, which need less, may pass it meanwhile
    scheduler.memory.reserved_bytes = held
    long.enqueued_at -= STARVATION_SECONDS + 0.1
    assert scheduler._admit(long_lane) == [] and scheduler.admissions.starving is long
    late = fake_job(engine, ["A cat sleeps."])
    scheduler.submit(late)
    assert scheduler._admit(short_lane) == []  # even though it would fit
    scheduler.memory.reserved_bytes = 0  # the short rows finished
    assert scheduler._admit(long_lane) == document.segments and scheduler.admissions.starving is None
    assert scheduler._admit(short_lane) == late.segments


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="per-thread priorities are read from Linux's /proc")
def test_longer_lanes_run_at_lower_os_priority_on_the_models_one_thread_sessions(tiny_export: Path):
    """The long lane's inference thread is niced and the short lane's is not, so the kernel runs short work
    first; both run on the model's sessions, whose one thread is the caller's: ONNX Runtime starts no threads
    of its own, whose priority would be the main thread's."""
    server = RunningServer(
        server_config(tiny_export, scheduler="continuous", lanes=(16,), lane_niceness=7, intra_op_threads=2)
    )
    try:
        scheduler = server.server.scheduler
        assert len(scheduler.lanes) == 4 and len({lane.engine for lane in scheduler.lanes}) == 1
        own = os.getpriority(os.PRIO_PROCESS, 0)

        def nice(thread_id: int) -> int:
            return int(Path(f"/proc/self/task/{thread_id}/stat").read_text().rsplit(")", 1)[1].split()[16])

        assert [nice(lane.thread.native_id) - own for lane in scheduler.lanes] == [0, 0, 7, 7]
        niced = [int(t) for t in os.listdir("/proc/self/task") if nice(int(t)) == own + 7]
        assert sorted(niced) == sorted(lane.thread.native_id for lane in scheduler.lanes[2:])
        backend = scheduler.lanes[0].engine.backend
        assert [s.get_session_options().intra_op_num_threads for s in (backend.encoder, backend.decoder)] == [1, 1]
        assert server.translate([LONG_TEXT]).translations[0].text  # and the lanes work
    finally:
        server.close()


def test_a_busy_lane_takes_arrivals_in_batches():
    """Arrivals join at once while waiting costs less than the join would cost the running rows; a lone
    arrival to a busy lane waits until its wait reaches rows × the measured join duration."""
    config = server_config(Path("unused"), scheduler="continuous", lanes=(64,), lane_replicas=1)
    engine, scheduler = _unstarted(config)
    lane = scheduler.lanes[0]
    lane.load(engine)
    running = [fake_job(engine, [sentence]) for sentence in own_sentences(4)]
    for job in running:
        scheduler.submit(job)
    first = scheduler._admit(lane)
    assert first == [job.segments[0] for job in running]  # nothing running: no reason to wait
    scheduler._encode_and_join(lane, first)
    assert lane.batch.rows == 4 and lane.join_seconds > 0
    for _ in range(200):  # joins of 10 ms each, the running average settles on it: 4 rows held up 40 ms in all
        lane.joined(0.01)
    assert lane.join_seconds == pytest.approx(0.01, abs=1e-6)
    arrival = fake_job(engine, ["A dog runs."])
    scheduler.submit(arrival)
    assert scheduler._admit(lane) == []
    arrival.segments[0].enqueued_at -= 0.05
    assert scheduler._admit(lane) == arrival.segments
    crowd = [fake_job(engine, ["A cat sleeps."]) for _ in range(3)]
    for job in crowd:
        scheduler.submit(job)
        job.segments[0].enqueued_at -= 0.015  # 45 ms waited in all
    assert scheduler._admit(lane) == [job.segments[0] for job in crowd]


@pytest.mark.parametrize("gap_ms", [3.0, 0.0])
def test_an_idle_lane_stops_waiting_for_a_batch_once_arrivals_pause(gap_ms: float):
    """With nothing running a lane waits up to max_batch_delay_ms for more arrivals, but no longer than
    batch_gap_ms after the last one (0: the whole delay)."""
    config = server_config(
        Path("unused"),
        scheduler="continuous",
        lanes=(64,),
        lane_replicas=1,
        max_batch_delay_ms=300.0,
        batch_gap_ms=gap_ms,
    )
    engine, scheduler = _unstarted(config)
    lane = scheduler.lanes[0]
    lane.load(engine)
    first, late = fake_job(engine, ["A dog runs."]), fake_job(engine, ["A cat sleeps."])
    arrivals = [] if gap_ms else [late]  # no gap: one more arrives as the lane waits
    waits: list[float | None] = []
    wait = lane.wake.wait

    def waiting(timeout: float | None = None) -> bool:
        waits.append(timeout)
        if arrivals:  # submitted with the scheduler's lock let go, as the lane's wait lets it go
            scheduler.lock.release()
            try:
                scheduler.submit(arrivals.pop())
            finally:
                scheduler.lock.acquire()
        return wait(timeout)

    lane.wake.wait = waiting
    scheduler.submit(first)
    admitted = scheduler._admit(lane)
    if gap_ms:  # the arrivals paused: it waited at most the gap after the last one, never toward the delay
        assert [s.job for s in admitted] == [first] and all(timeout <= gap_ms / 1000 for timeout in waits)
    else:  # it waited for the delay, and took what arrived meanwhile
        assert [s.job for s in admitted] == [first, late] and all(timeout <= 0.3 for timeout in waits)


def test_scheduler_and_service_import_no_inference_runtime():
    """The engine boundary: the scheduler and the RPC service reach ONNX Runtime only through an engine."""
    modules = "server.scheduling.scheduler, server.doors.service"
    code = f"import sys, {modules}; print(sorted({{'onnxruntime', 'torch'}} & set(sys.modules)))"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert result.stdout.strip() == "[]"


def test_replicas_sharing_the_models_sessions_translate_as_one_lane_does(tiny_export: Path):
    sentences = own_sentences(12)
    server = RunningServer(
        server_config(tiny_export, lane_replicas=2, intra_op_threads=1, max_repeats=0, max_output_tokens=24)
    )
    try:
        with ThreadPoolExecutor(12) as pool:
            results = list(pool.map(lambda s: decoded(server, s), sentences))
        first, second = server.server.scheduler.lanes[:2]
        assert first.engine is second.engine
    finally:
        server.close()
    reference = translate(
        OrtBackend(tiny_export, RuntimeOptions(settings=EngineSettings(provider="cpu"))),
        sentences,
        max_output_tokens=24,
    )
    assert results == reference


def test_a_request_is_refused_while_its_lane_sizes_oldest_sentence_has_waited_over_the_bound():
    config = server_config(
        Path("unused"), scheduler="continuous", lanes=(16,), lane_replicas=1, max_queue_wait_s=(0.5, 0.0)
    )
    engine, scheduler = _unstarted(config)
    scheduler.submit(fake_job(engine, ["A dog runs."]))
    scheduler.submit(fake_job(engine, ["A cat sleeps."]))  # the oldest has waited under the bound
    scheduler.lanes[0].waiting[0].enqueued_at -= 0.6
    with pytest.raises(Overloaded, match=r"not keeping up \(its oldest sentence has waited 0\.6 s\); retry in"):
        scheduler.submit(fake_job(engine, ["A bird sings."]))
    assert scheduler.metrics.registry.get_sample_value("translate_rejected_total", {"reason": "queue_wait"}) == 1
    document = fake_job(engine, own_sentences(5))
    scheduler.submit(document)  # a longer lane's queue is its own, and 0 bounds nothing
    scheduler.lanes[1].waiting[0].enqueued_at -= 1000
    scheduler.submit(fake_job(engine, own_sentences(5)))
    for segment in list(scheduler.lanes[0].waiting):
        scheduler.lanes[0].unqueue(segment)
    scheduler.submit(fake_job(engine, ["A bird sings."]))  # nothing waits: taken whatever the bound
