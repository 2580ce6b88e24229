"""Admission (``Admissions``): which lane a request's sentences queue in, each with the memory it reserves
(or the request is refused at once), and who joins a lane's batch at a step: the lane's arrivals that the
policy (server/policies.py) lets join now and that fit its batch limits and the memory budget shared by all
lanes of all models, and, continuous, the longer lanes' backlog that fits in the room left. A step's is
decided under the scheduler's lock as an ``Admission`` (server/decisions.py), which is applied at once."""

from __future__ import annotations

import functools
import itertools
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING

from server.budget import MemoryBudget
from server.decisions import Admission
from server.errors import Overloaded
from server.interface import Engine
from server.jobs import QueuedSentence
from server.lanes import Lane, choose_lane
from server.metrics import Metrics
from server.policies import BACKLOG_AFTER_SECONDS, BACKLOG_SHARE, Policy, Starving

if TYPE_CHECKING:
    from server.config import SchedulerSettings
    from server.jobs import Job


class Admissions:
    """Where sentences queue and what joins each lane's batch (the latter under the scheduler's lock), and the
    sentence that starves meanwhile."""

    def __init__(
        self,
        settings: SchedulerSettings,
        policy: Policy,
        memory: MemoryBudget,
        lanes_of: Mapping[str, list[Lane]],
        metrics: Metrics,
    ) -> None:
        """``lanes_of``: each model's lanes, shortest first (``lanes.model_lanes``)."""
        self.max_batch_size, self.max_batch_tokens = settings.max_batch_size, settings.max_batch_tokens
        self.backlog_share = int(BACKLOG_SHARE * settings.max_batch_size)
        self.policy, self.memory, self.lanes_of, self.metrics = policy, memory, lanes_of, metrics
        self.lanes = [lane for lanes in lanes_of.values() for lane in lanes]
        self.bounds = settings.lanes if policy.splits_lanes else ()
        self.starving: Starving = None

    def segments(self, job: Job, engine: Engine) -> list[QueuedSentence]:
        """The job's sentences as they queue, in the lane the size of the whole request picks, each with its
        reservation; Overloaded when one would need more than the whole memory budget."""
        lane = choose_lane(self.lanes_of[job.model], self.bounds, sum(len(spec.ids) for spec in job.specs))
        segments = []
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
        return segments

    def decide(self, lane: Lane, now: float) -> Admission:
        """The lane's arrivals that join its batch now, and when they all do, the longer lanes' backlog that
        fits in the room left. Whether arrivals join now counts only the lane's own rows: the backlog it took
        is long work, which may wait a step for a join."""
        backlog = list(self.backlog(lane, now))
        unchanged = Admission(starving=self.starving)
        if not (lane.waiting or backlog):
            return unchanged
        arrivals = [*lane.waiting, *backlog]
        if lane.running and not self.policy.joins_now(arrivals, lane.own_rows(), lane.join_seconds, now):
            return unchanged
        fits = functools.partial(self.fits, lane)
        joining, starving = [], self.starving
        if lane.waiting:
            joining, starving = self.policy.choose(lane.waiting, fits, lane.index, starving, now)
        moving = []
        if backlog and len(joining) == len(lane.waiting):
            room = lane.backlog_room(self.backlog_share, joining)
            moving = self.policy.choose_backlog(backlog[:room], fits, joining, starving)
        return Admission(tuple(joining), tuple(moving), starving)

    def apply(self, lane: Lane, admission: Admission) -> None:
        """The admitted leave their queues for ``lane`` and reserve their memory; sentences taken from longer
        lanes' backlog are marked ``moved``."""
        self.starving = admission.starving
        for segment in admission.moving:
            segment.moved = True
        if admission.moving:
            self.metrics.backlog_moved.labels(lane.model, lane.name).inc(len(admission.moving))
        for segment in admission.admitted:
            self.lanes[segment.lane].waiting.remove(segment)
            segment.lane = lane.index
        self.memory.reserve(sum(s.reserved_bytes for s in admission.admitted))

    def forget(self, job: Job) -> None:
        """The job left (answered, failed or cancelled): none of its sentences starves any more."""
        if self.starving is not None and self.starving.job is job:
            self.starving = None

    def backlog(self, lane: Lane, now: float) -> Iterator[QueuedSentence]:
        """The sentences waiting in the model's longer lanes beyond the room their batches have (max_batch_size
        rows) for BACKLOG_AFTER_SECONDS or more, that are short enough for this lane, shortest lane's first and
        oldest first, at most the room this lane gives them (BACKLOG_SHARE of max_batch_size): work that would
        otherwise wait while this lane steps few rows."""
        if not self.policy.splits_lanes or lane.size_class >= len(self.bounds):
            return iter(())
        bound, aged = self.bounds[lane.size_class], now - BACKLOG_AFTER_SECONDS
        backlog = (
            segment
            for other in self.longer_lanes(lane)
            for segment in other.overflow(self.max_batch_size)
            if segment.source_tokens <= bound and segment.enqueued_at <= aged
        )
        return itertools.islice(backlog, lane.backlog_room(self.backlog_share))

    def backlog_wait(self, lane: Lane) -> float | None:
        """How long an idle lane may sleep: until a longer lane's waiting sentences may have become backlog,
        when it has any; else until notified."""
        waiting = any(other.waiting for other in self.longer_lanes(lane))
        return BACKLOG_AFTER_SECONDS if self.policy.splits_lanes and waiting else None

    def longer_lanes(self, lane: Lane) -> Iterator[Lane]:
        """The lanes of the lane's model that take longer requests than it does."""
        return (other for other in self.lanes_of[lane.model] if other.size_class > lane.size_class)

    def fits(self, lane: Lane, group: Sequence[QueuedSentence]) -> bool:
        """Room for the group: max_batch_size sentences in the lane, max_batch_tokens, the memory budget."""
        if len(lane.running) + len(group) > self.max_batch_size:
            return False
        longest = max(s.source_tokens + 1 for s in group)
        if len(group) * longest > self.max_batch_tokens and len(group) > 1:
            return False
        return self.memory.fits(lane.model, [s.reserved_bytes for s in group], longest - 1)
