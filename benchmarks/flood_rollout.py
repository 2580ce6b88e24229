"""A rolling restart of two replicas during a flood of long documents, losing nothing (not a test).

    python benchmarks/flood_rollout.py --out benchmarks/flood_rollout.md

Two replicas of the server on 127.0.0.1, each on fixed free ports (gRPC, metrics; HTTP off), both default
models, at the server's defaults (as benchmarks/flood.py runs it: the translation cache on) except what two
replicas on one machine need: REPLICA_FLAGS (--server-flag adds flags). The caller is one grpc.aio channel of
client/channel.py over both addresses, so round robin, the retries of UNAVAILABLE and CANCELLED and the
deadline are what a real caller gets. It sends benchmarks/flood.py's mix (every tenth request a new document of
just under --document-chars characters, plain text and HTML alternately; the others one or two sentences) with
Poisson arrivals at --rate for the whole run.

The phases: "before" (--warm-seconds); "replica 1 restarting": SIGTERM (the replica drains: NOT_SERVING, new
calls UNAVAILABLE, calls in flight finish within --grace-seconds or are cancelled), its exit, a new server on
the same ports, until it serves; "between" (--settle-seconds); "replica 2 restarting", the same; "after"
(--settle-seconds). Then sending stops and the answers still out have --drain-seconds.

A request belongs to the phase it was sent in and ends answered (OK), refused (RESOURCE_EXHAUSTED, or
UNAVAILABLE that the server sent: its request ID in the trailing metadata, as benchmarks/flood.py decides),
failed (anything else: a deadline, CANCELLED, UNAVAILABLE from the transport) or lost (no answer by the end of
the drain). Retries: the server names the attempt that answered (x-attempt, from the caller's
grpc-previous-rpc-attempts); channelz counts the attempts each replica's subchannel started. Any request failed
or lost fails the run (exit status 1).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import random
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks")]

from flood import (  # noqa: E402
    DOCUMENT_EVERY,
    HELD,
    GrpcDoor,
    Record,
    Traffic,
    _latencies,
    parsed,
    server_metrics,
    serving_defaults,
    settle,
)

from client.channel import aio_channel  # noqa: E402
from common.corpus import MULTI30K  # noqa: E402
from proto import translate_pb2_grpc  # noqa: E402
from runtime.cpu import describe_cpu  # noqa: E402
from server.config import DEFAULT_MODELS  # noqa: E402
from server.operations.access import ATTEMPT_HEADER  # noqa: E402
from testkit.fault_client import calls_started  # noqa: E402
from testkit.servers import free_port, start_subprocess_server  # noqa: E402

# Two replicas share the machine's cores: one inference thread per lane size and one ONNX Runtime thread each. The
# drain is the server's default (--grace-seconds): a 99,000-character document took 15-29 s on such a replica, and
# a 10 s drain cut one off (its retry on the other replica was refused after 19 s).
REPLICA_FLAGS = ("--intra-op-threads", "1", "--lane-replicas", "1")
EXIT_MARGIN_S = 30.0  # after the grace: the scheduler's stop (up to 5 s, server/app.py) and the process's exit
CALL_DEADLINE_S = 60.0  # client/channel.py's service config gives Translate 60 s; gRPC keeps the shorter deadline
OUTCOMES = ("answered", "refused", "failed", "lost")
QUICK = {
    "warm_seconds": 5.0,
    "settle_seconds": 3.0,
    "document_chars": 5_000,
    "rate": 10.0,
    "drain_seconds": 30.0,
    "grace_seconds": 2.0,
}


@dataclass
class Sent(Record):
    """A request of the flood (benchmarks/flood.py's Record) and the attempts the channel made for it."""

    attempts: int = 1  # as the server that ended it counted them (x-attempt); 1 where no server did
    message: str = ""  # a failure's full status details


@dataclass(frozen=True)
class Mark:
    """A phase's start: seconds since the flood started, and each subchannel's attempts by then (channelz)."""

    name: str
    at: float
    attempts: dict[str, int]


@dataclass(frozen=True)
class Restart:
    replica: str
    held: dict[str, float]  # the requests its front door held just before the SIGTERM, by kind
    signalled: float  # seconds since the flood started
    exited: float
    exit_code: int | None  # None: still running after the grace and EXIT_MARGIN_S, so killed
    serving: float


class Replica:
    """One server process on fixed ports, started again on the same ports after a SIGTERM."""

    def __init__(self, name: str, flags: Sequence[str], start_timeout_s: float, grace_s: float) -> None:
        self.name, self.port, self.metrics_port = name, free_port(), free_port()
        self.exit_within_s = grace_s + EXIT_MARGIN_S
        first, *others = DEFAULT_MODELS
        models = [flag for model in others for flag in ("--model", str(model))]
        ports = ["--port", str(self.port), "--metrics-port", str(self.metrics_port)]
        self.start_args, self.start_timeout_s = [first, *models, *ports, *flags], start_timeout_s
        self.process = self.start()

    @property
    def address(self) -> str:
        """The replica's address as the target names it and channelz its subchannel."""
        return f"127.0.0.1:{self.port}"

    def start(self) -> subprocess.Popen:
        return start_subprocess_server(*self.start_args, start_timeout_s=self.start_timeout_s)[0]

    def restart(self, clock: Callable[[], float]) -> Restart:
        """SIGTERM, its exit, and a new server on the same ports once it serves."""
        metrics = server_metrics(self.metrics_port)
        held = {key.split("=")[1].rstrip("}"): value for key, value in metrics.items() if key.startswith(HELD + "{")}
        signalled = clock()
        self.process.send_signal(signal.SIGTERM)
        try:
            exit_code = self.process.wait(self.exit_within_s)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            exit_code = None
        exited = clock()
        self.process = self.start()
        return Restart(self.name, held, signalled, exited, exit_code, clock())

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(self.exit_within_s)
        except subprocess.TimeoutExpired:
            self.process.kill()


class _KeptCalls:
    """A Translator stub whose Translate calls are kept by their request, for their trailing metadata."""

    def __init__(self, stub: translate_pb2_grpc.TranslatorStub) -> None:
        self.stub, self.calls = stub, {}

    def Translate(self, request, **kwargs):  # noqa: N802 (the stub's method)
        self.calls[id(request)] = self.stub.Translate(request, **kwargs)
        return self.calls[id(request)]


class ChannelDoor(GrpcDoor):
    """benchmarks/flood.py's gRPC door over the callers' channel (client/channel.py) to every replica."""

    def __init__(self, addresses: Sequence[str], timeout_s: float) -> None:
        self.target, self.timeout_s = "ipv4:" + ",".join(addresses), timeout_s

    async def __aenter__(self) -> ChannelDoor:
        self.channel = aio_channel(self.target)
        self.stub = _KeptCalls(translate_pb2_grpc.TranslatorStub(self.channel))
        return self

    async def send_counted(self, request, record: Sent) -> None:
        """``send``, with its outcome, attempts and a failure's details into ``record``."""
        try:
            record.outcome, record.detail = await self.send(request)
            call = self.stub.calls[id(request)]
            record.attempts = int(dict(await call.trailing_metadata() or ()).get(ATTEMPT_HEADER, 1))
            if record.outcome == "failed":
                record.message = f"{await call.details()} {await call.debug_error_string()}"[:400]
        finally:
            self.stub.calls.pop(id(request), None)


@dataclass
class Rollout:
    """What one run measured; times in seconds since the flood started."""

    server_command: list[str]
    marks: list[Mark]  # the phases' starts, then the end of sending, then the end of the drain
    restarts: list[Restart]
    records: list[Sent]
    replicas: dict[str, str]  # name: address

    def phases(self) -> list[tuple[Mark, Mark]]:
        return list(itertools.pairwise(self.marks[:-1]))

    def sent_in(self, start: Mark, end: Mark) -> list[Sent]:
        return [r for r in self.records if start.at <= r.sent_at < end.at]

    def counts(self, records: list[Sent] | None = None) -> dict[str, int]:
        records = self.records if records is None else records
        return {o: sum(r.outcome == o for r in records) for o in OUTCOMES}

    def verdict(self) -> tuple[bool, str]:
        counts = self.counts()
        passed = not counts["failed"] and not counts["lost"]
        retried = sum(r.attempts > 1 for r in self.records)
        head = "PASS" if passed else f"FAIL ({counts['failed']} failed, {counts['lost']} lost)"
        return passed, (
            f"{head}: of {len(self.records)} requests sent through a rolling restart of {len(self.restarts)} "
            f"replicas, {counts['answered']} answered, {counts['refused']} refused, {counts['failed']} failed, "
            f"{counts['lost']} lost; {retried} answered or refused on a retry"
        )


async def send_until(door: ChannelDoor, traffic: Traffic, args, stop: asyncio.Event, start: float) -> list:
    """Requests at Poisson arrivals of ``args.rate`` from ``start`` until ``stop``: (record, task) each. The next
    request is built before waiting for its time, so sending costs little more than the write."""
    rng, sent, at = random.Random(args.seed), [], 0.0
    for number in itertools.count():
        kind, text, markup = traffic.request(number)
        payload = door.prepare(text, markup)
        at += rng.expovariate(args.rate)
        if (delay := start + at - time.perf_counter()) > 0:
            await asyncio.sleep(delay)
        if stop.is_set():
            return sent
        now = time.perf_counter()
        record = Sent(kind, now - start, late=now - start - at)
        sent.append((record, asyncio.create_task(_timed(door, payload, record, now))))


async def _timed(door: ChannelDoor, payload, record: Sent, started: float) -> None:
    await door.send_counted(payload, record)
    record.latency = time.perf_counter() - started


async def flood_and_roll(replicas: list[Replica], args) -> tuple[list[Mark], list[Restart], list[Sent]]:
    """The flood through a rolling restart of ``replicas``, then the drain."""
    traffic = Traffic(args.data, args.document_chars, args.seed)
    start = time.perf_counter()

    def clock() -> float:
        return time.perf_counter() - start

    def mark(name: str) -> Mark:
        print(f"{clock():6.1f} s: {name}", file=sys.stderr, flush=True)
        return Mark(name, clock(), calls_started())

    async with ChannelDoor([r.address for r in replicas], args.client_timeout) as door:
        stop = asyncio.Event()
        sending = asyncio.create_task(send_until(door, traffic, args, stop, start))
        marks, restarts = [mark("before")], []
        await asyncio.sleep(args.warm_seconds)
        for k, replica in enumerate(replicas):
            marks.append(mark(f"{replica.name} restarting"))
            restarts.append(await asyncio.to_thread(replica.restart, clock))
            marks.append(mark("between" if k < len(replicas) - 1 else "after"))
            await asyncio.sleep(args.settle_seconds)
        marks.append(mark("sending stopped"))
        stop.set()
        sent = await sending
        pending = [task for _, task in sent if not task.done()]
        if pending:
            await asyncio.wait(pending, timeout=args.drain_seconds)
        marks.append(mark("drained"))
        await settle([task for _, task in sent])  # what is still out is lost: its record keeps outcome "lost"
    return marks, restarts, [record for record, _ in sent]


def run(args, flags: list[str]) -> Rollout:
    replicas: list[Replica] = []
    try:
        for k in (1, 2):
            print(f"starting replica {k} ...", file=sys.stderr, flush=True)
            replicas.append(Replica(f"replica {k}", flags, args.start_timeout, args.grace_seconds))
        marks, restarts, records = asyncio.run(flood_and_roll(replicas, args))
    finally:
        for replica in replicas:
            replica.stop()
    command = [str(part) for part in replicas[0].process.args]
    return Rollout(command, marks, restarts, records, {r.name: r.address for r in replicas})


def _attempts(rollout: Rollout, start: Mark, end: Mark) -> str:
    """Attempts each replica's subchannel started between two marks (channelz), "r1 / r2"."""
    deltas = []
    for address in rollout.replicas.values():
        key = f"ipv4:{address}"
        deltas.append(str(end.attempts.get(key, 0) - start.attempts.get(key, 0)))
    return " / ".join(deltas)


def report(rollout: Rollout, args, argv: Sequence[str]) -> list[str]:
    passed, verdict = rollout.verdict()
    sending_stopped, drained = rollout.marks[-2:]
    lines = [
        "# A rolling restart of two replicas during a flood of long documents",
        "",
        f"command: `python benchmarks/flood_rollout.py {shlex.join(argv)}`",
        f"date: {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC",
        f"machine: {describe_cpu()}; both replicas and the load generator (one asyncio process, grpc.aio) share "
        "these cores",
        f"replica 1: `{shlex.join(rollout.server_command)}` (replica 2 the same on its own ports; HTTP off)",
        f"client: one channel of client/channel.py's `aio_channel` to `ipv4:{','.join(rollout.replicas.values())}` "
        f"(round robin; retries of UNAVAILABLE and CANCELLED, at most 5 attempts), each call's deadline "
        f"{args.client_timeout:.0f} s",
        f"load: Poisson arrivals at {args.rate:g} req/s; every {DOCUMENT_EVERY}th request a new document of at most "
        f"{args.document_chars:,} characters (alternately plain text and HTML), the others 1 or 2 test_2016_flickr "
        f"sentences; phases: before {args.warm_seconds:g} s, each replica's restart (SIGTERM, drain, exit, start "
        f"on the same ports, serving), {args.settle_seconds:g} s after each; then up to {args.drain_seconds:g} s "
        "to drain",
        "",
        f"**Verdict: {verdict}.**",
        "",
        "## Requests by the phase they were sent in",
        "",
        "Latencies of answered requests: p50 / p99 / max (count), seconds. Retried: requests answered or refused "
        "on a later attempt (x-attempt), and the extra attempts they took. Attempts: what each replica's "
        "subchannel started in the phase (channelz; retries included).",
        "",
        "| phase | from, s | to, s | sent | answered | refused | failed | lost | retried (extra attempts) "
        "| sentences | documents | attempts replica 1 / 2 |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for start, end in rollout.phases():
        records = rollout.sent_in(start, end)
        counts, retried = rollout.counts(records), [r.attempts - 1 for r in records if r.attempts > 1]
        answered = [r for r in records if r.outcome == "answered"]
        latencies = {kind: [r.latency for r in answered if r.kind == kind] for kind in ("sentence", "document")}
        lines.append(
            f"| {start.name} | {start.at:.1f} | {end.at:.1f} | {len(records)} | "
            + " | ".join(str(counts[o]) for o in OUTCOMES)
            + f" | {len(retried)} ({sum(retried)}) | {_latencies(latencies['sentence'])} | "
            f"{_latencies(latencies['document'])} | {_attempts(rollout, start, end)} |"
        )
    counts = rollout.counts()
    lines += [
        f"| all | 0.0 | {sending_stopped.at:.1f} | {len(rollout.records)} | "
        + " | ".join(str(counts[o]) for o in OUTCOMES)
        + f" | {sum(r.attempts > 1 for r in rollout.records)} ({sum(r.attempts - 1 for r in rollout.records)}) "
        f"| | | {_attempts(rollout, rollout.marks[0], sending_stopped)} |",
        "",
        f"The drain ({sending_stopped.at:.1f} to {drained.at:.1f} s): attempts replica 1 / 2 "
        f"{_attempts(rollout, sending_stopped, drained)}.",
        "",
        "## The restarts",
        "",
        "Held: the requests the replica's front door held just before its SIGTERM (translate_door_requests), "
        f"which it had up to {args.grace_seconds:g} s (--grace-seconds) to answer.",
        "",
        "| replica | SIGTERM at, s | held | exited after, s | exit status | serving again after its exit, s |",
        "|---|---|---|---|---|---|",
    ]
    for r in rollout.restarts:
        status = "killed (still running)" if r.exit_code is None else str(r.exit_code)
        held = ", ".join(f"{kind} {count:g}" for kind, count in sorted(r.held.items())) or "-"
        lines.append(
            f"| {r.replica} | {r.signalled:.1f} | {held} | {r.exited - r.signalled:.1f} | {status} | "
            f"{r.serving - r.exited:.1f} |"
        )
    lines += [
        "",
        "## Refusals and failures by kind",
        "",
        "| outcome | kind | class | count | sent at, s | ended after, s |",
        "|---|---|---|---|---|---|",
    ]
    kinds: dict[tuple[str, str, str], list[Sent]] = {}
    for r in rollout.records:
        if r.outcome != "answered":
            kinds.setdefault((r.outcome, r.detail, r.kind), []).append(r)
    for (outcome, detail, kind), rs in sorted(kinds.items()):
        sent, took = [r.sent_at for r in rs], [r.latency for r in rs]
        ended = "-" if outcome == "lost" else f"{min(took):.2f} to {max(took):.2f}"
        lines.append(
            f"| {outcome} | {detail or '-'} | {kind} | {len(rs)} | {min(sent):.1f} to {max(sent):.1f} | {ended} |"
        )
    retried = [r for r in rollout.records if r.attempts > 1]
    if retried:
        lines += ["", "Retried (the first 20): sent at, class, attempts, outcome, ended after:", ""]
        lines += [
            f"- {r.sent_at:.1f} s, {r.kind}, {r.attempts}, {r.outcome} {r.detail}".rstrip() + f", {r.latency:.2f} s"
            for r in retried[:20]
        ]
    failures = [r for r in rollout.records if r.outcome == "failed"]
    if failures:
        lines += ["", "Failures (the first 20): sent at, class, attempts, status details:", ""]
        lines += [f"- {r.sent_at:.1f} s, {r.kind}, {r.attempts}: `{r.message}`" for r in failures[:20]]
    late = _latencies([r.late for r in rollout.records], "ms").rsplit(" (", 1)[0]
    lines += ["", f"The load generator sent late by p50 / p99 / max {late} ms.", ""]
    return lines


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, default=MULTI30K, help="the Multi30k folder")
    parser.add_argument(
        "--out", type=Path, default=ROOT / "benchmarks" / "flood_rollout.md", help="the Markdown report"
    )
    parser.add_argument("--rate", type=float, default=30.0, help="requests per second (Poisson arrivals)")
    parser.add_argument("--warm-seconds", type=float, default=15.0, help="the flood before the first restart")
    parser.add_argument("--settle-seconds", type=float, default=10.0, help="the flood after each restart")
    return parsed(parser, argv, QUICK, client_timeout_s=CALL_DEADLINE_S, start_timeout_s=300.0)


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse_args(argv)
    rollout = run(args, [*serving_defaults(args.grace_seconds), *REPLICA_FLAGS, *args.server_flag])
    args.out.write_text("\n".join(report(rollout, args, argv)))
    passed, verdict = rollout.verdict()
    print(verdict)
    print(f"wrote {args.out}", file=sys.stderr)
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
