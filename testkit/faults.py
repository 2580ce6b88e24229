"""Replicas under load and the faults done to them, for tests/server/test_faults.py and
tests/server/test_netns_faults.py and for benchmarks/faults.py: the flags each replica runs with, and three
replicas and a client, each in its own network namespace (testkit/netns.py), the client (testkit/fault_client.py)
under closed-loop load while ``run_faults`` breaks one replica after another, with a report per fault."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from client.channel import KEEPALIVE_TIME_MS, KEEPALIVE_TIMEOUT_MS
from client.loadtest_report import percentile
from testkit import netns
from testkit.servers import start_subprocess_server

ROOT = Path(__file__).resolve().parents[1]
# Each replica: no lanes, one intra-op thread, a short drain and short outputs, no warm-up.
REPLICA_FLAGS = (
    "--lanes",
    "",
    "--intra-op-threads",
    "1",
    "--grace-seconds",
    "3",
    "--max-output-tokens",
    "16",
    "--warmup",
    "false",
)
PORT = 50051
REPLICAS = ("r1", "r2", "r3")
CLUSTER_FLAGS = (*REPLICA_FLAGS, "--port", str(PORT), "--language-detection", "off")
# The slowest call stuck on a silent replica: the connection's last answer may come just before the fault, so
# its keepalive ping goes out up to KEEPALIVE_TIME later and is given up on KEEPALIVE_TIMEOUT after that; the
# call's retry then waits its backoff (0.1 s) and is answered on another replica (the tiny model: well under a
# second on this loaded 2-core machine; 2 s allowed).
STUCK_BOUND_S = (KEEPALIVE_TIME_MS + KEEPALIVE_TIMEOUT_MS) / 1000 + 2.0


@dataclass(frozen=True)
class Durations:
    """Seconds each fault lasts; between faults, ``recover`` of steady load."""

    blackhole: float = 30.0
    flap_down: float = 5.0
    flap_up: float = 2.0
    freeze: float = 10.0
    recover: float = 5.0


@dataclass(frozen=True)
class Phase:
    name: str
    replica: str
    start: float  # when the fault began (time.monotonic)
    restored: float  # when it ended
    end: float  # when the next phase began


@dataclass(frozen=True)
class PhaseReport:
    name: str
    requests: int
    answered: int
    retried: int
    lost: int
    p50_s: float
    p99_s: float
    max_s: float
    stopped_after_s: float | None  # fault start to the last call the faulty replica's subchannel started

    def row(self) -> str:
        stopped = "still called" if self.stopped_after_s is None else f"{self.stopped_after_s:.1f} s"
        return (
            f"| {self.name} | {self.requests} | {self.answered} | {self.retried} | {self.lost} | {self.p50_s:.3f} "
            f"| {self.p99_s:.3f} | {self.max_s:.2f} | {stopped} |"
        )


TABLE_HEADER = (
    "| phase | requests | answered | retried | lost | p50 s | p99 s | max s | faulty replica's last call |\n"
    "|---|---|---|---|---|---|---|---|---|"
)


class Cluster:
    """Three replicas and a client host on one network; the client process is started by ``load``."""

    def __init__(self, model: Path) -> None:
        self.model, self.network = model, netns.Network()
        self.servers: dict[str, subprocess.Popen] = {}
        self.numbers = {name: 11 + k for k, name in enumerate(REPLICAS)}
        try:
            self.network.add("client", 10)
            for name in REPLICAS:
                self.network.add(name, self.numbers[name])
                self.start(name)
        except BaseException:
            self.close()
            raise

    def start(self, name: str) -> None:
        wrapper = self.network.command(name, [])
        address = self.network.hosts[name]
        self.servers[name] = start_subprocess_server(self.model, "--host", address, *CLUSTER_FLAGS, wrapper=wrapper)[0]

    @property
    def target(self) -> str:
        return "ipv4:" + ",".join(f"{self.network.hosts[name]}:{PORT}" for name in REPLICAS)

    def address(self, name: str) -> str:
        """The replica's address as channelz names its subchannel."""
        return f"ipv4:{netns.SUBNET}.{self.numbers[name]}:{PORT}"

    def restart_host(self, name: str) -> None:
        """The node vanishes (its namespace deleted under the running server), then comes back with the same
        address and a new server."""
        self.network.unplug(name)
        self.servers[name].kill()
        self.servers[name].wait(30)
        self.network.remove(name)
        self.network.add(name, self.numbers[name])
        self.start(name)

    def close(self) -> None:
        for server in self.servers.values():
            server.send_signal(signal.SIGCONT)  # a frozen server must wake to die of SIGTERM
            server.terminate()
        for server in self.servers.values():
            try:
                server.wait(30)
            except subprocess.TimeoutExpired:
                server.kill()
        self.network.close()


def run_faults(model: Path, durations: Durations, out: Path) -> list[PhaseReport]:
    """Each fault in turn under load; a report per phase."""
    cluster = Cluster(model)
    try:
        command = [sys.executable, "-m", "testkit.fault_client", "--target", cluster.target, "--out", str(out)]
        client = subprocess.Popen(cluster.network.command("client", command), cwd=ROOT)
        phases: list[Phase] = []
        try:
            time.sleep(durations.recover)
            for name, replica, fault in _faults(cluster, durations):
                start = time.monotonic()
                fault()
                phases.append(Phase(name, replica, start, time.monotonic(), 0.0))
                time.sleep(durations.recover)
        finally:
            client.terminate()
            assert client.wait(120) == 0
        end = time.monotonic()
    finally:
        cluster.close()
    ends = [p.start for p in phases[1:]] + [end]
    report = json.loads(out.read_text())
    return [_report(replace(p, end=e), report, cluster) for p, e in zip(phases, ends, strict=True)]


def _faults(cluster: Cluster, d: Durations) -> list[tuple[str, str, Callable[[], None]]]:
    network = cluster.network

    def blackhole() -> None:
        network.blackhole("r1", True)
        time.sleep(d.blackhole)
        network.blackhole("r1", False)

    def flap() -> None:
        for up in (False, True, False):
            network.link("r2", up)
            time.sleep(d.flap_up if up else d.flap_down)
        network.link("r2", True)

    def freeze() -> None:
        cluster.servers["r3"].send_signal(signal.SIGSTOP)
        time.sleep(d.freeze)
        cluster.servers["r3"].send_signal(signal.SIGCONT)

    return [
        (f"blackhole {d.blackhole:.0f} s", "r1", blackhole),
        (f"link flap {d.flap_down:.0f} s down, {d.flap_up:.0f} s up, {d.flap_down:.0f} s down", "r2", flap),
        (f"freeze (SIGSTOP) {d.freeze:.0f} s", "r3", freeze),
        ("host restart", "r1", lambda: cluster.restart_host("r1")),
    ]


def _report(phase: Phase, report: dict, cluster: Cluster) -> PhaseReport:
    calls = [c for c in report["calls"] if phase.start <= c[0] < phase.end]
    answered = [latency for _, latency, code, _ in calls if code == "OK"]
    address = cluster.address(phase.replica)
    last, previous = None, None
    for t, started in report["samples"]:
        count = started.get(address, 0)
        if previous is not None and count > previous and phase.start <= t <= phase.restored:
            last = t
        previous = count
    return PhaseReport(
        name=phase.name,
        requests=len(calls),
        answered=len(answered),
        retried=sum(attempt > 1 for *_, attempt in calls),
        lost=len(calls) - len(answered),
        p50_s=percentile(answered, 0.50),
        p99_s=percentile(answered, 0.99),
        max_s=max(answered, default=0.0),
        stopped_after_s=None if last is None else last - phase.start,
    )
