"""Lanes: shares of the running work, each with its queue, running batch, engine and inference thread,
and the OS priority of that thread (the scheduler's policies decide what joins a lane's batch)."""

from __future__ import annotations

import collections
import concurrent.futures
import contextlib
import ctypes
import itertools
import logging
import os
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from server.interface import Batch, Encoded, Engine

if TYPE_CHECKING:
    from server.config import ServerConfig
    from server.jobs import QueuedSentence

log = logging.getLogger(__name__)
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
    engine: Engine | None = None
    batch: Batch | None = None
    thread: threading.Thread | None = None
    ready: threading.Event = field(default_factory=threading.Event)
    error: BaseException | None = None
    join_seconds: float = 0.0  # a join's duration, a running average
    owed_seconds: float = 0.0  # the pause it owes longer lanes (policies.pause_owed)
    off_cpu_since: float = 0.0  # when its last step or pause ended (time.perf_counter())
    encoder: concurrent.futures.ThreadPoolExecutor | None = None  # the lane's encoder thread, if it encodes apart
    # groups of admitted segments being encoded on it, oldest first, with their futures (``Encoded``)
    encoding: collections.deque[tuple[list[QueuedSentence], concurrent.futures.Future]] = field(
        default_factory=collections.deque
    )

    def joined(self, seconds: float) -> None:
        self.join_seconds = (1 - JOIN_WEIGHT) * self.join_seconds + JOIN_WEIGHT * seconds

    def encode_apart(self, group: list[QueuedSentence]) -> None:
        """Encode the group on the lane's encoder thread, for ``encoded``."""
        self.encoding.append((group, self.encoder.submit(self.batch.encode, [s.spec.ids for s in group])))

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

    def open(self, replica: Callable[[], Engine], warmup: bool, encode_apart: bool = False) -> None:
        """On the lane's own thread: name it for the OS (``top -H`` and /proc show it; threads it starts,
        such as ONNX Runtime's, inherit the name), lower its priority, then load the lane's engine (a replica
        of the model's, unless it has one), so that ONNX Runtime's threads inherit the priority, and start an
        empty batch; with ``encode_apart``, an encoder thread (started on first use by this thread, so it
        inherits the priority; named "enc" and the lane's number for the OS).
        (The first lane runs on the server's engine, which on CPU steps small batches on fewer threads.)
        ``ready`` is set in any case; ``error`` says why the lane could not start."""
        try:
            name_thread(f"lane{self.index} {self.name}")
            lower_thread_priority(self.niceness)
            if self.engine is None:
                self.engine = replica()
                if warmup:
                    self.engine.warmup()
            self.batch = self.engine.new_batch()
            if encode_apart:
                name = f"enc{self.index} {self.name}"
                self.encoder = concurrent.futures.ThreadPoolExecutor(1, name, name_thread, (name,))
        except Exception as error:
            self.error = error
            raise
        finally:
            self.ready.set()


@dataclass(frozen=True)
class ThreadPlan:
    """Every lane's ONNX Runtime threads, decided here and nowhere else (``plan_threads``)."""

    first_lane: int  # intra-op threads of the model's own sessions, which the first lane runs on (0: one per core)
    first_lane_small_batches: int | None  # its batches under SMALL_BATCH_ROWS rows (None: on the same sessions)
    other_lanes: int  # each longer lane's own sessions
    encode_apart: bool  # the first lane's replicas encode arrivals on a thread of their own while they step
    # each longer lane's narrow sessions, which it runs on while another lane has rows (None: it has none)
    other_lanes_narrow: int | None = None


def plan_threads(config: ServerConfig) -> ThreadPlan:
    """The threads of every lane, from the server's settings. The first lane encodes apart when it may
    (continuous, CPU); it then decodes on each replica's share of the intra-op threads (of the cores when 0)
    less its encoder thread. Its small batches step on first_lane_small_batch_threads when the continuous
    scheduler splits work into lanes (a lone lane's few rows are long sequences, which want every thread).
    Longer lanes load their own sessions on intra_op_threads, and on the CPU narrow ones on half the cores
    (at least one), which they run on while another lane has rows: with a longer lane's runs on every core
    beside a shorter lane's, the server spent 1.08-1.12x static batching's CPU on the same requests, and with
    them on half the cores 0.97-1.02x (2 cores, beam 4, run-on sentences: benchmarks/scheduler_variants_narrow.md)."""
    apart = config.encode_apart and config.scheduler == "continuous" and config.provider != "cuda"
    first = config.intra_op_threads
    if apart:
        first = max(1, (config.intra_op_threads or len(os.sched_getaffinity(0))) // config.first_lane_replicas - 1)
    split = config.scheduler == "continuous" and bool(config.lanes)
    small = (config.first_lane_small_batch_threads or None) if split else None
    narrow = None
    if split and config.provider != "cuda":
        narrow = max(1, (config.intra_op_threads or len(os.sched_getaffinity(0))) // 2)
        narrow = None if narrow == config.intra_op_threads else narrow
    return ThreadPlan(first, small, config.intra_op_threads, apart, narrow)


def model_lanes(
    engines: Mapping[str, Engine], bounds: Sequence[int], niceness: int, first_replicas: int = 1
) -> dict[str, list[Lane]]:
    """Each model's lanes, shortest first, numbered across models. The first size has ``first_replicas``
    lanes (named "1-64/0", "1-64/1"… when more than one), all on the model's engine: its sessions serve
    concurrent batches, each with its own caches. Each further size has one lane that loads its own
    sessions, at ``niceness`` lower priority than the size before."""
    lanes: dict[str, list[Lane]] = {}
    index = itertools.count()
    for model, engine in engines.items():
        lanes[model] = []
        for size, name in enumerate(lane_names(bounds)):
            replicas = first_replicas if size == 0 else 1
            for r in range(replicas):
                lane = Lane(next(index), name if replicas == 1 else f"{name}/{r}", model, niceness * size, size)
                lane.engine = engine if size == 0 else None
                lanes[model].append(lane)
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


PR_SET_NAME = 15  # Linux prctl: the calling thread's name, 15 bytes at most


def name_thread(name: str) -> None:
    """Give the calling thread an OS name (Linux; elsewhere nothing happens)."""
    with contextlib.suppress(AttributeError, OSError):
        ctypes.CDLL(None).prctl(PR_SET_NAME, name.encode()[:15], 0, 0, 0)


def lower_thread_priority(niceness: int) -> None:
    """Add ``niceness`` to the calling thread's (Linux: per thread; threads it starts inherit it)."""
    if niceness <= 0:
        return
    try:
        thread = threading.get_native_id()
        os.setpriority(os.PRIO_PROCESS, thread, os.getpriority(os.PRIO_PROCESS, thread) + niceness)
    except (AttributeError, OSError) as error:
        log.warning("could not lower a lane's thread priority (%s); lanes share the CPU equally", error)
