"""Silent failures between hosts: three replicas and a client, each in its own network namespace on one bridge
(tests/server/netns.py), the client under closed-loop load through the callers' service config
(client/channel.py). One fault at a time, mid-load:

1. blackhole: every packet to and from a replica dropped (iptables DROP), then let through again;
2. link flap: a replica's link down, up, down again, and up;
3. freeze: a replica SIGSTOPped, then SIGCONTed, its connections open all along;
4. host restart: a replica's namespace deleted (the node vanishes) and made again at the same address with a
   new server.

Nothing answers or refuses here: only the channel's keepalive (a ping unanswered within its timeout closes the
connection, and the calls on it are retried on another replica) ends a call stuck on a silent replica before
its deadline. No call may be lost, and during the blackhole and the freeze the slowest calls take at most the
keepalive's time and timeout plus one answer (STUCK_BOUND_S).

CI shortens the blackhole to 20 s (the keepalive ends stuck calls within 4 s; the full 30 s adds nothing);
benchmarks/faults.py runs the full-length phases and writes the table in docs/benchmarks.md.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import pytest

from client.channel import KEEPALIVE_TIME_MS, KEEPALIVE_TIMEOUT_MS
from client.loadtest_report import percentile
from tests.server import netns
from tests.server.test_faults import FLAGS as LOOPBACK_FLAGS
from tests.server.test_lifecycle import start_subprocess_server

PORT = 50051
REPLICAS = ("r1", "r2", "r3")
FLAGS = (*LOOPBACK_FLAGS, "--port", str(PORT), "--language-detection", "off")
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


CI = Durations(blackhole=20.0)


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
        self.servers[name] = start_subprocess_server(self.model, "--host", address, *FLAGS, wrapper=wrapper)[0]

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
        command = [sys.executable, "-m", "tests.server.fault_client", "--target", cluster.target, "--out", str(out)]
        client = subprocess.Popen(cluster.network.command("client", command), cwd=Path(__file__).parents[2])
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


def test_silent_failures_lose_nothing_and_end_stuck_calls_by_the_keepalive(tiny_export: Path, tmp_path, capsys):
    reason = netns.unavailable()
    if reason:
        pytest.skip(reason)
    reports = run_faults(tiny_export, CI, tmp_path / "calls.json")
    with capsys.disabled():
        print("\n" + TABLE_HEADER + "\n" + "\n".join(r.row() for r in reports))
    assert all(r.lost == 0 and r.requests > 20 for r in reports), reports
    blackhole, _, freeze, _ = reports
    assert blackhole.max_s <= STUCK_BOUND_S and freeze.max_s <= STUCK_BOUND_S, (blackhole, freeze)
    assert blackhole.retried >= 1 and blackhole.stopped_after_s <= STUCK_BOUND_S, blackhole
