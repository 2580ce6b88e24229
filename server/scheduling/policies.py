"""Which waiting sentences join a lane's batch, and when: the two scheduling policies (``--scheduler``),
as pure functions of the queue, the time, the sentence that starves (if any) and a ``fits`` test (the budget
and batch limits; see server/scheduling/admission.py), each wrapped in a small stateless class that admission asks
without knowing which it has."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Optional, Protocol

from server.operations.metrics import LENGTH_CLASSES

if TYPE_CHECKING:
    from server.scheduling.jobs import QueuedSentence

# Sources of one length class pad each other little when encoded or decoded together (a batch pads to its
# longest): classes double, so a batch of one class pads at most about half of its tokens. The metrics label
# lengths by the same classes (server/operations/metrics.py, length_label).

# continuous: a sentence that waited this long for room other lanes hold stops them from admitting.
STARVATION_SECONDS = 1.0

Fits = Callable[[list["QueuedSentence"]], bool]
Starving = Optional["QueuedSentence"]  # waited STARVATION_SECONDS for room: other lanes admit nobody until it fits


def length_class(tokens: int) -> int:
    """The length class (LENGTH_CLASSES) of a source of this many tokens."""
    return next((i for i, high in enumerate(LENGTH_CLASSES) if tokens <= high), len(LENGTH_CLASSES))


def admit_static(waiting: Sequence[QueuedSentence], fits: Fits) -> list[QueuedSentence]:
    """static (into an empty batch only): the oldest sentence's length class first, then the nearest, as
    many as fit."""
    oldest = length_class(waiting[0].source_tokens)
    candidates = sorted(waiting, key=lambda s: (abs(length_class(s.source_tokens) - oldest), s.enqueued_at))
    admitted: list[QueuedSentence] = []
    for segment in candidates:
        if fits(admitted + [segment]):
            admitted.append(segment)
    return admitted


def admit_in_order(
    waiting: Sequence[QueuedSentence], fits: Fits, lane: int, starving: QueuedSentence | None, now: float
) -> tuple[list[QueuedSentence], QueuedSentence | None]:
    """continuous: first come, first served within the lane, while the arrivals fit. Returns them and the
    sentence that now starves (waited STARVATION_SECONDS for room, so that other lanes admit nobody until
    it fits), or None."""
    if starving is not None and starving.lane != lane:
        return [], starving
    admitted: list[QueuedSentence] = []
    for segment in waiting:
        if not fits(admitted + [segment]):
            if not admitted and now - segment.enqueued_at > STARVATION_SECONDS:
                starving = segment
            break
        admitted.append(segment)
    if starving is not None and starving in admitted:
        starving = None
    return admitted, starving


def join_later(waiting: Sequence[QueuedSentence], rows: int, join_seconds: float, now: float) -> bool:
    """Whether a busy lane's arrivals should gather a little longer before they join. A join (an encoder
    call, the caches resized) holds up every running row for about its measured duration, for one arrival
    as for ten; arrivals join once the time they have waited in all reaches the time the join costs the
    running rows in all. Alone or nearly, arrivals join at once; a busy lane takes them in batches."""
    return sum(now - s.enqueued_at for s in waiting) < rows * join_seconds


def length_groups(segments: Sequence[QueuedSentence]) -> list[list[QueuedSentence]]:
    """Segments sorted by length cut where the length class changes, so each encoder batch pads little."""
    groups: list[list[QueuedSentence]] = []
    for segment in segments:
        if groups and length_class(groups[-1][-1].source_tokens) == length_class(segment.source_tokens):
            groups[-1].append(segment)
        else:
            groups.append([segment])
    return groups


class Policy(Protocol):
    splits_lanes: bool  # whether requests go to lanes by size (--lanes), or all to one

    def joins_now(self, waiting: Sequence[QueuedSentence], rows: int, join_seconds: float, now: float) -> bool:
        """Whether a lane whose batch has ``rows`` running rows admits its waiting segments now."""

    def choose(
        self, waiting: Sequence[QueuedSentence], fits: Fits, lane: int, starving: Starving, now: float
    ) -> tuple[list[QueuedSentence], Starving]:
        """The waiting segments that join lane number ``lane``'s batch, and the sentence that starves after
        this choice (``starving``: the one before it)."""


class Static:
    """A batch is formed only when the previous one has fully finished."""

    splits_lanes = False

    def joins_now(self, waiting: Sequence[QueuedSentence], rows: int, join_seconds: float, now: float) -> bool:
        return rows == 0

    def choose(
        self, waiting: Sequence[QueuedSentence], fits: Fits, lane: int, starving: Starving, now: float
    ) -> tuple[list[QueuedSentence], Starving]:
        return admit_static(waiting, fits), None  # nobody starves: a batch takes what fits, then the rest


class Continuous:
    """Sources join and leave a running batch at every step; a sentence that starves holds other lanes back."""

    splits_lanes = True

    def joins_now(self, waiting: Sequence[QueuedSentence], rows: int, join_seconds: float, now: float) -> bool:
        return rows == 0 or not join_later(waiting, rows, join_seconds, now)

    def choose(
        self, waiting: Sequence[QueuedSentence], fits: Fits, lane: int, starving: Starving, now: float
    ) -> tuple[list[QueuedSentence], Starving]:
        return admit_in_order(waiting, fits, lane, starving, now)


POLICIES: dict[str, type[Static] | type[Continuous]] = {"static": Static, "continuous": Continuous}
