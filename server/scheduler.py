"""Admission, batching and the decode loop, on one inference thread.

Requests become jobs of segments (sentences). Segments wait in a bounded
queue; the inference thread admits them into the running ``DecodeBatch``:

- ``continuous``: at every decoder step, arrivals that fit are encoded
  together and join the running batch; finished segments leave at once and
  their callers are answered at once. The running batch is split into lanes
  by the request's source length (``lane_bounds``): each lane is one decoder
  call per step, so short rows do not pay for the padding of long ones (a
  dense step costs rows × the longest source and cache in it), and while a
  shorter lane has rows a longer one steps only every ``lane_step_every``
  iterations: on a shared CPU, long work (a long sentence, or the many
  sentences of a document) would otherwise stretch every short row's step.
- ``static``: a batch is formed from the queue (by length bucket, waiting at
  most max_batch_delay_ms) only when the previous one has fully finished.

Both respect max_batch_size, max_batch_tokens and the memory budget: the
cross-attention keys/values (fixed per source) plus the self-attention cache
reserved by a predicted output length (a measured target/source ratio) plus
the encoder's attention scores. A segment that does not fit waits; none is
evicted mid-way. Cancelled or expired jobs leave the batch at the next step.
"""

from __future__ import annotations

import collections
import itertools
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from model.search import default_max_output, new_search
from server.config import ServerConfig
from server.engine import Engine
from server.errors import Cancelled, DeadlineExceeded, InferenceFailed, Overloaded, ServiceError, ShuttingDown
from server.metrics import LENGTH_BUCKETS, Metrics, length_bucket
from server.text import SegmentSpec

log = logging.getLogger(__name__)
LONG_ADMISSIONS = 8  # continuous: sentences a longer lane takes in per iteration it steps
STARVATION_SECONDS = 1.0  # continuous: after this, a segment waiting for room lets nobody pass
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
    output: list[int] | None = None

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


def bucket_index(tokens: int) -> int:
    return next((i for i, high in enumerate(LENGTH_BUCKETS) if tokens <= high), len(LENGTH_BUCKETS))


class Scheduler:
    def __init__(self, engine: Engine, config: ServerConfig, metrics: Metrics) -> None:
        self.engine = engine
        self.config = config
        self.metrics = metrics
        self.continuous = config.scheduler == "continuous"
        self.budget = config.memory_budget_bytes
        self.bounds = config.lane_bounds if self.continuous else ()
        self.lanes = [engine.new_batch() for _ in range(len(self.bounds) + 1)]
        self.running: dict[Segment, None] = {}  # segments in the batch, in join order
        self.iteration = 0
        lows = [1] + [bound + 1 for bound in self.bounds]
        self.lane_names = [f"{low}-{high}" for low, high in zip(lows[:-1], self.bounds, strict=True)] + [f"{lows[-1]}+"]
        self.waiting: collections.deque[Segment] = collections.deque()
        self.lock = threading.Condition()
        self.accepting = True
        self.stopped = False
        self.reserved_bytes = 0
        self.target_ratio = 1.3  # output/input tokens, updated from finished segments
        self.largest_scores_bytes = 0
        self.recently_finished: collections.deque[tuple[float, int]] = collections.deque()  # (time, source tokens)
        self.thread = threading.Thread(target=self._run, name="inference", daemon=True)
        metrics.budget_bytes.set(self.budget)

    # --- caller side ------------------------------------------------------------------

    def start(self) -> None:
        self.thread.start()

    def estimate(self, source_tokens: int, beam: int, max_output: int) -> tuple[int, int]:
        """(bytes reserved while decoding, predicted output tokens) of one segment."""
        predicted = min(max_output, int(self.target_ratio * source_tokens * 1.25) + 8)
        reserved = self.engine.sequence_bytes(source_tokens, predicted, beam)
        return reserved, predicted

    def submit(self, job: Job) -> None:
        """Queue a job, or refuse it at once (Overloaded, ShuttingDown)."""
        segments = []
        lane = self._lane(sum(len(spec.ids) for spec in job.specs))
        for spec in job.specs:
            max_length = default_max_output(len(spec.ids) + 1, job.max_output_tokens)
            reserved, predicted = self.estimate(len(spec.ids), job.beam, max_length)
            segments.append(Segment(job, spec, max_length, reserved, predicted, lane))
        largest = max(segments, key=lambda s: s.reserved_bytes + self.engine.encoder_scores_bytes(1, s.source_tokens))
        need = largest.reserved_bytes + self.engine.encoder_scores_bytes(1, largest.source_tokens)
        if need > self.budget:
            self.metrics.rejected.labels("memory").inc()
            raise Overloaded(
                f"a segment of {largest.source_tokens} tokens with beam {job.beam} needs about {need >> 20} MiB, over the "
                f"memory budget of {self.budget >> 20} MiB; use a smaller beam or shorter texts"
            )
        with self.lock:
            if not self.accepting:
                raise ShuttingDown("the server is shutting down; retry on another replica")
            if len(self.waiting) + len(segments) > self.config.max_queue_size:
                self.metrics.rejected.labels("queue_full").inc()
                raise Overloaded(
                    f"the queue is full ({len(self.waiting)} of {self.config.max_queue_size} sentences waiting); "
                    f"retry in about {self._backlog_seconds():.1f} s"
                )
            job.segments, job.remaining = segments, len(segments)
            self.waiting.extend(segments)
            self.metrics.queue_depth.set(len(self.waiting))
            self.lock.notify()

    def _backlog_seconds(self) -> float:
        """Seconds to work off the queue at the source-token rate of the last 10 seconds."""
        queued_tokens = sum(s.source_tokens for s in self.waiting)
        window = list(self.recently_finished)
        rate = sum(t for _, t in window) / 10.0 if window else 0.0
        return max(0.1, queued_tokens / max(rate, 1.0))

    def cancel(self, job: Job) -> None:
        """The caller went away: the job's segments leave the queue or batch at the next step."""
        job.cancelled = True
        with self.lock:
            self.lock.notify()

    def stop_accepting(self) -> None:
        with self.lock:
            self.accepting = False

    def stop(self, timeout: float | None = None) -> None:
        """Finish everything admitted or queued, then end the inference thread."""
        with self.lock:
            self.accepting = False
            self.stopped = True
            self.lock.notify()
        self.thread.join(timeout)

    # --- inference thread -------------------------------------------------------------

    def _run(self) -> None:
        while True:
            with self.lock:
                while not self.waiting and not self.running and not self.stopped:
                    self.lock.wait()
                if self.stopped and not self.waiting and not self.running:
                    return
            admitted: list[Segment] = []
            try:
                self._drop_abandoned()
                admitted = self._admit() if (self.continuous or not self.running) else []
                if admitted:
                    self._encode_and_join(admitted)
                if self.running:
                    self._step()
            except Exception as error:  # one failed batch must not take the server down
                log.exception("inference failed; answering the batch with INTERNAL")
                failure = InferenceFailed(f"inference failed on the batch holding this request: {type(error).__name__}")
                self._fail_batch(failure, admitted)
            self._update_gauges()
            time.sleep(0)  # hand the GIL to the gRPC event loop between steps, so admission stays prompt

    def _wait_for_batch(self) -> None:
        """With nothing running, give arrivals up to max_batch_delay_ms to form a batch."""
        deadline = self.waiting[0].enqueued_at + self.config.max_batch_delay_ms / 1000
        while len(self.waiting) < self.config.max_batch_size and not self.stopped:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            self.lock.wait(remaining)

    def _admit(self) -> list[Segment]:
        with self.lock:
            if not self.waiting:
                return []
            if not self.running:
                self._wait_for_batch()
            candidates = list(self.waiting)
            if self.continuous:
                admitted = self._admit_into_lanes(candidates)
            else:  # static: the oldest segment's length bucket first, then the nearest
                oldest = bucket_index(candidates[0].source_tokens)
                candidates.sort(key=lambda s: (abs(bucket_index(s.source_tokens) - oldest), s.enqueued_at))
                admitted = []
                for segment in candidates:
                    if self._fits(admitted + [segment]):
                        admitted.append(segment)
            for segment in admitted:
                self.waiting.remove(segment)
            return admitted

    def _admit_into_lanes(self, candidates: list[Segment]) -> list[Segment]:
        """First come, first served within a lane; a shorter lane may pass a longer one that waits for room
        (unless it has waited STARVATION_SECONDS). Longer lanes take arrivals only on the iterations they
        step, at most LONG_ADMISSIONS sentences at a time, so a document's encoding does not stall short rows."""
        long_budget = LONG_ADMISSIONS
        blocked = len(self.lanes)  # lanes from this one on admit nobody more this round
        now = time.monotonic()
        admitted: list[Segment] = []
        for segment in candidates:
            lane = segment.lane
            if lane >= blocked:
                continue
            if lane > 0 and (long_budget == 0 or not self._steps(lane, self.iteration + 1)):
                blocked = lane
                continue
            if not self._fits(admitted + [segment]):
                blocked = lane
                if lane == 0 or now - segment.enqueued_at > STARVATION_SECONDS:
                    break
                continue
            admitted.append(segment)
            long_budget -= lane > 0
        return admitted

    def _fits(self, group: list[Segment]) -> bool:
        """Room for the group: max_batch_size sentences (per lane), max_batch_tokens, the memory budget."""
        for lane in {s.lane for s in group}:
            if len(self.lanes[lane]) + sum(s.lane == lane for s in group) > self.config.max_batch_size:
                return False
        longest = max(s.source_tokens + 1 for s in group)
        if len(group) * longest > self.config.max_batch_tokens and len(group) > 1:
            return False
        need = self.reserved_bytes + sum(s.reserved_bytes for s in group)
        need += self.engine.encoder_scores_bytes(len(group), longest - 1)
        return need <= self.budget

    def _encode_and_join(self, admitted: list[Segment]) -> None:
        now = time.monotonic()
        admitted.sort(key=lambda s: s.source_tokens)
        for segment in admitted:
            self.metrics.queue_wait.observe(now - segment.enqueued_at)
        for group in self._length_groups(admitted):
            encoded = self.engine.encode([s.spec.ids for s in group])
            longest = max(s.source_tokens for s in group)
            self.metrics.encoder_latency.labels(length_bucket(longest)).observe(encoded.seconds)
            self.metrics.batch_sentences.observe(len(group))
            self.metrics.batch_tokens.observe(encoded.padded_tokens)
            self.metrics.padding_ratio.observe(1 - encoded.real_tokens / encoded.padded_tokens)
            scores = self.engine.encoder_scores_bytes(len(group), longest)
            if scores > self.largest_scores_bytes:
                self.largest_scores_bytes = scores
                self.metrics.attention_scores_bytes.set(scores)
            searches = [new_search(s.job.beam, s.max_length, self.engine.config.eos_id) for s in group]
            self.lanes[group[0].lane].add(group, searches, encoded.cross_k, encoded.cross_v, encoded.src_mask)
            for segment in group:
                self.running[segment] = None
                self.reserved_bytes += segment.reserved_bytes

    def _lane(self, request_tokens: int) -> int:
        """Lanes go by the size of the whole request: the sentences of a long document are long work."""
        return next((i for i, bound in enumerate(self.bounds) if request_tokens <= bound), len(self.bounds))

    def _steps(self, lane: int, iteration: int) -> bool:
        """Whether a lane steps at this iteration: always while no shorter lane has rows, else every
        ``lane_step_every`` iterations."""
        return iteration % self.config.lane_step_every == 0 or not any(len(shorter) for shorter in self.lanes[:lane])

    @staticmethod
    def _length_groups(segments: list[Segment]) -> list[list[Segment]]:
        """Sorted segments cut where the length bucket (or lane) changes, so each encoder batch pads little."""

        def group_of(segment: Segment) -> tuple[int, int]:
            return bucket_index(segment.source_tokens), segment.lane

        groups: list[list[Segment]] = []
        for segment in segments:
            if groups and group_of(groups[-1][-1]) == group_of(segment):
                groups[-1].append(segment)
            else:
                groups.append([segment])
        return groups

    def _step(self) -> None:
        """One decoder step of every lane that has rows; a longer lane only every ``lane_step_every``
        iterations while a shorter one has rows, so short sentences are not slowed down by long ones."""
        self.iteration += 1
        for lane, batch in enumerate(self.lanes):
            if not len(batch) or not self._steps(lane, self.iteration):
                continue
            start = time.perf_counter()
            rows = batch.rows
            finished = batch.step()
            self.metrics.decoder_step.observe(time.perf_counter() - start)
            self.metrics.decode_rows.observe(rows)
            for segment, tokens in finished:
                self._finish(segment, tokens)

    def _finish(self, segment: Segment, tokens: list[int]) -> None:
        self._leave(segment)
        segment.output = tokens
        self.metrics.input_tokens.inc(segment.source_tokens)
        self.metrics.output_tokens.inc(len(tokens))
        self.target_ratio = 0.98 * self.target_ratio + 0.02 * (len(tokens) + 1) / (segment.source_tokens + 1)
        now = time.monotonic()
        self.recently_finished.append((now, segment.source_tokens))
        while self.recently_finished and self.recently_finished[0][0] < now - 10.0:
            self.recently_finished.popleft()
        job = segment.job
        if job.finished:
            return
        _notify(job.on_segment, segment)
        job.remaining -= 1
        if job.remaining == 0:
            job.finished = True
            _notify(job.on_done, None)

    def _leave(self, segment: Segment) -> None:
        if segment in self.running:
            del self.running[segment]
            self.reserved_bytes -= segment.reserved_bytes

    def _end_job(self, job: Job, error: ServiceError) -> None:
        """Answer a job with an error and take all its segments out of the queue and the batch."""
        if job.finished:
            return
        job.finished = True
        with self.lock:
            for segment in job.segments:
                if segment in self.waiting:
                    self.waiting.remove(segment)
        for segment in job.segments:
            if segment in self.running:
                self.lanes[segment.lane].remove(segment)
                self._leave(segment)
        _notify(job.on_done, error)

    def _drop_abandoned(self) -> None:
        now = time.monotonic()
        with self.lock:
            jobs = {s.job for s in itertools.chain(self.waiting, self.running)}
        for job in jobs:
            if job.cancelled:
                self._end_job(job, Cancelled("the request was cancelled"))
            elif job.deadline is not None and now > job.deadline:
                self._end_job(job, DeadlineExceeded("the deadline passed before the translation finished"))

    def _fail_batch(self, error: ServiceError, admitted: list[Segment]) -> None:
        """Answer every job in the batch (and those being admitted into it) with error; start afresh."""
        jobs = {s.job for s in itertools.chain(self.running, admitted)}
        self.lanes = [self.engine.new_batch() for _ in self.lanes]
        self.running.clear()
        self.reserved_bytes = 0
        for job in jobs:
            self._end_job(job, error)

    def _update_gauges(self) -> None:
        m = self.metrics
        m.queue_depth.set(len(self.waiting))
        m.inflight.set(len(self.running))
        for name, batch in zip(self.lane_names, self.lanes, strict=True):
            m.lane_rows.labels(name).set(batch.rows)
        m.kv_cache_bytes.set(sum(batch.cache.nbytes for batch in self.lanes))
        m.cross_cache_bytes.set(sum(batch.cross_nbytes for batch in self.lanes))
        m.reserved_bytes.set(self.reserved_bytes)
