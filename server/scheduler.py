"""Admission, batching and the decode loop, on inference threads: the glue of its parts, the memory
budget (server/budget.py), the lanes and their threads (server/lanes.py) and the admission policies
(server/policies.py), each testable alone.

Requests become jobs of segments (sentences). Segments wait in a bounded
queue; inference threads admit them into their engine's running batches:

- ``continuous``: requests go to a lane by their size (``lane_bounds``: a long
  sentence, or a document of many short ones, is long work). Each lane has its
  own running batch, inference thread and ONNX Runtime session. At every
  decoder step of a lane, its arrivals that fit are encoded together and join
  the running batch; finished segments leave at once and their callers are
  answered at once. A longer lane's thread (and the threads of its session)
  run at a lower OS priority (``lane_niceness``), so the kernel preempts long
  work, an encoder call over hundreds of tokens included, whenever short work
  is ready, and gives it every cycle short work leaves idle.
- ``static``: one lane; a batch is formed from the queue (by length bucket,
  waiting at most max_batch_delay_ms) only when the previous one has fully
  finished.

A server holding several models gives each its own lanes (with the same
bounds), running batches and inference threads; a job names its model. Threads
of equal lanes run at equal priority, so the kernel shares the CPU between the
models' work, and neither starves the other.

Both respect max_batch_size (per lane), max_batch_tokens and one memory budget
shared by all lanes of all models: the cross-attention keys/values (fixed per source) plus
the self-attention cache reserved by a predicted output length (a measured
target/source ratio) plus the encoder's attention scores. A segment that does
not fit waits; none is evicted mid-way; a segment that has waited
STARVATION_SECONDS for room stops other lanes from admitting until it fits.
Cancelled or expired jobs leave the batch at the next step.
"""

from __future__ import annotations

import collections
import itertools
import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from model.search import Hypothesis
from server.budget import MemoryBudget
from server.config import ServerConfig
from server.errors import Cancelled, DeadlineExceeded, InferenceFailed, Overloaded, ServiceError, ShuttingDown
from server.interface import Engine
from server.lanes import Lane, bucket_index, lane_names, lower_thread_priority
from server.metrics import Metrics, length_bucket
from server.policies import STARVATION_SECONDS, admit_in_order, admit_static, join_later
from server.text import SegmentSpec

log = logging.getLogger(__name__)
BACKLOG_WINDOW_S = 10.0  # Retry-After: the queue over the source tokens finished in this window
GAUGE_INTERVAL_S = 0.05  # the memory and batch gauges are set at most this often while lanes are busy
IDLE_WAIT_S = 0.05  # a lane whose arrivals do not fit waits this long for others to free room (or a notify)
__all__ = ["STARVATION_SECONDS", "Job", "Scheduler", "Segment"]
_ids = itertools.count()


@dataclass(eq=False)
class Segment:
    job: Job
    spec: SegmentSpec
    max_length: int
    reserved_bytes: int = 0
    predicted_tokens: int = 0
    lane: int = 0  # continuous: the running batch's lane, by the size of the whole request
    enqueued_at: float = field(default_factory=time.monotonic)
    joined_at: float = 0.0  # when it joined a running batch (time.monotonic()), ...
    encoded_at: float = 0.0  # ... when its encoder call and join were done ...
    finished_at: float = 0.0  # ... and when its decoding ended
    result: Hypothesis | None = None  # once decoded

    @property
    def output(self) -> list[int]:
        return self.result.tokens

    @property
    def source_tokens(self) -> int:
        return len(self.spec.ids)


@dataclass(eq=False)
class Job:
    """One RPC: its segments, options, deadline and how to answer it.

    ``on_segment`` and ``on_done`` are called on the inference thread; they
    must only hand the result over (e.g. loop.call_soon_threadsafe).
    """

    specs: list[SegmentSpec]
    beam: int
    max_output_tokens: int
    on_segment: Callable[[Segment], None]
    on_done: Callable[[ServiceError | None], None]
    deadline: float | None = None  # time.monotonic() value
    model: str = ""  # the name of the engine that translates it; "" is the scheduler's first (default) model
    id: int = field(default_factory=lambda: next(_ids))
    cancelled: bool = False
    segments: list[Segment] = field(default_factory=list)
    remaining: int = 0
    finished: bool = False


def _notify(callback: Callable, value) -> None:
    """Hand a result to its caller; a caller that is gone (closed event loop) must not stop the inference thread."""
    try:
        callback(value)
    except RuntimeError:
        log.warning("a result could not be delivered: its caller is gone")


class Scheduler:
    def __init__(self, engines: Sequence[Engine], config: ServerConfig, metrics: Metrics) -> None:
        """``engines``: one per model (distinct names), the first the default; each is its first lane's
        engine (other lanes load replicas in their threads)."""
        self.engines = {engine.name: engine for engine in engines}
        self.default_model = engines[0].name
        self.config = config
        self.metrics = metrics
        self.continuous = config.scheduler == "continuous"
        self.memory = MemoryBudget(config.memory_budget_bytes, self.engines)
        self.bounds = config.lane_bounds if self.continuous else ()
        names = lane_names(self.bounds)
        self.lanes: list[Lane] = []
        self.lanes_of: dict[str, list[Lane]] = {}  # a model's lanes, shortest first
        for model, engine in self.engines.items():
            lanes = [Lane(len(self.lanes) + i, name, model, config.lane_niceness * i) for i, name in enumerate(names)]
            lanes[0].engine = engine
            self.lanes_of[model] = lanes
            self.lanes.extend(lanes)
        self.lock = threading.Condition()
        self.accepting = True
        self.stopped = False
        self.starving: Segment | None = None  # waited too long for room: other lanes admit nobody meanwhile
        self.largest_scores_bytes = 0
        self.gauges_at = 0.0  # when the gauges were last set (time.monotonic())
        self.recently_finished: collections.deque[tuple[float, int]] = collections.deque()  # (time, source tokens)
        metrics.budget_bytes.set(config.memory_budget_bytes)

    @property
    def waiting(self) -> int:
        return sum(len(lane.waiting) for lane in self.lanes)

    @property
    def running(self) -> int:
        return sum(len(lane.running) for lane in self.lanes)

    # --- caller side ------------------------------------------------------------------

    def start(self) -> None:
        """Start the inference threads; returns once every lane's engine is loaded and warm."""
        for lane in self.lanes:
            lane.thread = threading.Thread(target=self._run, args=(lane,), name=f"inference-{lane.name}", daemon=True)
            lane.thread.start()
        for lane in self.lanes:
            lane.ready.wait()
            if lane.error is not None:
                raise RuntimeError(f"lane {lane.name} could not start its engine") from lane.error

    def submit(self, job: Job) -> None:
        """Queue a job, or refuse it at once (Overloaded, ShuttingDown)."""
        job.model = job.model or self.default_model
        engine = self.engines[job.model]
        segments = []
        lane = self._lane(job.model, sum(len(spec.ids) for spec in job.specs))
        for spec in job.specs:
            max_length = engine.max_length(len(spec.ids), job.max_output_tokens)
            reserved, predicted = self.memory.estimate(job.model, len(spec.ids), job.beam, max_length)
            segments.append(Segment(job, spec, max_length, reserved, predicted, lane))
        peak = lambda s: self.memory.peak_bytes(job.model, s.reserved_bytes, s.source_tokens)  # noqa: E731
        largest = max(segments, key=peak)
        need, budget = peak(largest), self.memory.budget_bytes
        if need > budget:
            self.metrics.rejected.labels("memory").inc()
            raise Overloaded(
                f"a segment of {largest.source_tokens} tokens with beam {job.beam} needs about {need >> 20} MiB, "
                "over the "
                f"memory budget of {budget >> 20} MiB; use a smaller beam or shorter texts"
            )
        with self.lock:
            if not self.accepting:
                raise ShuttingDown("the server is shutting down; retry on another replica")
            waiting = self.waiting
            if waiting + len(segments) > self.config.max_queue_size:
                self.metrics.rejected.labels("queue_full").inc()
                backlog = self._backlog_seconds()
                raise Overloaded(
                    f"the queue is full ({waiting} of {self.config.max_queue_size} sentences waiting); "
                    f"retry in about {backlog:.1f} s",
                    retry_after_s=backlog,
                )
            job.segments, job.remaining = segments, len(segments)
            self.lanes[lane].waiting.extend(segments)
            self.metrics.queue_depth.set(waiting + len(segments))
            self.lock.notify_all()

    def _backlog_seconds(self) -> float:
        """Seconds to work off the queue at the source-token rate of the last BACKLOG_WINDOW_S."""
        queued_tokens = sum(s.source_tokens for lane in self.lanes for s in lane.waiting)
        window = list(self.recently_finished)
        rate = sum(t for _, t in window) / BACKLOG_WINDOW_S if window else 0.0
        return max(0.1, queued_tokens / max(rate, 1.0))

    def cancel(self, job: Job) -> None:
        """The caller went away: the job's segments leave the queue or batch at the next step."""
        job.cancelled = True
        with self.lock:
            self.lock.notify_all()

    def stop_accepting(self) -> None:
        with self.lock:
            self.accepting = False

    def stop(self, timeout: float | None = None) -> None:
        """Finish everything admitted or queued, then end the inference threads (within timeout s in all)."""
        with self.lock:
            self.accepting = False
            self.stopped = True
            self.lock.notify_all()
        deadline = None if timeout is None else time.monotonic() + timeout
        for lane in self.lanes:
            if lane.thread is not None:
                lane.thread.join(None if deadline is None else max(0.0, deadline - time.monotonic()))

    # --- inference threads ------------------------------------------------------------

    def _start_lane(self, lane: Lane) -> None:
        """A longer lane lowers its priority, then loads its own sessions, so that their threads inherit it.
        (The first lane runs on the server's engine, which on CPU steps small batches on fewer threads.)"""
        try:
            lower_thread_priority(lane.niceness)
            if lane.engine is None:
                lane.engine = self.engines[lane.model].replica()
                if self.config.warmup:
                    lane.engine.warmup()
            lane.batch = lane.engine.new_batch()
        except Exception as error:
            lane.error = error
            raise
        finally:
            lane.ready.set()

    def _run(self, lane: Lane) -> None:
        self._start_lane(lane)
        while True:
            with self.lock:
                while not lane.waiting and not lane.running and not self.stopped:
                    self.lock.wait()
                if self.stopped and not lane.waiting and not lane.running:
                    return
            try:
                self._drop_abandoned(lane)
                admitted = self._admit(lane) if (self.continuous or not lane.running) else []
                if admitted:
                    self._encode_and_join(lane, admitted)
                if lane.running:
                    self._step(lane)
                else:  # nothing fit: waiting for room other lanes hold; they notify when they free some
                    with self.lock:
                        self.lock.wait(IDLE_WAIT_S)
            except Exception as error:  # one failed batch must not take the server down
                log.exception("inference failed; answering the batch with INTERNAL")
                failure = InferenceFailed(f"inference failed on the batch holding this request: {type(error).__name__}")
                self._fail_batch(lane, failure)
            self._update_gauges(lane)
            time.sleep(0)  # hand the GIL to the gRPC event loop between steps, so admission stays prompt

    def _wait_for_batch(self, lane: Lane) -> None:
        """With nothing running, give arrivals up to max_batch_delay_ms to form a batch."""
        deadline = lane.waiting[0].enqueued_at + self.config.max_batch_delay_ms / 1000
        while len(lane.waiting) < self.config.max_batch_size and not self.stopped:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            self.lock.wait(remaining)

    def _admit(self, lane: Lane) -> list[Segment]:
        with self.lock:
            if not lane.waiting:
                return []
            if not lane.running:
                self._wait_for_batch(lane)
            elif self._join_later(lane):
                return []
            fits = lambda group: self._fits(lane, group)  # noqa: E731
            if self.continuous:
                now = time.monotonic()
                admitted, self.starving = admit_in_order(lane.waiting, fits, lane.index, self.starving, now)
            else:
                admitted = admit_static(lane.waiting, fits)
            for segment in admitted:
                lane.waiting.remove(segment)
            self.memory.reserve(sum(s.reserved_bytes for s in admitted))
            return admitted

    def _join_later(self, lane: Lane) -> bool:
        """(Asked only of a lane with rows running: the static scheduler admits into an empty batch only.)"""
        return join_later(lane.waiting, lane.batch.rows, lane.join_seconds, time.monotonic())

    def _fits(self, lane: Lane, group: list[Segment]) -> bool:
        """Room for the group: max_batch_size sentences in the lane, max_batch_tokens, the memory budget."""
        if len(lane.running) + len(group) > self.config.max_batch_size:
            return False
        longest = max(s.source_tokens + 1 for s in group)
        if len(group) * longest > self.config.max_batch_tokens and len(group) > 1:
            return False
        return self.memory.fits(lane.model, [s.reserved_bytes for s in group], longest - 1)

    def _encode_and_join(self, lane: Lane, admitted: list[Segment]) -> None:
        started = time.perf_counter()
        self._join(lane, admitted)
        lane.joined(time.perf_counter() - started)

    def _join(self, lane: Lane, admitted: list[Segment]) -> None:
        now = time.monotonic()
        admitted.sort(key=lambda s: s.source_tokens)
        for segment in admitted:
            segment.joined_at = now
            self.metrics.queue_wait.observe(now - segment.enqueued_at)
            lane.running[segment] = None
        for group in self._length_groups(admitted):
            sources = [s.spec.ids for s in group]
            joined = lane.batch.join(group, sources, [s.job.beam for s in group], [s.max_length for s in group])
            encoded = time.monotonic()
            for segment in group:
                segment.encoded_at = encoded
            longest = max(s.source_tokens for s in group)
            self.metrics.encoder_latency.labels(length_bucket(longest)).observe(joined.seconds)
            self.metrics.batch_sentences.observe(len(group))
            self.metrics.batch_tokens.observe(joined.padded_tokens)
            self.metrics.padding_ratio.observe(1 - joined.real_tokens / joined.padded_tokens)
            scores = self.engines[lane.model].encoder_scores_bytes(len(group), longest)
            if scores > self.largest_scores_bytes:
                self.largest_scores_bytes = scores
                self.metrics.attention_scores_bytes.set(scores)

    def _lane(self, model: str, request_tokens: int) -> int:
        """The index of the model's lane for a request: lanes go by the size of the whole request (the
        sentences of a long document are long work)."""
        i = next((i for i, bound in enumerate(self.bounds) if request_tokens <= bound), len(self.bounds))
        return self.lanes_of[model][i].index

    @staticmethod
    def _length_groups(segments: list[Segment]) -> list[list[Segment]]:
        """Sorted segments cut where the length bucket changes, so each encoder batch pads little."""
        groups: list[list[Segment]] = []
        for segment in segments:
            if groups and bucket_index(groups[-1][-1].source_tokens) == bucket_index(segment.source_tokens):
                groups[-1].append(segment)
            else:
                groups.append([segment])
        return groups

    def _step(self, lane: Lane) -> None:
        """One decoder step of the lane's batch; finished segments are answered at once."""
        start = time.perf_counter()
        rows = lane.batch.rows
        finished = lane.batch.step()
        self.metrics.decoder_step.labels(lane.model).observe(time.perf_counter() - start)
        self.metrics.decode_rows.observe(rows)
        for segment, hypothesis in finished:
            self._finish(segment, hypothesis)

    def _finish(self, segment: Segment, hypothesis: Hypothesis) -> None:
        self._leave(segment)
        model, tokens = segment.job.model, hypothesis.tokens
        with self.lock:  # read by other lanes' threads and by submit
            self.memory.learn(model, segment.source_tokens, len(tokens))
            now = time.monotonic()
            self.recently_finished.append((now, segment.source_tokens))
            while self.recently_finished and self.recently_finished[0][0] < now - BACKLOG_WINDOW_S:
                self.recently_finished.popleft()
        segment.result, segment.finished_at = hypothesis, time.monotonic()
        self.metrics.confidence.labels(model).observe(hypothesis.score)
        if hypothesis.stopped != "eos":
            self.metrics.output_guard.labels(model, hypothesis.stopped).inc()
        self.metrics.input_tokens.labels(model).inc(segment.source_tokens)
        self.metrics.output_tokens.labels(model).inc(len(tokens))
        job = segment.job
        if job.finished:
            return
        _notify(job.on_segment, segment)
        job.remaining -= 1
        if job.remaining == 0:
            job.finished = True
            _notify(job.on_done, None)

    def _leave(self, segment: Segment) -> None:
        """The segment is out of its lane's batch: its reservation returns to the budget."""
        lane = self.lanes[segment.lane]
        with self.lock:
            if segment not in lane.running:
                return
            del lane.running[segment]
            self.memory.release(segment.reserved_bytes)
            if len(self.lanes) > 1:
                self.lock.notify_all()  # a lane waiting for room may now have it

    def _end_job(self, job: Job, error: ServiceError) -> None:
        """Answer a job with an error and take all its segments out of the queue and the batch
        (on the thread of the job's lane: a request's segments all go to one lane)."""
        if job.finished:
            return
        job.finished = True
        lane = self.lanes[job.segments[0].lane]
        with self.lock:
            for segment in job.segments:
                if segment in lane.waiting:
                    lane.waiting.remove(segment)
            if self.starving is not None and self.starving.job is job:
                self.starving = None
        for segment in job.segments:
            if segment in lane.running:
                lane.batch.remove(segment)
                self._leave(segment)
        _notify(job.on_done, error)

    def _drop_abandoned(self, lane: Lane) -> None:
        now = time.monotonic()
        with self.lock:
            jobs = {s.job for s in itertools.chain(lane.waiting, lane.running)}
        for job in jobs:
            if job.cancelled:
                self._end_job(job, Cancelled("the request was cancelled"))
            elif job.deadline is not None and now > job.deadline:
                self._end_job(job, DeadlineExceeded("the deadline passed before the translation finished"))

    def _fail_batch(self, lane: Lane, error: ServiceError) -> None:
        """Answer every job in the lane's batch (admitted segments count from the start of their join) with
        error; start afresh."""
        jobs = {s.job for s in lane.running}
        lane.batch = lane.engine.new_batch()
        with self.lock:
            self.memory.release(sum(s.reserved_bytes for s in lane.running))
            lane.running.clear()
        for job in jobs:
            self._end_job(job, error)

    def _update_gauges(self, lane: Lane) -> None:
        """The queue and batch gauges after a step of ``lane``; the cache sizes, which cost a walk over every
        buffer, at most every GAUGE_INTERVAL_S while lanes are busy (a step takes about a millisecond)."""
        m = self.metrics
        m.queue_depth.set(self.waiting)
        m.inflight.set(self.running)
        m.lane_rows.labels(lane.model, lane.name).set(lane.batch.rows if lane.batch is not None else 0)
        m.reserved_bytes.set(self.memory.reserved_bytes)
        now = time.monotonic()
        if now - self.gauges_at < GAUGE_INTERVAL_S and lane.running:
            return
        self.gauges_at = now
        batches = [lane.batch for lane in self.lanes if lane.batch is not None]
        m.kv_cache_bytes.set(sum(batch.cache_bytes for batch in batches))
        m.cross_cache_bytes.set(sum(batch.cross_bytes for batch in batches))
