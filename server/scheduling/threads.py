"""How the lanes use the cores (``plan_threads``, decided here and nowhere else): how many running batches each
lane size has and how many ONNX Runtime threads the sessions they share run on; and the OS name and priority of
a lane's own thread."""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING

from runtime.cpu import usable_cores

if TYPE_CHECKING:
    from server.config import ServerConfig

log = logging.getLogger(__name__)
PR_SET_NAME = 15  # Linux prctl: the calling thread's name, 15 bytes at most
# How long a thread holding the interpreter lock keeps it while another waits (Python's default is 5 ms). The
# event loop waits for it after every poll, behind the lanes' and the documents' Python: under a flood of long
# documents at 175 requests/s over HTTP (2-core x86-64, benchmarks/flood.py, 150 s, twice each, alternating),
# /health's p99 was 33 and 51 ms at 1 ms against 54 and 51 ms at 5 ms, its max 93 and 85 against 96 and 117.
GIL_SWITCH_INTERVAL_S = 0.001


@dataclass(frozen=True)
class ThreadPlan:
    """Every lane's share of the cores (``plan_threads``)."""

    session_threads: int  # intra-op threads of each model's sessions, which all its lanes share (0: ORT's choice)
    cpu_replicas: int  # running batches per lane size on the CPU, each on an inference thread of its own
    cuda_replicas: int  # the same on CUDA, where one batch fills the device and its host thread

    def replicas(self, provider: str) -> int:
        """Running batches per lane size of a model whose sessions run on ``provider`` (the engine's, resolved)."""
        return self.cuda_replicas if provider == "cuda" else self.cpu_replicas


def plan_threads(config: ServerConfig) -> ThreadPlan:
    """The lanes' share of the cores, from the server's settings. Continuous: each lane size has
    ``lane_replicas`` running batches (0: one per core on the CPU, one on CUDA), each on its own thread, all on
    the model's sessions, whose threads are ``intra_op_threads`` (0: the usable cores, a container's CPU limit
    included) divided among a size's replicas: one each by default. ONNX Runtime then runs every step on the
    thread that asks for it, so every lane's work keeps its thread's OS priority, and independent batches keep
    every core busy. On 2 cores, two one-thread batches of beam-4 sentences decoded 1.5-1.8x one batch on one
    thread, and one batch on two threads 1.5-1.6x: its second thread woke about 89 times a step and idled
    beside the event loop (../shared/design/idle_cores.md; benchmarks/every_core.md measures the server).
    Static: one batch, on ``intra_op_threads`` (0: ONNX Runtime's choice)."""
    engine, scheduling = config.engine, config.scheduling
    if scheduling.scheduler == "static":
        return ThreadPlan(engine.intra_op_threads, 1, 1)
    cores = engine.intra_op_threads or usable_cores()
    replicas = scheduling.lane_replicas or cores
    return ThreadPlan(max(1, cores // replicas), replicas, scheduling.lane_replicas or 1)


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
