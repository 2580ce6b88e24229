"""Silent failures at full length (not in CI, which runs them shortened: tests/server/test_netns_faults.py):
three replicas and a client in network namespaces, closed-loop load through the callers' service config, and
a 30 s blackhole, a link flap (5 s down, 2 s up, 5 s down), a 10 s freeze and a host restart in turn. Needs
root, ``ip netns`` and iptables; writes a Markdown report.

    python benchmarks/faults.py --model exported/default --out benchmarks/faults.md
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from client.channel import KEEPALIVE_TIME_MS, KEEPALIVE_TIMEOUT_MS  # noqa: E402
from runtime.cpu import describe_cpu  # noqa: E402
from testkit import netns  # noqa: E402
from testkit.faults import STUCK_BOUND_S, TABLE_HEADER, Durations, run_faults  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, default=ROOT / "exported/default")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks/faults.md")
    args = parser.parse_args()
    reason = netns.unavailable()
    if reason:
        print(reason, file=sys.stderr)
        return 1
    with tempfile.TemporaryDirectory() as scratch:
        reports = run_faults(args.model, Durations(), Path(scratch) / "calls.json")
    lines = [
        "# Silent failures under load",
        "",
        f"`python {' '.join(sys.argv)}`, {time.strftime('%Y-%m-%d')}; "
        f"machine: {describe_cpu()}; three replicas (one intra-op thread each) and the client (8 closed-loop "
        "callers through client/channel.py) share its cores. Keepalive: a ping every "
        f"{KEEPALIVE_TIME_MS / 1000:.0f} s, given up after {KEEPALIVE_TIMEOUT_MS / 1000:.0f} s; the bound on a "
        f"stuck call is {STUCK_BOUND_S:.0f} s. A phase runs from its fault's start to the next fault's; "
        "the last column is when the faulty replica's subchannel started its last call during the fault.",
        "",
        TABLE_HEADER,
        *(report.row() for report in reports),
        "",
    ]
    args.out.write_text("\n".join(lines))
    print("\n".join(lines))
    return 0 if all(report.lost == 0 for report in reports) else 1


if __name__ == "__main__":
    sys.exit(main())
