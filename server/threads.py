"""The threads of the lanes: how many ONNX Runtime threads each lane's engines run on (``plan_threads``,
decided here and nowhere else), and the OS name and priority of a lane's own thread."""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from server.config import ServerConfig

log = logging.getLogger(__name__)
PR_SET_NAME = 15  # Linux prctl: the calling thread's name, 15 bytes at most


@dataclass(frozen=True)
class LaneThreads:
    """What one lane runs on (``ThreadPlan.for_lane``)."""

    own: int | None  # intra-op threads of the lane's own replica of the model's engine (None: it runs on that one)
    narrow: int | None  # those of its narrow replica, which it runs on while another lane has rows (None: none)
    encode_apart: bool  # it encodes arrivals on a thread of its own while its batch steps


@dataclass(frozen=True)
class ThreadPlan:
    """Every lane's ONNX Runtime threads, decided here and nowhere else (``plan_threads``)."""

    first_lane: int  # intra-op threads of the model's own sessions, which the first lane runs on (0: one per core)
    first_lane_small_batches: int | None  # its batches under SMALL_BATCH_ROWS rows (None: on the same sessions)
    other_lanes: int  # each longer lane's own replica
    encode_apart: bool  # the first lane's replicas encode arrivals on a thread of their own while they step
    # each longer lane's narrow replica, which it runs on while another lane has rows (None: it has none)
    other_lanes_narrow: int | None = None

    def for_lane(self, size_class: int, provider: str) -> LaneThreads:
        """The engines of a lane of this size class on a model whose sessions run on ``provider`` (the engine's,
        resolved): the first size runs on the model's engine, encoding apart on the CPU; a longer one loads its
        own replica, and on the CPU a narrow one."""
        if size_class == 0:
            return LaneThreads(None, None, self.encode_apart and provider == "cpu")
        return LaneThreads(self.other_lanes, self.other_lanes_narrow if provider == "cpu" else None, False)


def plan_threads(config: ServerConfig) -> ThreadPlan:
    """The threads of every lane, from the server's settings. The first lane encodes apart when it may
    (continuous, CPU); it then decodes on each replica's share of the intra-op threads (of the cores when 0)
    less its encoder thread. Its small batches step on first_lane_small_batch_threads when the continuous
    scheduler splits work into lanes (a lone lane's few rows are long sequences, which want every thread).
    Longer lanes load their own replica on intra_op_threads, and on the CPU a narrow one on half the cores
    (at least one), which they run on while another lane has rows: with a longer lane's runs on every core
    beside a shorter lane's, the server spent 1.08-1.12x static batching's CPU on the same requests, and with
    them on half the cores 0.97-1.02x (2 cores, beam 4, run-on sentences: benchmarks/scheduler_variants_narrow.md)."""
    engine, scheduling = config.engine, config.scheduling
    threads, continuous = engine.intra_op_threads, scheduling.scheduler == "continuous"
    apart = scheduling.encode_apart and continuous and engine.provider != "cuda"
    first = threads
    if apart:
        first = max(1, (threads or len(os.sched_getaffinity(0))) // scheduling.first_lane_replicas - 1)
    split = continuous and bool(scheduling.lanes)
    small = (scheduling.first_lane_small_batch_threads or None) if split else None
    narrow = None
    if split and engine.provider != "cuda":
        narrow = max(1, (threads or len(os.sched_getaffinity(0))) // 2)
        narrow = None if narrow == threads else narrow
    return ThreadPlan(first, small, threads, apart, narrow)


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
