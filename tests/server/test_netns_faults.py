"""Silent failures between hosts: three replicas and a client, each in its own network namespace on one bridge
(testkit/faults.py, testkit/netns.py), the client under closed-loop load through the callers' service config
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

CI shortens the phases: the blackhole to 10 s and the freeze to 8 s, each still longer than STUCK_BOUND_S (6 s),
so that only the keepalive can end a stuck call within the bound, and the steady load between faults to 3 s;
benchmarks/faults.py runs the full-length phases and writes the table in docs/benchmarks.md.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from testkit import netns
from testkit.faults import STUCK_BOUND_S, TABLE_HEADER, Durations, run_faults

CI = Durations(blackhole=10.0, freeze=8.0, recover=3.0)


def test_silent_failures_lose_nothing_and_end_stuck_calls_by_the_keepalive(tiny_export: Path, tmp_path, capsys):
    reason = netns.unavailable()
    if reason:
        pytest.skip(reason)
    assert min(CI.blackhole, CI.freeze) > STUCK_BOUND_S, "a fault must outlast the bound it is checked against"
    reports = run_faults(tiny_export, CI, tmp_path / "calls.json")
    with capsys.disabled():
        print("\n" + TABLE_HEADER + "\n" + "\n".join(r.row() for r in reports))
    assert all(r.lost == 0 and r.requests > 20 for r in reports), reports
    blackhole, _, freeze, _ = reports
    assert blackhole.max_s <= STUCK_BOUND_S and freeze.max_s <= STUCK_BOUND_S, (blackhole, freeze)
    assert blackhole.retried >= 1 and blackhole.stopped_after_s <= STUCK_BOUND_S, blackhole
