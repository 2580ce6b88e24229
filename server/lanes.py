"""Lanes: shares of the running work, each with its queue, running batch, engines and inference thread,
and the OS priority of that thread (the scheduler's policies decide what joins a lane's batch; server/threads.py
what its engines run on)."""

from __future__ import annotations

import collections
import concurrent.futures
import itertools
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from server.decisions import Pause
from server.interface import Batch, Encoded, Engine
from server.policies import PAUSE_AT_LEAST_SECONDS, pause_owed
from server.threads import LaneThreads, lower_thread_priority, name_thread

if TYPE_CHECKING:
    from server.jobs import QueuedSentence

# A lane's join duration (encoder call and cache resizes) is a running average with this weight.
JOIN_WEIGHT = 0.1


@dataclass(eq=False)
class Lane:
    index: int
    name: str  # by its source-token bounds, e.g. "1-64"
    model: str  # the name of the engine whose work it runs
    niceness: int  # added to the thread's OS niceness (Linux), for it and its ONNX Runtime threads
    size_class: int = 0  # which of the model's source-token bounds it takes (its replicas share it)
    waiting: collections.deque[QueuedSentence] = field(default_factory=collections.deque)
    running: dict[QueuedSentence, None] = field(default_factory=dict)  # segments in the batch, in join order
    engine: Engine | None = None  # makes its batch, and encodes and steps it but while it runs on ``narrow``
    narrow: Engine | None = None  # a replica on fewer threads, which it runs on while another lane has rows
    batch: Batch | None = None
    thread: threading.Thread | None = None
    ready: threading.Event = field(default_factory=threading.Event)
    error: BaseException | None = None
    join_seconds: float = 0.0  # a join's duration, a running average
    owed_seconds: float = 0.0  # the pause it owes longer lanes (``pause_after``)
    off_cpu_since: float = 0.0  # when its last step or pause ended (time.perf_counter())
    encoder: concurrent.futures.ThreadPoolExecutor | None = None  # the lane's encoder thread, if it encodes apart
    # groups of admitted segments being encoded on it, oldest first, with their futures (``Encoded``)
    encoding: collections.deque[tuple[list[QueuedSentence], concurrent.futures.Future]] = field(
        default_factory=collections.deque
    )

    def joined(self, seconds: float) -> None:
        self.join_seconds = (1 - JOIN_WEIGHT) * self.join_seconds + JOIN_WEIGHT * seconds

    # --- backlog: sentences that move between a model's lanes --------------------------

    def own_rows(self) -> int:
        """The rows of its batch that are its own arrivals', not the backlog's it took from longer lanes."""
        return max(0, self.batch.rows - sum(s.job.options.beam for s in self.running if s.moved))

    def overflow(self, room: int) -> Iterator[QueuedSentence]:
        """Its waiting sentences beyond the room its batch has (``room`` sentences in all): what a shorter lane
        may take."""
        return itertools.islice(self.waiting, max(0, room - len(self.running)), None)

    def backlog_room(self, share: int, admitted: Sequence[QueuedSentence] = ()) -> int:
        """How many sentences of longer lanes' backlog it may still take: ``share`` in all, besides those
        running and ``admitted``."""
        return max(0, share - len(self.running) - len(admitted))

    # --- pauses: the share of its core that it leaves to longer lanes -------------------

    def pause_after(self, busy: float, now: float, share: float, long_work: bool) -> Pause:
        """After a step of ``busy`` seconds that ended at ``now`` (time.perf_counter()): while a longer lane (lower
        OS priority) decodes sentences too long to move into this lane (``long_work``), what this lane owes it
        for its ``share`` of the core (policies.pause_owed), paid once it reaches PAUSE_AT_LEAST_SECONDS;
        otherwise it owes nothing (a longer lane's short sentences that fall behind move down instead)."""
        idle = max(0.0, now - busy - self.off_cpu_since)
        owed = pause_owed(self.owed_seconds, idle, busy, share) if share and long_work else 0.0
        return Pause(owed, owed if owed >= PAUSE_AT_LEAST_SECONDS else 0.0, now)

    def owe(self, pause: Pause) -> None:
        self.owed_seconds, self.off_cpu_since = pause.owed_seconds, pause.at

    def paused(self, until: float) -> None:
        """It paid what it owed, off the CPU until ``until`` (time.perf_counter())."""
        self.owed_seconds, self.off_cpu_since = 0.0, until

    def encode_apart(self, group: list[QueuedSentence]) -> None:
        """Encode the group on the lane's encoder thread, for ``encoded``."""
        self.encoding.append((group, self.encoder.submit(self.engine.encode, [s.spec.ids for s in group])))

    def encoded(self, wait: bool) -> Iterator[tuple[list[QueuedSentence], Encoded]]:
        """Groups whose encoder call has returned, oldest first (``wait``: every group, waiting for each); an
        encoder error is raised here, on the lane's thread."""
        while self.encoding and (wait or self.encoding[0][1].done()):
            group, future = self.encoding.popleft()
            yield group, future.result()

    def encodes(self, segment: QueuedSentence) -> bool:
        """Whether the segment is being encoded apart (admitted, not yet in the batch)."""
        return any(segment in group for group, _ in self.encoding)

    def close(self) -> None:
        """The lane's thread is done: its encoder thread ends."""
        if self.encoder is not None:
            self.encoder.shutdown(wait=False, cancel_futures=True)

    def on(self, crowded: bool) -> Engine | None:
        """The engine the lane encodes and steps on besides its own: its narrow replica while ``crowded``
        (another lane has rows), if it has one; None: its own."""
        return self.narrow if crowded else None

    def open(self, model: Engine, threads: LaneThreads, warmup: bool) -> None:
        """On the lane's own thread: name it for the OS (``top -H`` and /proc show it; threads it starts,
        such as ONNX Runtime's, inherit the name), lower its priority, then load the lane's engines as
        ``threads`` says (replicas of the ``model``'s engine, warmed up, or that engine itself), so that ONNX
        Runtime's threads inherit the priority, and start an empty batch; with ``threads.encode_apart``, an
        encoder thread (started on first use by this thread, so it inherits the priority; named "enc" and the
        lane's number for the OS). (The first lane runs on the model's engine, which on CPU steps small batches
        on fewer threads.) ``ready`` is set in any case; ``error`` says why the lane could not start."""
        try:
            name_thread(f"lane{self.index} {self.name}")
            lower_thread_priority(self.niceness)
            self.engine = model if threads.own is None else model.replica(threads.own)
            self.narrow = None if threads.narrow is None else model.replica(threads.narrow)
            if warmup:
                for replica in (self.engine, self.narrow):
                    if replica not in (None, model):
                        replica.warmup()
            self.batch = self.engine.new_batch()
            if threads.encode_apart:
                name = f"enc{self.index} {self.name}"
                self.encoder = concurrent.futures.ThreadPoolExecutor(1, name, name_thread, (name,))
        except Exception as error:
            self.error = error
            raise
        finally:
            self.ready.set()


def model_lanes(
    models: Sequence[str], bounds: Sequence[int], niceness: int, first_replicas: int = 1
) -> dict[str, list[Lane]]:
    """Each model's lanes, shortest first, numbered across models. The first size has ``first_replicas``
    lanes (named "1-64/0", "1-64/1"… when more than one), all on the model's engine: its sessions serve
    concurrent batches, each with its own caches. Each further size has one lane that loads its own
    sessions, at ``niceness`` lower priority than the size before."""
    lanes: dict[str, list[Lane]] = {}
    index = itertools.count()
    for model in models:
        lanes[model] = []
        for size, name in enumerate(lane_names(bounds)):
            replicas = first_replicas if size == 0 else 1
            for r in range(replicas):
                lane_name = name if replicas == 1 else f"{name}/{r}"
                lanes[model].append(Lane(next(index), lane_name, model, niceness * size, size))
    return lanes


def choose_lane(lanes: Sequence[Lane], bounds: Sequence[int], request_tokens: int) -> int:
    """The index of a model's lane (of ``lanes``) for a request: lanes go by the size of the whole request
    (the sentences of a long document are long work), then to the least loaded of that size's replicas (read
    without the scheduler's lock: a choice, not a count)."""
    size = next((i for i, bound in enumerate(bounds) if request_tokens <= bound), len(bounds))
    replicas = [lane for lane in lanes if lane.size_class == size]
    return min(replicas, key=lambda lane: len(lane.waiting) + len(lane.running)).index


def lane_names(bounds: Sequence[int]) -> list[str]:
    """Lanes named by the source tokens of the requests they take: bounds 64 give "1-64" and "65+"."""
    lows = [1] + [bound + 1 for bound in bounds]
    return [f"{low}-{high}" for low, high in zip(lows[:-1], bounds, strict=True)] + [f"{lows[-1]}+"]
