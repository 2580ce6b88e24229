"""Lanes: shares of the running work, each with its queue, running batch and inference thread, and the OS priority
of that thread (the scheduler's policies decide what joins a lane's batch; server/scheduling/threads.py how many lanes
of each size run and on how many threads).

A model's lanes go by the size of the requests they take (``--lanes``); each size has replicas, all on the model's
engine, whose sessions take concurrent runs: a request's sentences spread over them (``spread``)."""

from __future__ import annotations

import collections
import itertools
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from server.interface import Batch, Engine
from server.scheduling.decisions import Pause
from server.scheduling.fairness import LongerLanes
from server.scheduling.threads import lower_thread_priority, name_thread

if TYPE_CHECKING:
    from server.scheduling.jobs import QueuedSentence

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
    engine: Engine | None = None  # the model's: it makes, encodes for and steps the lane's batch
    batch: Batch | None = None
    # notified when it may have work: its arrivals, a stop, room others freed (the scheduler makes it on its lock)
    wake: threading.Condition | None = None
    blocked: bool = False  # its arrivals wait for room that other lanes hold
    stepped: bool = False  # it stepped since it last gave free memory back (an idle lane does, once)
    thread: threading.Thread | None = None
    ready: threading.Event = field(default_factory=threading.Event)
    error: BaseException | None = None
    join_seconds: float = 0.0  # a join's duration, a running average
    owed_seconds: float = 0.0  # the pause it owes longer lanes (server/scheduling/fairness.py)
    off_cpu_since: float = 0.0  # when its last step or pause ended (time.perf_counter())

    # --- its life, on its own thread: the scheduler calls these and assigns none of its fields ----------

    def attach(self, lock: threading.Lock) -> None:
        """Share the scheduler's ``lock``: the lane is woken on a condition of it, for work of its own."""
        self.wake = threading.Condition(lock)

    def start(self, run: Callable[[Lane], None]) -> None:
        """Run ``run(self)`` on an inference thread of its own."""
        self.thread = threading.Thread(target=run, args=(self,), name=f"inference-{self.name}", daemon=True)
        self.thread.start()

    def step(self) -> tuple[int, list]:
        """One decoder step of its batch: (the rows it stepped, the (segment, hypothesis) pairs it finished)."""
        rows, self.stepped = self.batch.rows, True
        return rows, self.batch.step()

    def gave_memory_back(self) -> None:
        """It returned its free memory to the system while idle: until it steps again it has none to give."""
        self.stepped = False

    def wait_for_room(self, seconds: float) -> None:
        """With the scheduler's lock held: wait up to ``seconds`` for room that other lanes hold (they wake a
        blocked lane when they free some)."""
        self.blocked = True
        self.wake.wait(seconds)
        self.blocked = False

    def restart(self) -> None:
        """Drop its batch (a step failed) for an empty one of the same engine; its caller answers those in it."""
        self.batch = self.engine.new_batch()

    def queue(self, segment: QueuedSentence) -> None:
        """With the scheduler's lock held: ``segment`` waits in this lane's queue, after those before it."""
        self.waiting.append(segment)

    def unqueue(self, segment: QueuedSentence) -> None:
        """With the scheduler's lock held: ``segment`` leaves this lane's queue (admitted here or by a replica)."""
        self.waiting.remove(segment)

    def join(self, segment: QueuedSentence) -> None:
        """With the scheduler's lock held: ``segment`` is in this lane's batch from its next step."""
        self.running[segment] = None

    def leave(self, segment: QueuedSentence) -> bool:
        """With the scheduler's lock held: ``segment`` is out of its batch; False when it was not in it."""
        return self.running.pop(segment, False) is None

    def leave_all(self) -> list[QueuedSentence]:
        """With the scheduler's lock held: every segment is out of its batch (a step failed); returns them."""
        segments = list(self.running)
        self.running.clear()
        return segments

    def joined(self, seconds: float) -> None:
        self.join_seconds = (1 - JOIN_WEIGHT) * self.join_seconds + JOIN_WEIGHT * seconds

    def overflow(self, room: int) -> Iterator[QueuedSentence]:
        """Its waiting sentences beyond the room its batch has (``room`` sentences in all): what a replica that
        runs out of work may take."""
        return itertools.islice(self.waiting, max(0, room - len(self.running)), None)

    # --- pauses: the share of its core that it leaves to longer lanes (server/scheduling/fairness.py) -----

    def owe(self, pause: Pause) -> None:
        """It owes ``pause.owed_seconds``, counted from ``pause.at``."""
        self.owed_seconds, self.off_cpu_since = pause.owed_seconds, pause.at

    def paused(self, until: float) -> None:
        """It paid what it owed, off the CPU until ``until`` (time.perf_counter())."""
        self.owed_seconds, self.off_cpu_since = 0.0, until

    def load(self, model: Engine) -> None:
        """Take the ``model``'s engine and an empty batch of it (``open`` does, on the lane's thread)."""
        self.engine, self.batch = model, model.new_batch()

    def open(self, model: Engine) -> None:
        """On the lane's own thread: name it for the OS (``top -H`` and /proc show it), lower its priority (ONNX
        Runtime runs the lane's steps on it), and start an empty batch of the ``model``'s engine. ``ready`` is
        set in any case; ``error`` says why the lane could not start."""
        try:
            name_thread(f"lane{self.index} {self.name}")
            lower_thread_priority(self.niceness)
            self.load(model)
        except Exception as error:
            self.error = error
            raise
        finally:
            self.ready.set()


def model_lanes(replicas: Mapping[str, int], bounds: Sequence[int], fairness: LongerLanes) -> dict[str, list[Lane]]:
    """Each model's lanes (``replicas``: each model's running batches per size), shortest first, numbered across
    models: each size has that many lanes (named "1-64/0", "1-64/1"... when more than one), each further size at
    a lower OS priority than the size before (``fairness.niceness``)."""
    lanes: dict[str, list[Lane]] = {}
    index = itertools.count()
    for model, count in replicas.items():
        lanes[model] = []
        for size, name in enumerate(lane_names(bounds)):
            for r in range(count):
                lane_name = name if count == 1 else f"{name}/{r}"
                lanes[model].append(Lane(next(index), lane_name, model, fairness.niceness(size), size))
    return lanes


def size_class(bounds: Sequence[int], request_tokens: int) -> int:
    """Which lane size takes a request of ``request_tokens`` source tokens in all: lanes go by the size of the
    whole request (the sentences of a long document are long work)."""
    return next((i for i, bound in enumerate(bounds) if request_tokens <= bound), len(bounds))


def spread(replicas: Sequence[Lane], sentences: int) -> list[int]:
    """The lane index of each of a request's ``sentences`` among a size's ``replicas``: each to the least loaded
    (sentences waiting and running, read without the scheduler's lock: a choice, not a count), counting those
    placed before it, so a document's sentences decode on every core."""
    loads = {lane.index: len(lane.waiting) + len(lane.running) for lane in replicas}
    chosen = []
    for _ in range(sentences):
        index = min(loads, key=loads.__getitem__)
        loads[index] += 1
        chosen.append(index)
    return chosen


def lane_names(bounds: Sequence[int]) -> list[str]:
    """Lanes named by the source tokens of the requests they take: bounds 64 give "1-64" and "65+"."""
    lows = [1] + [bound + 1 for bound in bounds]
    return [f"{low}-{high}" for low, high in zip(lows[:-1], bounds, strict=True)] + [f"{lows[-1]}+"]


def wake_blocked(lanes: Sequence[Lane]) -> None:
    """With the scheduler's lock held: wake the lanes waiting for room (some was freed)."""
    for lane in lanes:
        if lane.blocked:
            lane.wake.notify()
