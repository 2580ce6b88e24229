"""How longer lanes keep moving beside shorter ones, in one policy (``LongerLanes``, continuous scheduling).

A longer lane's thread runs at a lower OS priority (``niceness``: ``--lane-niceness`` per size above the first),
so a single sentence preempts a document's steps. The OS would then starve a longer lane for every busier lane of
higher priority, so a shorter lane that steps while a longer one decodes owes it a pause (``pause``:
``--long-lane-share`` of its core), paid once the debt reaches PAUSE_AT_LEAST_SECONDS. The three were measured
against each other (docs/benchmarks.md, "The three mechanisms that let longer lanes move").
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from server.scheduling.decisions import Pause

if TYPE_CHECKING:
    from server.scheduling.lanes import Lane

# A lane pays the pause it owes longer lanes once the debt reaches this, so that it sleeps in pieces of a few
# steps rather than after every step.
PAUSE_AT_LEAST_SECONDS = 0.005


def pause_owed(owed: float, idle: float, busy: float, share: float) -> float:
    """The pause a lane owes longer lanes while they decode, after a step of ``busy`` s that came ``idle`` seconds
    after its last one (or its last pause) ended. Longer lanes run at a lower OS priority, so a shorter lane that
    never leaves the CPU starves them; each busy second of it owes them share / (1 - share) seconds, which time it
    spent off the CPU anyway pays back. So when it is saturated, longer lanes keep ``share`` of its core, and when
    it idles, nothing changes."""
    return max(0.0, owed - idle) + busy * share / (1.0 - share)


@dataclass(frozen=True)
class LongerLanes:
    niceness_step: int  # --lane-niceness: OS niceness added per lane size above the first (0..19)
    share: float  # --long-lane-share: the share of a shorter lane's core left to longer lanes that decode

    def niceness(self, size_class: int) -> int:
        """The OS niceness added to the threads of a lane of this size (0: the shortest)."""
        return self.niceness_step * size_class

    def pause(self, lane: Lane, lanes: Sequence[Lane], busy: float, now: float) -> Pause:
        """After ``lane``'s step of ``busy`` seconds that ended at ``now`` (time.perf_counter()): while a lane at a
        lower OS priority decodes (any model's: the OS starves a long lane for every busier lane of higher
        priority), what ``lane`` owes it for ``share`` of its core, paid once it reaches PAUSE_AT_LEAST_SECONDS;
        otherwise it owes nothing. Reads ``lane`` and ``lanes`` without changing them."""
        longer = self.share > 0 and any(other.running for other in lanes if other.niceness > lane.niceness)
        idle = max(0.0, now - busy - lane.off_cpu_since)
        owed = pause_owed(lane.owed_seconds, idle, busy, self.share) if longer else 0.0
        return Pause(owed, owed if owed >= PAUSE_AT_LEAST_SECONDS else 0.0, now)
