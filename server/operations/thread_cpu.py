"""The server's CPU time by thread kind, as a Prometheus counter: ``translate_thread_cpu_seconds_total{kind}``,
whose rate is the cores each kind keeps busy, so an operator sees idle capacity and where the busy time goes.
Read from /proc (Linux; elsewhere the family is empty).

Kinds, by the thread's OS name (server/scheduling/threads.py names the lanes'):
- ``front_door``: the main thread, the event loop of gRPC and HTTP (parsing, tokenizing, answering);
- ``lanes``: the inference threads, ``lane<N> <size>`` (encoding and decoding: ONNX Runtime runs a one-thread
  session's work on the thread that asks);
- ``grpc``: gRPC's own threads (its timer, event engine and lifeguard);
- ``other``: the rest (executor threads, language detection, ONNX Runtime pools of sessions on several threads).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector

KINDS = ("front_door", "lanes", "grpc", "other")
GRPC_THREADS = ("grpc_global_tim", "event_engine", "lifeguard")  # gRPC core's thread names (15 bytes at most)
TICKS_PER_SECOND = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def thread_kind(tid: int, name: str, pid: int) -> str:
    if tid == pid:
        return "front_door"
    if name.startswith("lane"):
        return "lanes"
    if name.startswith(GRPC_THREADS):
        return "grpc"
    return "other"


def thread_cpu_seconds(tasks: Path = Path("/proc/self/task"), pid: int | None = None) -> dict[str, float]:
    """CPU seconds (user and system) of this process's live threads, summed by kind. A thread that ended takes
    its time with it (the server's threads live as long as it does)."""
    pid = os.getpid() if pid is None else pid
    seconds = dict.fromkeys(KINDS, 0.0)
    for task in tasks.iterdir() if tasks.is_dir() else ():
        try:
            stat = (task / "stat").read_text()
        except OSError:  # the thread ended meanwhile
            continue
        name = stat[stat.index("(") + 1 : stat.rindex(")")]
        fields = stat[stat.rindex(")") + 2 :].split()  # from the state, field 3 of proc(5)
        utime, stime = int(fields[11]), int(fields[12])  # fields 14 and 15
        seconds[thread_kind(int(task.name), name, pid)] += (utime + stime) / TICKS_PER_SECOND
    return seconds


class ThreadCpuCollector(Collector):
    def collect(self) -> Iterator[CounterMetricFamily]:
        family = CounterMetricFamily(
            "translate_thread_cpu_seconds",
            "CPU time of the server's threads by kind: front_door (the event loop: gRPC, HTTP, tokenizing), lanes "
            "(encoding and decoding), grpc (gRPC's own threads), other; its rate is the cores each keeps busy.",
            labels=["kind"],
        )
        for kind, seconds in thread_cpu_seconds().items():
            family.add_metric([kind], seconds)
        yield family
