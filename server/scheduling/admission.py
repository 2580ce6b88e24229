"""Admission (``Admissions``): which lanes a request's sentences queue in, each with the memory it reserves
(or the request is refused at once), and who joins a lane's batch at a step: the lane's arrivals that the
policy (server/scheduling/policies.py) lets join now and that fit its batch limits and the memory budget shared by all
lanes of all models (continuous: when it has none, those its replicas have no room for). A step's is decided
under the scheduler's lock as an ``Admission`` (server/scheduling/decisions.py), which is applied at once."""

from __future__ import annotations

import functools
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING

from server.errors import Overloaded
from server.interface import Engine
from server.operations.metrics import Metrics
from server.scheduling.budget import MemoryBudget
from server.scheduling.decisions import Admission
from server.scheduling.jobs import QueuedSentence
from server.scheduling.lanes import Lane, size_class, spread, wake_blocked
from server.scheduling.policies import Policy, Starving

if TYPE_CHECKING:
    from server.config import SchedulerSettings
    from server.scheduling.jobs import Job


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
        self.policy, self.memory, self.lanes_of, self.metrics = policy, memory, lanes_of, metrics
        self.lanes = [lane for lanes in lanes_of.values() for lane in lanes]
        self.bounds = settings.lanes if policy.splits_lanes else ()
        self.starving: Starving = None

    def segments(self, job: Job, engine: Engine) -> list[QueuedSentence]:
        """The job's sentences as they queue, spread over the replicas of the lane size the whole request picks,
        each with its reservation; Overloaded when one would need more than the whole memory budget."""
        size = size_class(self.bounds, sum(len(spec.ids) for spec in job.specs))
        replicas = [lane for lane in self.lanes_of[job.model] if lane.size_class == size]
        segments = []
        for spec, lane in zip(job.specs, spread(replicas, len(job.specs)), strict=True):
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
        """The lane's arrivals (with none of its own, those its replicas have no room for) that join its batch
        now."""
        waiting = lane.waiting or list(self.stealable(lane))
        unchanged = Admission(starving=self.starving)
        if not waiting:
            return unchanged
        if lane.running and not self.policy.joins_now(waiting, lane.batch.rows, lane.join_seconds, now):
            return unchanged
        fits = functools.partial(self.fits, lane)
        joining, starving = self.policy.choose(waiting, fits, lane.index, self.starving, now)
        return Admission(tuple(joining), starving)

    def apply(self, lane: Lane, admission: Admission) -> None:
        """The admitted leave their queues (their lane's, or a replica's) for ``lane`` and reserve their memory,
        and their encoder call's until it ends (``encoded``)."""
        self.starving = admission.starving
        for segment in admission.admitted:
            self.lanes[segment.lane].unqueue(segment)
            segment.lane = lane.index
        encoding = self.memory.encoding_bytes(lane.model, [s.source_tokens for s in admission.admitted])
        self.memory.reserve(sum(s.reserved_bytes for s in admission.admitted) + encoding)

    def encoded(self, lane: Lane, admitted: Sequence[QueuedSentence]) -> None:
        """The admitted sentences' encoder call ended: its working memory returns to the budget, and a lane
        waiting for room may now have it."""
        self.memory.release(self.memory.encoding_bytes(lane.model, [s.source_tokens for s in admitted]))
        wake_blocked(self.lanes)

    def forget(self, job: Job) -> None:
        """The job left (answered, failed or cancelled): none of its sentences starves any more."""
        if self.starving is not None and self.starving.job is job:
            self.starving = None

    def stealable(self, lane: Lane) -> Iterator[QueuedSentence]:
        """continuous: the sentences waiting in the lane's replicas (its model's lanes of its size) beyond the room
        their batches have, oldest first, at most the room this lane's batch has: an idle core takes them instead
        of waiting beside a busy one."""
        if not self.policy.splits_lanes:
            return iter(())
        replicas = (other for other in self.lanes_of[lane.model] if other.size_class == lane.size_class)
        overflow = [s for other in replicas if other is not lane for s in other.overflow(self.max_batch_size)]
        overflow.sort(key=lambda s: s.enqueued_at)
        return iter(overflow[: max(0, self.max_batch_size - len(lane.running))])

    def fits(self, lane: Lane, group: Sequence[QueuedSentence]) -> bool:
        """Room for the group: max_batch_size sentences in the lane, max_batch_tokens, the memory budget."""
        if len(lane.running) + len(group) > self.max_batch_size:
            return False
        longest = max(s.source_tokens + 1 for s in group)
        if len(group) * longest > self.max_batch_tokens and len(group) > 1:
            return False
        return self.memory.fits(lane.model, [s.reserved_bytes for s in group], longest - 1)
