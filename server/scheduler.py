"""Admission, batching and the decode loop, on inference threads: the glue of the memory budget
(server/budget.py), the lanes and their threads (server/lanes.py), the policy that decides who joins a batch
and when (server/policies.py) and the jobs it answers (server/jobs.py), each testable alone.

Requests become jobs of segments (sentences) that wait in a bounded queue. Each model has lanes (continuous:
by the request's size, ``--lanes``; static: one), each lane a running batch, an inference thread and its own
engine; a longer lane's thread runs at a lower OS priority (``lane_niceness``), so short work preempts long
work. At every step of a lane, the policy says whether its arrivals join now (continuous: when the time they
waited pays for what a join costs the running rows; static: only into an empty batch) and which of them
(those that fit max_batch_size, max_batch_tokens and the memory budget shared by all lanes of all models;
continuous: then, into at most half of its rows, the sentences short enough for the lane that have waited
0.2 s beyond the room longer lanes have, so that a backlog of documents' sentences uses the first lane's
steps instead of waiting); the chosen are encoded in length groups (apart, on the lane's encoder thread
while its batch steps, when it has one) and join the batch; finished segments leave and are answered at once.
While a longer lane decodes a sentence too long for a shorter one, the shorter lane pauses after its steps so
that the longer lane keeps ``long_lane_share`` of its core (its lower priority would starve it).
No segment is evicted mid-way; cancelled or expired jobs leave at the next step. docs/serving.md has the
design and its measurements.
"""

from __future__ import annotations

import functools
import itertools
import logging
import threading
import time
from collections.abc import Iterator, Sequence

from runtime.search import Hypothesis
from server.budget import MemoryBudget
from server.config import ServerConfig
from server.errors import Cancelled, DeadlineExceeded, InferenceFailed, Overloaded, ServiceError, ShuttingDown
from server.interface import Encoded, Engine
from server.jobs import Job, QueuedSentence, Throughput
from server.lanes import Lane, choose_lane, model_lanes, plan_threads
from server.metrics import Metrics
from server.policies import (
    BACKLOG_AFTER_SECONDS,
    BACKLOG_SHARE,
    PAUSE_AT_LEAST_SECONDS,
    POLICIES,
    length_groups,
    pause_owed,
)

log = logging.getLogger(__name__)
GAUGE_INTERVAL_S = 0.05  # the memory and batch gauges are set at most this often while lanes are busy
IDLE_WAIT_S = 0.05  # a lane whose arrivals do not fit waits this long for others to free room (or a notify)


class Scheduler:
    def __init__(self, engines: Sequence[Engine], config: ServerConfig, metrics: Metrics) -> None:
        """``engines``: one per model (distinct names), the first the default; each is its first lane's
        engine (other lanes load replicas in their threads)."""
        self.engines = {engine.name: engine for engine in engines}
        self.default_model = engines[0].name
        self.config = config
        self.metrics = metrics
        self.policy = POLICIES[config.scheduler]()
        self.threads = plan_threads(config)
        self.memory = MemoryBudget(config.memory_budget_bytes, self.engines)
        self.bounds = config.lanes if self.policy.splits_lanes else ()
        replicas = config.first_lane_replicas if self.policy.splits_lanes else 1
        self.lanes_of = model_lanes(self.engines, self.bounds, config.lane_niceness, replicas)  # shortest first
        self.lanes = [lane for lanes in self.lanes_of.values() for lane in lanes]
        for lane in self.lanes:  # every lane that can take backlog shows 0 until it does
            if self.policy.splits_lanes and lane.size_class < len(self.bounds):
                metrics.backlog_moved.labels(lane.model, lane.name)
                metrics.lane_paused.labels(lane.model, lane.name)
        self.lock = threading.Condition()
        self.accepting = True
        self.stopped = False
        self.gauges_at = 0.0  # when the gauges were last set (time.monotonic())
        self.throughput = Throughput()  # source tokens finished lately: the Retry-After of a full queue
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
        lane = choose_lane(self.lanes_of[job.model], self.bounds, sum(len(spec.ids) for spec in job.specs))
        for spec in job.specs:
            max_length = engine.max_length(len(spec.ids), job.options.max_output_tokens)
            reserved, predicted = self.memory.estimate(job.model, len(spec.ids), job.options.beam, max_length)
            segments.append(QueuedSentence(job, spec, max_length, reserved, predicted, lane))
        largest, need = self.memory.largest_peak(job.model, [(s.reserved_bytes, s.source_tokens) for s in segments])
        if need > self.memory.budget_bytes:
            self.metrics.rejected.labels("memory").inc()
            raise Overloaded(
                f"a segment of {segments[largest].source_tokens} tokens with beam {job.options.beam} needs about "
                f"{need >> 20} MiB, over the memory budget of {self.memory.budget_bytes >> 20} MiB; use a smaller "
                "beam or shorter texts"
            )
        with self.lock:
            if not self.accepting:
                raise ShuttingDown("the server is shutting down; retry on another replica")
            waiting = self.waiting
            if waiting + len(segments) > self.config.max_queue_size:
                self.metrics.rejected.labels("queue_full").inc()
                backlog = self.throughput.seconds_for(sum(s.source_tokens for lane in self.lanes for s in lane.waiting))
                raise Overloaded(
                    f"the queue is full ({waiting} of {self.config.max_queue_size} sentences waiting); "
                    f"retry in about {backlog:.1f} s",
                    retry_after_s=backlog,
                )
            job.segments, job.remaining = segments, len(segments)
            self.lanes[lane].waiting.extend(segments)
            self.metrics.queue_depth.set(waiting + len(segments))
            self.lock.notify_all()

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

    def _run(self, lane: Lane) -> None:
        engine = self.engines[lane.model]
        apart = self.threads.encode_apart and lane.size_class == 0 and engine.provider == "cpu"
        replica = functools.partial(engine.replica, self.threads.other_lanes, self.threads.other_lanes_narrow)
        lane.open(replica, self.config.warmup, apart)
        while True:
            with self.lock:
                while not (lane.waiting or lane.running or lane.encoding or self.stopped or any(self._backlog(lane))):
                    self.lock.wait(self._backlog_wait(lane))
                if self.stopped and not (lane.waiting or lane.running or lane.encoding):
                    lane.close()
                    return
            try:
                self._drop_abandoned(lane)
                if lane.size_class and self.threads.other_lanes_narrow:  # a longer lane: not alone, on fewer threads
                    lane.batch.narrow = any(other.running for other in self.lanes if other is not lane)
                admitted = self._admit(lane)
                if admitted:
                    self._encode_and_join(lane, admitted)
                if lane.encoding:  # an empty batch has nothing to do but wait for them
                    self._join_encoded(lane, wait=not lane.batch.rows)
                if lane.batch.rows:
                    self._pause_for_longer_lanes(lane, self._step(lane))
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

    def _admit(self, lane: Lane) -> list[QueuedSentence]:
        """The lane's arrivals that join its batch now, and when they all do, the longer lanes' backlog that
        fits in the room left (a sentence taken moves to this lane). Whether arrivals join now counts only the
        lane's own rows: the backlog it took is long work, which may wait a step for a join."""
        with self.lock:
            if lane.waiting and not lane.running:
                self._wait_for_batch(lane)
            backlog = list(self._backlog(lane))
            if not (lane.waiting or backlog):
                return []
            now = time.monotonic()
            if lane.running:
                own = lane.batch.rows - sum(s.job.options.beam for s in lane.running if s.moved)
                if not self.policy.joins_now([*lane.waiting, *backlog], max(0, own), lane.join_seconds, now):
                    return []
            fits = lambda group: self._fits(lane, group)  # noqa: E731
            admitted = self.policy.choose(lane.waiting, fits, lane.index, now) if lane.waiting else []
            if backlog and len(admitted) == len(lane.waiting):
                taken = self.policy.choose_backlog(backlog[: self._backlog_room(lane, admitted)], fits, admitted)
                for segment in taken:
                    segment.moved = True
                if taken:
                    self.metrics.backlog_moved.labels(lane.model, lane.name).inc(len(taken))
                admitted += taken
            for segment in admitted:
                self.lanes[segment.lane].waiting.remove(segment)
                segment.lane = lane.index
            self.memory.reserve(sum(s.reserved_bytes for s in admitted))
            return admitted

    def _backlog(self, lane: Lane) -> Iterator[QueuedSentence]:
        """(Under the lock.) The sentences waiting in the model's longer lanes beyond the room their batches
        have (max_batch_size rows) for BACKLOG_AFTER_SECONDS or more, that are short enough for this lane,
        shortest lane's first and oldest first, at most the room this lane gives them (BACKLOG_SHARE of
        max_batch_size): work that would otherwise wait while this lane steps few rows."""
        if not self.policy.splits_lanes or lane.size_class >= len(self.bounds):
            return iter(())
        bound, size = self.bounds[lane.size_class], self.config.max_batch_size
        aged = time.monotonic() - BACKLOG_AFTER_SECONDS
        backlog = (
            segment
            for other in self._longer_lanes(lane)
            for segment in itertools.islice(other.waiting, max(0, size - len(other.running)), None)
            if segment.source_tokens <= bound and segment.enqueued_at <= aged
        )
        return itertools.islice(backlog, self._backlog_room(lane))

    def _backlog_room(self, lane: Lane, admitted: Sequence[QueuedSentence] = ()) -> int:
        """The rows of the lane that moved backlog may still take (BACKLOG_SHARE of max_batch_size), besides
        those running and ``admitted``."""
        return max(0, int(BACKLOG_SHARE * self.config.max_batch_size) - len(lane.running) - len(admitted))

    def _backlog_wait(self, lane: Lane) -> float | None:
        """(Under the lock.) How long an idle lane may sleep: until a longer lane's waiting sentences may have
        become backlog, when it has any; else until notified."""
        waiting = any(other.waiting for other in self._longer_lanes(lane))
        return BACKLOG_AFTER_SECONDS if self.policy.splits_lanes and waiting else None

    def _longer_lanes(self, lane: Lane) -> Iterator[Lane]:
        """The lanes of the lane's model that take longer requests than it does."""
        return (other for other in self.lanes_of[lane.model] if other.size_class > lane.size_class)

    def _fits(self, lane: Lane, group: list[QueuedSentence]) -> bool:
        """Room for the group: max_batch_size sentences in the lane, max_batch_tokens, the memory budget."""
        if len(lane.running) + len(group) > self.config.max_batch_size:
            return False
        longest = max(s.source_tokens + 1 for s in group)
        if len(group) * longest > self.config.max_batch_tokens and len(group) > 1:
            return False
        return self.memory.fits(lane.model, [s.reserved_bytes for s in group], longest - 1)

    def _encode_and_join(self, lane: Lane, admitted: list[QueuedSentence]) -> None:
        """Encode the admitted segments in length groups and add them to the lane's batch: at once, or, when the
        lane encodes apart and its batch has rows to step meanwhile, on the lane's encoder thread (they join at
        the first step after their call returns, ``_join_encoded``). ``lane.join_seconds`` learns only from
        joins at once: a lane that encodes apart gathers arrivals as long, so its encoder calls stay as large."""
        started, now = time.perf_counter(), time.monotonic()
        admitted.sort(key=lambda s: s.source_tokens)
        for segment in admitted:
            segment.joined_at = now
            self.metrics.queue_wait.observe(now - segment.enqueued_at)
            lane.running[segment] = None
        apart = lane.encoder is not None and lane.batch.rows > 0
        for group in length_groups(admitted):
            if apart:
                lane.encode_apart(group)
            else:
                self._add(lane, group, lane.batch.encode([s.spec.ids for s in group]))
        if not apart:
            lane.joined(time.perf_counter() - started)

    def _join_encoded(self, lane: Lane, wait: bool) -> None:
        """Add the groups whose encoder call on the lane's encoder thread returned (``wait``: all of them). An
        encoder error is raised here, on the lane's thread, and fails the batch as an error in a step does."""
        for group, encoded in lane.encoded(wait):
            self._add(lane, group, encoded)

    def _add(self, lane: Lane, group: list[QueuedSentence], encoded: Encoded) -> None:
        """An encoded group joins the batch (a segment that left meanwhile, cancelled or expired, leaves again
        at once); its encoder call's metrics."""
        joined = lane.batch.add(group, encoded, [s.job.options.beam for s in group], [s.max_length for s in group])
        now = time.monotonic()
        for segment in group:
            segment.encoded_at = now
            if segment not in lane.running:
                lane.batch.remove(segment)
        longest = max(s.source_tokens for s in group)
        scores = self.engines[lane.model].encoder_scores_bytes(len(group), longest)
        self.metrics.observe_encoder_batch(
            len(group), longest, joined.seconds, joined.padded_tokens, joined.real_tokens, scores
        )

    def _step(self, lane: Lane) -> float:
        """One decoder step of the lane's batch; finished segments are answered at once."""
        start = time.perf_counter()
        rows = lane.batch.rows
        finished = lane.batch.step()
        seconds = time.perf_counter() - start
        self.metrics.decoder_step.labels(lane.model).observe(seconds)
        self.metrics.decode_rows.observe(rows)
        for segment, hypothesis in finished:
            self._finish(segment, hypothesis)
        return seconds

    def _pause_for_longer_lanes(self, lane: Lane, seconds: float) -> None:
        """After a step of ``seconds``: while a longer lane (lower OS priority) decodes sentences too long to move
        into this lane, pause for what this lane owes it (policies.pause_owed, ``--long-lane-share``); otherwise
        it owes nothing (a longer lane's short sentences that fall behind move down instead: ``_backlog``)."""
        now = time.perf_counter()
        share = self.config.long_lane_share
        idle, lane.off_cpu_since = max(0.0, now - seconds - lane.off_cpu_since), now
        if not share or not self._decoding_long_work(lane):
            lane.owed_seconds = 0.0
            return
        lane.owed_seconds = pause_owed(lane.owed_seconds, idle, seconds, share)
        if lane.owed_seconds >= PAUSE_AT_LEAST_SECONDS:
            time.sleep(lane.owed_seconds)
            self.metrics.lane_paused.labels(lane.model, lane.name).inc(lane.owed_seconds)
            lane.owed_seconds, lane.off_cpu_since = 0.0, time.perf_counter()

    def _decoding_long_work(self, lane: Lane) -> bool:
        """Whether a lane at lower OS priority than ``lane`` decodes a sentence longer than ``lane`` takes. Any
        model's lane, not only ``_longer_lanes`` (this model's): the OS starves a long lane for every busier
        lane of higher priority, whichever model it serves."""
        bound = self.bounds[lane.size_class] if lane.size_class < len(self.bounds) else None
        return bound is not None and any(
            segment.source_tokens > bound
            for other in self.lanes
            if other.niceness > lane.niceness
            for segment in list(other.running)  # a copy: other lanes' threads change theirs
        )

    def _finish(self, segment: QueuedSentence, hypothesis: Hypothesis) -> None:
        self._leave(segment)
        with self.lock:  # read by other lanes' threads and by submit
            self.memory.learn(segment.job.model, segment.source_tokens, len(hypothesis.tokens))
            self.throughput.add(segment.source_tokens, time.monotonic())
        segment.result, segment.finished_at = hypothesis, time.monotonic()
        self.metrics.observe_sentence(segment.job.model, segment.source_tokens, hypothesis)
        with self.lock:  # a job's segments may finish on two lanes' threads
            segment.job.answer(segment)

    def _leave(self, segment: QueuedSentence) -> None:
        """The segment is out of its lane's batch: its reservation returns to the budget."""
        lane = self.lanes[segment.lane]
        with self.lock:
            if segment not in lane.running:
                return
            del lane.running[segment]
            self.memory.release(segment.reserved_bytes)
            if len(self.lanes) > 1:
                self.lock.notify_all()  # a lane waiting for room may now have it

    def _end_job(self, job: Job, error: ServiceError, lane: Lane) -> None:
        """On ``lane``'s thread: answer a job with an error and take its segments out of every queue and of
        this lane's batch (a lane that took some of them drops its own at its next step, ``_drop_abandoned``)."""
        with self.lock:
            if job.finished:
                return
            for segment in job.segments:  # a queued segment waits in the lane it names
                queue = self.lanes[segment.lane].waiting
                if segment in queue:
                    queue.remove(segment)
            self.policy.forget(job)
            job.fail(error)
        self._drop_rows(lane, job)

    def _drop_rows(self, lane: Lane, job: Job) -> None:
        """On ``lane``'s thread: the job's segments leave its batch."""
        for segment in job.segments:
            if segment in lane.running:
                if not lane.encodes(segment):  # one being encoded is taken out when its group joins
                    lane.batch.remove(segment)
                self._leave(segment)

    def _drop_abandoned(self, lane: Lane) -> None:
        now = time.monotonic()
        with self.lock:
            jobs = {s.job for s in itertools.chain(lane.waiting, lane.running)}
        for job in jobs:
            if job.finished:  # ended with an error on another lane's thread
                self._drop_rows(lane, job)
            elif job.cancelled:
                self._end_job(job, Cancelled("the request was cancelled"), lane)
            elif job.deadline is not None and now > job.deadline:
                self._end_job(job, DeadlineExceeded("the deadline passed before the translation finished"), lane)

    def _fail_batch(self, lane: Lane, error: ServiceError) -> None:
        """Answer every job in the lane's batch (admitted segments count from the start of their join) with
        error; start afresh."""
        jobs = {s.job for s in lane.running}
        lane.batch = lane.engine.new_batch()
        lane.encoding.clear()  # groups still on the encoder thread are dropped when they finish
        with self.lock:
            self.memory.release(sum(s.reserved_bytes for s in lane.running))
            lane.running.clear()
        for job in jobs:
            self._end_job(job, error, lane)

    def _update_gauges(self, lane: Lane) -> None:
        """The queue and batch gauges after a step of ``lane``; the cache sizes, which cost a walk over every
        buffer, at most every GAUGE_INTERVAL_S while lanes are busy (a step takes about a millisecond)."""
        now = time.monotonic()
        walk = now - self.gauges_at >= GAUGE_INTERVAL_S or not lane.running
        if walk:
            self.gauges_at = now
        self.metrics.set_gauges(lane, self.lanes, self.waiting, self.running, self.memory.reserved_bytes, walk)
