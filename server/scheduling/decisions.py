"""What a lane does at a step, as plain values: who leaves it (``Leaving``), who joins its batch
(``Admission``) and whether it pauses after its step (``Pause``). Each is decided from the lanes' state
without changing it (``leaving``, ``Admissions.decide`` in server/scheduling/admission.py, ``LongerLanes.pause``
in server/scheduling/fairness.py) and applied in one call (``Scheduler.apply``), so that what the scheduler
decides is tested without threads."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from server.errors import Cancelled, DeadlineExceeded, ServiceError

if TYPE_CHECKING:
    from server.scheduling.jobs import Job, QueuedSentence


@dataclass(frozen=True)
class Leaving:
    """The jobs whose sentences leave a lane (its queue and its batch) at a step."""

    answered: tuple[Job, ...] = ()  # already answered (with an error, on another lane's thread): only rows leave
    ending: tuple[tuple[Job, ServiceError], ...] = ()  # answered with the error now (cancelled, or too late)


def leaving(jobs: Iterable[Job], now: float) -> Leaving:
    """Of the jobs with sentences in a lane, those that leave it at ``now`` (time.monotonic())."""
    answered, ending = [], []
    for job in jobs:
        if job.finished:
            answered.append(job)
        elif job.cancelled:
            ending.append((job, Cancelled("the request was cancelled")))
        elif job.deadline is not None and now > job.deadline:
            ending.append((job, DeadlineExceeded("the deadline passed before the translation finished")))
    return Leaving(tuple(answered), tuple(ending))


@dataclass(frozen=True)
class Admission:
    """The queued sentences that join a lane's batch at a step (its own arrivals, or those its replicas have no
    room for), and the policy's starving sentence after it."""

    joining: tuple[QueuedSentence, ...] = ()
    starving: QueuedSentence | None = None  # waited too long for room: other lanes admit nobody (policies.py)

    @property
    def admitted(self) -> list[QueuedSentence]:
        return list(self.joining)


@dataclass(frozen=True)
class Pause:
    """After a lane's step: what it owes longer lanes (fairness.pause_owed) and the pause it takes now."""

    owed_seconds: float
    seconds: float  # 0: none now (it owes nothing, or less than PAUSE_AT_LEAST_SECONDS)
    at: float  # when the step ended (time.perf_counter())
