"""The scheduler: jobs in, the lanes' decode loop on inference threads, answers out. The glue of the memory
budget (server/scheduling/budget.py), admission (server/scheduling/admission.py, with the policy that decides who joins
a batch and when, server/scheduling/policies.py), the lanes and their threads (server/scheduling/lanes.py,
server/scheduling/threads.py) and the jobs it answers (server/scheduling/jobs.py), each testable alone; at each step a
lane's decisions are values (server/scheduling/decisions.py) that ``Scheduler.apply`` carries out.

Requests become jobs of segments (sentences) that wait in a bounded queue. Each model has lanes (continuous:
by the request's size, ``--lanes``, each size with ``--lane-replicas``, by default one per core; static: one),
each lane a running batch and an inference thread, all on the model's engine; a request's sentences spread over
its size's replicas, and a replica that runs out of work takes the others' queued sentences, so every core
decodes; a longer lane's thread runs at a lower OS priority (``lane_niceness``), so short work preempts long
work. A lane sleeps until it is woken for work of its own (arrivals, room freed, a stop). At every step
of a lane, cancelled or expired jobs leave; the policy says whether its arrivals join now (continuous: when
the time they waited pays for what a join costs the running rows; static: only into an empty batch) and
which of them (those that fit max_batch_size, max_batch_tokens and the memory budget shared by all lanes of
all models); the chosen are encoded in length groups on the lane's thread and join the batch; finished
segments leave and are answered at once. While a longer lane decodes, a busy shorter lane pauses after its
steps so that the longer lane keeps ``long_lane_share`` of its core (its lower priority would starve it).
No segment is evicted mid-way. docs/serving.md has the design and its measurements.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections.abc import Sequence

from runtime.memory import release_free_memory
from runtime.search import Hypothesis
from server.config import ServerConfig
from server.errors import InferenceFailed, Overloaded, ServiceError, ShuttingDown
from server.interface import Encoded, Engine
from server.operations.metrics import Metrics
from server.scheduling.admission import Admissions
from server.scheduling.budget import MemoryBudget
from server.scheduling.decisions import Admission, Leaving, Pause, leaving
from server.scheduling.fairness import LongerLanes
from server.scheduling.jobs import Job, QueuedSentence, Throughput
from server.scheduling.lanes import Lane, model_lanes, wake_blocked
from server.scheduling.policies import POLICIES, length_groups
from server.scheduling.threads import plan_threads

log = logging.getLogger(__name__)
GAUGE_INTERVAL_S = 0.05  # the memory and batch gauges are set at most this often while lanes are busy
IDLE_WAIT_S = 0.05  # a lane whose arrivals do not fit waits this long for others to free room (or a notify)
# A lane idle this long gives the heaps' free memory back (release_free_memory), once per busy spell: each heap keeps
# up to 64 MiB freed under load (runtime/memory.py), which returning at every idle moment would page in again.
RELEASE_AFTER_IDLE_S = 1.0


class Scheduler:
    def __init__(self, engines: Sequence[Engine], config: ServerConfig, metrics: Metrics) -> None:
        """``engines``: one per model (distinct names), the first the default; all of a model's lanes run on
        its engine."""
        self.engines = {engine.name: engine for engine in engines}
        self.default_model = engines[0].name
        self.config, self.settings, self.metrics = config, config.scheduling, metrics
        policy = POLICIES[self.settings.scheduler]()
        self.threads = plan_threads(config)
        self.memory = MemoryBudget(config.memory_budget_bytes, {name: e.memory for name, e in self.engines.items()})
        self.bounds = self.settings.lanes if policy.splits_lanes else ()
        replicas = {name: self.threads.replicas(engine.provider) for name, engine in self.engines.items()}
        self.fairness = LongerLanes(self.settings.lane_niceness, self.settings.long_lane_share)
        self.lanes_of = model_lanes(replicas, self.bounds, self.fairness)  # shortest first
        self.lanes = [lane for lanes in self.lanes_of.values() for lane in lanes]
        self.admissions = Admissions(self.settings, policy, self.memory, self.lanes_of, metrics)
        for lane in self.lanes:  # every lane shows no rows until it has some, and no pause until it takes one
            metrics.lane_rows.labels(lane.model, lane.name).set(0)
            if policy.splits_lanes and lane.size_class < len(self.bounds):
                metrics.lane_paused.labels(lane.model, lane.name)
        self.lock = threading.Lock()  # over the queues, the batches' members, the budget and the jobs; taken once
        for lane in self.lanes:  # each lane is woken alone, for work of its own
            lane.attach(self.lock)
        self.accepting, self.stopped = True, False
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
            lane.start(self._run)
        for lane in self.lanes:
            lane.ready.wait()
            if lane.error is not None:
                raise RuntimeError(f"lane {lane.name} could not start its engine") from lane.error

    def submit(self, job: Job) -> None:
        """Queue a job, or refuse it at once (Overloaded, ShuttingDown)."""
        job.model = job.model or self.default_model
        segments = self.admissions.segments(job, self.engines[job.model])
        with self.lock:
            if not self.accepting:
                raise ShuttingDown("the server is shutting down; retry on another replica")
            # Each lane size has its own queue bound, as its own lanes: a document's sentences never fill the
            # queue that single sentences wait in. A request alone in its size's queue is taken whole however
            # many sentences it has (--char-limit bounds them): it could never be taken otherwise; the memory
            # budget admits its sentences as they fit.
            size = self.lanes[segments[0].lane].size_class if segments else 0
            queue = [lane.waiting for lane in self.lanes_of[job.model] if lane.size_class == size]
            waiting = sum(map(len, queue))
            if waiting and waiting + len(segments) > self.settings.max_queue_size:
                self._refuse(
                    "queue_full", f"the queue is full ({waiting} of {self.settings.max_queue_size} sentences waiting)"
                )
            bounds = self.settings.max_queue_wait_s
            bound = bounds[min(size, len(bounds) - 1)]
            waited = time.monotonic() - min((sentences[0].enqueued_at for sentences in queue if sentences), default=0.0)
            if waiting and bound and waited > bound:  # each lane's queue is in arrival order: its first is its oldest
                self._refuse(
                    "queue_wait", f"the queue is not keeping up (its oldest sentence has waited {waited:.1f} s)"
                )
            job.segments, job.remaining = segments, len(segments)
            for segment in segments:
                self.lanes[segment.lane].queue(segment)
            self.metrics.queue_depth.set(self.waiting)
            for index in {segment.lane for segment in segments}:
                self.lanes[index].wake.notify()

    def _refuse(self, reason: str, why: str) -> None:
        """Overloaded for ``why``, counted under ``reason``, with the time the queues take to work off."""
        self.metrics.rejected.labels(reason).inc()
        backlog = self.throughput.seconds_for(sum(s.source_tokens for lane in self.lanes for s in lane.waiting))
        raise Overloaded(f"{why}; retry in about {backlog:.1f} s", retry_after_s=backlog)

    def cancel(self, job: Job) -> None:
        """The caller went away: the job's segments leave the queue or batch at the next step."""
        job.cancelled = True
        self._wake(self.lanes)

    def stop_accepting(self) -> None:
        with self.lock:
            self.accepting = False

    def stop(self, timeout: float | None = None) -> None:
        """Finish everything admitted or queued, then end the inference threads (within timeout s in all)."""
        with self.lock:
            self.accepting = False
            self.stopped = True
        self._wake(self.lanes)
        deadline = None if timeout is None else time.monotonic() + timeout
        for lane in self.lanes:
            if lane.thread is not None:
                lane.thread.join(None if deadline is None else max(0.0, deadline - time.monotonic()))

    def _wake(self, lanes: Sequence[Lane]) -> None:
        with self.lock:
            for lane in lanes:
                lane.wake.notify()

    # --- inference threads ------------------------------------------------------------

    def _run(self, lane: Lane) -> None:
        lane.open(self.engines[lane.model])
        while True:
            with self.lock:
                idle_since, release = time.monotonic(), False
                while not (lane.waiting or lane.running or self.stopped or self._has_work_elsewhere(lane)):
                    woken = lane.wake.wait(RELEASE_AFTER_IDLE_S if lane.stepped else None)
                    if not woken and lane.stepped and time.monotonic() - idle_since >= RELEASE_AFTER_IDLE_S:
                        release = True
                        break
                if self.stopped and not (lane.waiting or lane.running):
                    return
            if release:  # outside the lock: submissions go on meanwhile
                lane.gave_memory_back()
                release_free_memory()
                continue
            try:
                self.apply(lane, self._leaving(lane))
                admitted = self._admit(lane)
                if admitted:
                    self._encode_and_join(lane, admitted)
                if lane.batch.rows:
                    self.apply(lane, self._pause(lane, self._step(lane)))
                else:  # nothing fit: waiting for room other lanes hold; they wake it when they free some
                    with self.lock:
                        lane.wait_for_room(IDLE_WAIT_S)
            except Exception as error:  # one failed batch must not take the server down
                log.exception("inference failed; answering the batch with INTERNAL")
                failure = InferenceFailed(f"inference failed on the batch holding this request: {type(error).__name__}")
                self._fail_batch(lane, failure)
            self._update_gauges(lane)

    def _wait_for_batch(self, lane: Lane) -> None:
        """With nothing running, give arrivals up to max_batch_delay_ms to form a batch, and stop once none came for
        batch_gap_ms: closed-loop clients' first arrivals come together; the rest of the delay would idle the core."""
        deadline = lane.waiting[0].enqueued_at + self.settings.max_batch_delay_ms / 1000
        gap = self.settings.batch_gap_ms / 1000
        while len(lane.waiting) < self.settings.max_batch_size and not self.stopped:
            until = min(deadline, max(s.enqueued_at for s in lane.waiting) + gap) if gap else deadline
            remaining = until - time.monotonic()
            if remaining <= 0:
                break
            lane.wake.wait(remaining)

    def _admit(self, lane: Lane) -> list[QueuedSentence]:
        """Who joins the lane's batch now (``Admissions.decide``), taken out of their queues; a sentence taken
        from a replica's queue moves to this lane."""
        with self.lock:
            if lane.waiting and not lane.running:
                self._wait_for_batch(lane)
            admission = self.admissions.decide(lane, time.monotonic())
            self.apply(lane, admission)
        return admission.admitted

    def apply(self, lane: Lane, decision: Leaving | Admission | Pause) -> None:
        """On ``lane``'s thread: do what was decided for it (server/scheduling/decisions.py). An ``Admission`` is
        applied with the lock held, as it was decided (other lanes would otherwise take from the same queues and budget
        between); the others take the lock where they need it."""
        match decision:
            case Leaving():
                for job in decision.answered:
                    self._drop_rows(lane, job)
                for job, error in decision.ending:
                    self._end_job(job, error, lane)
            case Admission():
                self.admissions.apply(lane, decision)
            case Pause():
                lane.owe(decision)
                if decision.seconds:
                    time.sleep(decision.seconds)
                    self.metrics.lane_paused.labels(lane.model, lane.name).inc(decision.seconds)
                    lane.paused(time.perf_counter())

    def _leaving(self, lane: Lane) -> Leaving:
        with self.lock:
            jobs = {s.job for s in itertools.chain(lane.waiting, lane.running)}
        return leaving(jobs, time.monotonic())

    def _pause(self, lane: Lane, seconds: float) -> Pause:
        """After a step of ``seconds``: the pause the lane owes longer lanes (``--long-lane-share``)."""
        return self.fairness.pause(lane, self.lanes, seconds, time.perf_counter())

    def _has_work_elsewhere(self, lane: Lane) -> bool:
        """Whether an idle lane may take sentences queued for its replicas."""
        return any(self.admissions.stealable(lane))

    def _encode_and_join(self, lane: Lane, admitted: list[QueuedSentence]) -> None:
        """Encode the admitted segments in length groups, add them to the lane's batch, free the encoders' memory."""
        started, now = time.perf_counter(), time.monotonic()
        admitted.sort(key=lambda s: s.source_tokens)
        for segment in admitted:
            segment.joined_at = now
            self.metrics.queue_wait.observe(now - segment.enqueued_at)
            lane.join(segment)
        try:
            for group in length_groups(admitted):
                self._add(lane, group, lane.engine.encode([s.spec.ids for s in group]))
        finally:
            with self.lock:
                self.admissions.encoded(lane, admitted)
        lane.joined(time.perf_counter() - started)

    def _add(self, lane: Lane, group: list[QueuedSentence], encoded: Encoded) -> None:
        """An encoded group joins the batch (one that left meanwhile leaves again at once); its encoder's metrics."""
        joined = lane.batch.add(group, encoded, [s.job.options.beam for s in group], [s.max_length for s in group])
        now = time.monotonic()
        for index, segment in enumerate(group):
            segment.encoded_at = now
            if segment.spec.align:  # the aligner reads its encoder's output instead of encoding it again
                segment.kept = encoded.source(index)
            if segment not in lane.running:
                lane.batch.remove(segment)
        longest = max(s.source_tokens for s in group)
        scores = self.engines[lane.model].memory.encoder_scores_bytes(len(group), longest)
        self.metrics.observe_encoder_batch(
            len(group), longest, joined.seconds, joined.padded_tokens, joined.real_tokens, scores
        )

    def _step(self, lane: Lane) -> float:
        """One decoder step of the lane's batch; finished segments are answered at once."""
        start = time.perf_counter()
        rows, finished = lane.step()
        seconds = time.perf_counter() - start
        self.metrics.decoder_step.labels(lane.model).observe(seconds)
        self.metrics.decode_rows.observe(rows)
        for segment, hypothesis in finished:
            self._finish(segment, hypothesis)
        return seconds

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
            if not lane.leave(segment):
                return
            self.memory.release(segment.reserved_bytes)
            wake_blocked(self.lanes)  # a lane waiting for room may now have it

    def _end_job(self, job: Job, error: ServiceError, lane: Lane) -> None:
        """On ``lane``'s thread: answer a job with an error and take its segments out of every queue and of
        this lane's batch (a lane that took some of them drops its own at its next step: ``Leaving.answered``)."""
        with self.lock:
            if job.finished:
                return
            for segment in job.segments:  # a queued segment waits in the lane it names
                queue = self.lanes[segment.lane].waiting
                if segment in queue:
                    queue.remove(segment)
            self.admissions.forget(job)
            job.fail(error)
        self._drop_rows(lane, job)

    def _drop_rows(self, lane: Lane, job: Job) -> None:
        """On ``lane``'s thread: the job's segments leave its batch."""
        for segment in job.segments:
            if segment in lane.running:
                lane.batch.remove(segment)
                self._leave(segment)

    def _fail_batch(self, lane: Lane, error: ServiceError) -> None:
        """Answer every job in the lane's batch (admitted segments count from the start of their join) with
        error; start afresh."""
        lane.restart()
        with self.lock:
            dropped = lane.leave_all()
            self.memory.release(sum(s.reserved_bytes for s in dropped))
        for job in {s.job: None for s in dropped}:  # in the order they joined
            self._end_job(job, error, lane)

    def _update_gauges(self, lane: Lane) -> None:
        """The queue and batch gauges after a step of ``lane``; the cache sizes, which cost a walk over every
        buffer, at most every GAUGE_INTERVAL_S while lanes are busy (a step takes about a millisecond)."""
        now = time.monotonic()
        if walk := now - self.gauges_at >= GAUGE_INTERVAL_S or not lane.running:
            self.gauges_at = now
        self.metrics.set_gauges(lane, self.lanes, self.waiting, self.running, self.memory.reserved_bytes, walk)
