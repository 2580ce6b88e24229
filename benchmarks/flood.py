"""A flood of long documents at five times the capacity, through each front door (not a test).

    python benchmarks/flood.py --out benchmarks/flood.md

The server runs at its defaults, both default models, as ``make serve`` runs it (the translation cache on;
--server-flag adds flags), a fresh one per front door. Every tenth request is a new document of just under
--document-chars characters, alternately plain text (paragraphs of sentences, blank lines between them) and
HTML (``<p>`` paragraphs, format "html"); the others are one or two test_2016_flickr sentences. The cache keys
sentences and Multi30k's 29,000 training sentences make only about 18 documents of 99,000 characters, so each
sentence of a document joins two training sentences as clauses, in a pairing no other document uses: the
cache answers none of a document.

Capacity is measured first (closed loop, 32 clients, the same mix, answered requests per second); then Poisson
arrivals at --times that rate for --seconds, and --drain-seconds for the answers still out. Each request ends
answered (HTTP 200, gRPC OK), refused (HTTP 429 or 503, gRPC RESOURCE_EXHAUSTED, or UNAVAILABLE from the
server), failed (connection refused or reset, server disconnected, client timeout, any other status) or lost
(still unanswered after the drain). Beside the load: the server's resident memory (/proc, every 0.5 s) against
the Kubernetes deployment's memory limit, GET /health every 0.25 s from a process of its own (the event loop's
lag as an operator's probe sees it), and the server's translate_door* and translate_rejected* metrics and
translate_requests_total by code, before the flood and after the drain.

The load generator is one asyncio process (aiohttp, grpc.aio) on the server's cores; it builds every request
of the flood before the flood starts, so sending costs it little more than the write. gRPC goes over a
channel without the service config's retries, so each request is one attempt, as over HTTP.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import html
import itertools
import json
import os
import random
import shlex
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields
from datetime import datetime, timezone
from pathlib import Path

import aiohttp
import grpc
from prometheus_client.parser import text_string_to_metric_families

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks")]

from front_ends import resident_bytes  # noqa: E402
from overload import deployment_settings  # noqa: E402

from client.loadtest_report import percentile  # noqa: E402
from common.corpus import MULTI30K, corpus_path, read_lines  # noqa: E402
from proto import translate_pb2, translate_pb2_grpc  # noqa: E402
from runtime.cpu import describe_cpu  # noqa: E402
from server.config import DEFAULT_MODELS, ServerConfig  # noqa: E402
from server.operations.access import REQUEST_ID_HEADER  # noqa: E402
from testkit.servers import free_port, start_subprocess_server  # noqa: E402

MIB = 1 << 20
DOCUMENT_EVERY = 10  # every tenth request is a document
SENTENCES_PER_PARAGRAPH = 6
DOCUMENT_STRIDE = 1_597  # where consecutive documents start in the training sentences (coprime to 29,000)
CAPACITY_CLIENTS = 32
RSS_EVERY_S, HEALTH_EVERY_S, METRICS_EVERY_S = 0.5, 0.25, 2.0
HEALTH_TIMEOUT_S = 30.0
SERIES_POINTS = 10  # points of the memory and /health series in the report
QUIET_WAIT_S = 2.0
HELD = "translate_door_requests"  # the front door's gauge of requests held, by kind
QUICK = {
    "capacity_seconds": 5.0,
    "seconds": 10.0,
    "document_chars": 20_000,
    "drain_seconds": 30.0,
    "grace_seconds": 2.0,
}
REFUSED_HTTP = {429, 503}
REFUSED_GRPC = {"RESOURCE_EXHAUSTED", "UNAVAILABLE"}
# The goals each front door is judged against.
REFUSAL_P99_S, SENTENCE_P99_S, HEALTH_MAX_S = 0.05, 2.0, 0.1


class Traffic:
    """The request mix, from the corpus: numbered requests, every DOCUMENT_EVERY-th a new document."""

    def __init__(self, data: Path, document_chars: int, seed: int) -> None:
        self.clauses = read_lines(corpus_path(data, "train", "en"))
        self.sentences = read_lines(corpus_path(data, "test_2016_flickr", "en"))
        self.document_chars, self.rng = document_chars, random.Random(seed)
        self.documents = itertools.count()

    def request(self, number: int) -> tuple[str, str, str]:
        """(class, text, format) of request ``number``: ("document", a new document, "text" or "html") or
        ("sentence", one or two sentences, "text")."""
        if number % DOCUMENT_EVERY == DOCUMENT_EVERY - 1:
            markup = "html" if number // DOCUMENT_EVERY % 2 else "text"
            return "document", self.document(markup), markup
        return "sentence", " ".join(self.rng.sample(self.sentences, self.rng.randint(1, 2))), "text"

    def pair(self, index: int, shift: int) -> str:
        """Training sentences ``index`` and ``index + shift`` as one sentence of two clauses."""
        first = self.clauses[index % len(self.clauses)].rstrip(" .")
        second = self.clauses[(index + shift) % len(self.clauses)].rstrip(" .")
        return f"{first}, and {second[:1].lower()}{second[1:]}."

    def document(self, markup: str) -> str:
        """The next document: at most document_chars characters. Document k pairs each sentence with the one
        k + 1 further on, so no two documents share a sentence."""
        k = next(self.documents)
        escape, open_tag, close_tag, between = (
            (html.escape, "<p>", "</p>", "\n") if markup == "html" else (str, "", "", "\n\n")
        )
        paragraphs: list[list[str]] = []
        size = 0
        for index in itertools.count(k * DOCUMENT_STRIDE):
            sentence = escape(self.pair(index, k + 1))
            new_paragraph = not paragraphs or len(paragraphs[-1]) == SENTENCES_PER_PARAGRAPH
            extra = len(open_tag + close_tag) + (len(between) if paragraphs else 0) if new_paragraph else 1
            if size + extra + len(sentence) > self.document_chars:
                break
            if new_paragraph:
                paragraphs.append([])
            paragraphs[-1].append(sentence)
            size += extra + len(sentence)
        return between.join(f"{open_tag}{' '.join(p)}{close_tag}" for p in paragraphs)


@dataclass
class Record:
    """One request of the flood and how it ended."""

    kind: str  # "sentence" or "document"
    sent_at: float  # seconds since the flood started
    outcome: str = "lost"  # answered, refused, failed, or lost (no answer by the end of the drain)
    latency: float = float("nan")
    detail: str = ""  # refused: the status; failed: what failed
    late: float = 0.0  # how far behind its Poisson arrival time the generator sent it


class HttpDoor:
    """POST /translate with aiohttp: one connection per request in flight."""

    name = "http"

    def __init__(self, port: int, timeout_s: float) -> None:
        self.url, self.timeout_s = f"http://127.0.0.1:{port}/translate", timeout_s

    async def __aenter__(self) -> HttpDoor:
        connector = aiohttp.TCPConnector(limit=0)
        timeout = aiohttp.ClientTimeout(total=self.timeout_s)
        self.session = aiohttp.ClientSession(connector=connector, timeout=timeout)
        return self

    async def __aexit__(self, *exc) -> None:
        await self.session.close()

    @staticmethod
    def prepare(text: str, markup: str) -> bytes:
        return json.dumps({"q": text, "source": "en", "target": "de", "format": markup}).encode()

    async def send(self, body: bytes) -> tuple[str, str]:
        try:
            async with self.session.post(self.url, data=body, headers={"Content-Type": "application/json"}) as r:
                await r.read()
                if r.status == 200:
                    return "answered", ""
                return ("refused" if r.status in REFUSED_HTTP else "failed"), f"HTTP {r.status}"
        except asyncio.TimeoutError:
            return "failed", "client timeout"
        except aiohttp.ClientError as error:
            reason = getattr(error, "strerror", None)
            return "failed", type(error).__name__ + (f" ({reason})" if reason else "")


class GrpcDoor:
    """Translate over one grpc.aio channel, without retries. The server puts its request ID in the trailing
    metadata of every call it handled, so an UNAVAILABLE without one is the transport's, not a refusal."""

    name = "grpc"

    def __init__(self, port: int, timeout_s: float) -> None:
        self.target, self.timeout_s = f"127.0.0.1:{port}", timeout_s

    async def __aenter__(self) -> GrpcDoor:
        self.channel = grpc.aio.insecure_channel(self.target)
        self.stub = translate_pb2_grpc.TranslatorStub(self.channel)
        return self

    async def __aexit__(self, *exc) -> None:
        await self.channel.close()

    @staticmethod
    def prepare(text: str, markup: str) -> translate_pb2.TranslateRequest:
        options = translate_pb2.TranslateOptions(format=markup)
        return translate_pb2.TranslateRequest(texts=[text], source_language="en", target_language="de", options=options)

    async def send(self, request: translate_pb2.TranslateRequest) -> tuple[str, str]:
        try:
            await self.stub.Translate(request, timeout=self.timeout_s)
            return "answered", ""
        except grpc.aio.AioRpcError as error:
            code = error.code().name
            if REQUEST_ID_HEADER in dict(error.trailing_metadata() or ()):
                return ("refused" if code in REFUSED_GRPC else "failed"), code
            details = f"{code} ({(error.details() or '')[:60]})"
            if code == "RESOURCE_EXHAUSTED" and "larger than max" not in details:
                return "refused", details  # gRPC's --max-concurrent-rpcs, before the server names the call
            return "failed", details


async def settle(tasks: list[asyncio.Task]) -> None:
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


async def measure_capacity(door, traffic: Traffic, seconds: float) -> tuple[float, dict[str, int]]:
    """Answered requests per second of CAPACITY_CLIENTS clients, each sending its next request on an answer,
    and the run's outcomes by class ("document answered": n). Requests are built as they go here (a document
    in about a millisecond): a closed loop waits anyway."""
    outcomes: dict[str, int] = {}
    numbers, end = itertools.count(), time.perf_counter() + seconds

    async def client() -> None:
        while time.perf_counter() < end:
            kind, text, markup = traffic.request(next(numbers))
            outcome, _ = await door.send(door.prepare(text, markup))
            if time.perf_counter() < end:
                outcomes[f"{kind} {outcome}"] = outcomes.get(f"{kind} {outcome}", 0) + 1

    clients = [asyncio.create_task(client()) for _ in range(CAPACITY_CLIENTS)]
    await asyncio.wait(clients, timeout=seconds)
    await settle(clients)
    answered = outcomes.get("sentence answered", 0) + outcomes.get("document answered", 0)
    return answered / seconds, dict(sorted(outcomes.items()))


async def until_quiet(metrics_port: int, timeout_s: float) -> float:
    """Seconds until the server's front door holds nothing (translate_door_requests sums to 0): the capacity
    run's last requests, cancelled, may still be parsed or decoded. Without the gauge, QUIET_WAIT_S."""
    start = time.perf_counter()
    while time.perf_counter() - start < timeout_s:
        held = [v for k, v in (await asyncio.to_thread(server_metrics, metrics_port)).items() if k.startswith(HELD)]
        if not held:
            await asyncio.sleep(QUIET_WAIT_S)
            break
        if not sum(held):
            break
        await asyncio.sleep(0.5)
    return time.perf_counter() - start


def schedule(rate: float, seconds: float, seed: int) -> list[float]:
    """Poisson arrival times in [0, seconds)."""
    rng, times, t = random.Random(seed), [], 0.0
    while (t := t + rng.expovariate(rate)) < seconds:
        times.append(t)
    return times


async def send_flood(door, requests: list[tuple[str, object]], times: list[float], drain_s: float) -> list[Record]:
    """Each request at its time, answered or not; then up to ``drain_s`` for the answers still out."""
    records, tasks = [], []

    async def one(payload, record: Record, started: float) -> None:
        record.outcome, record.detail = await door.send(payload)
        record.latency = time.perf_counter() - started

    start = time.perf_counter()
    for (kind, payload), at in zip(requests, times, strict=True):
        if (delay := start + at - time.perf_counter()) > 0:
            await asyncio.sleep(delay)
        now = time.perf_counter()
        records.append(Record(kind, now - start, late=now - start - at))
        tasks.append(asyncio.create_task(one(payload, records[-1], now)))
    pending = [task for task in tasks if not task.done()]
    if pending:
        await asyncio.wait(pending, timeout=drain_s)
    await settle(tasks)  # what is still out is lost: its Record keeps outcome "lost"
    return records


class Sampler(threading.Thread):
    """``measure()`` every ``every_s`` seconds, kept as (seconds since the sampler started, value)."""

    def __init__(self, measure: Callable[[], object], every_s: float) -> None:
        super().__init__(daemon=True)
        self.measure, self.every_s = measure, every_s
        self.series: list[tuple[float, object]] = []
        self.started, self.stopped = time.perf_counter(), threading.Event()

    def run(self) -> None:
        due = self.started
        while not self.stopped.is_set():
            self.series.append((time.perf_counter() - self.started, self.measure()))
            due += self.every_s
            self.stopped.wait(max(0.0, due - time.perf_counter()))

    def stop(self) -> None:
        self.stopped.set()
        self.join(HEALTH_TIMEOUT_S + 5)


# The /health prober, a process of its own as a kubelet is: a thread of the load generator would share its GIL, and
# count the generator's own pauses (it sent up to 0.5 s late under a flood) as the server's. Where it may (root), it
# runs at a higher priority than the server and the load (PROBE_NICENESS), as a kubelet does outside the pod's share
# of the node's cores: its own wait for a core on these two is not the server's answer time.
PROBE_NICENESS = -10
PROBE = """
import json, sys, time, urllib.request
url, every, timeout = sys.argv[1], float(sys.argv[2]), float(sys.argv[3])
due = time.perf_counter()
while True:
    start = time.perf_counter()
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            response.read()
            status = str(response.status)
    except Exception as error:  # an HTTP error, refused, reset or timed out: all are misses
        status = type(error).__name__
    print(json.dumps([start, time.perf_counter() - start, status]), flush=True)
    due += every
    time.sleep(max(0.0, due - time.perf_counter()))
"""


class HealthProbe(threading.Thread):
    """GET /health on a new connection every HEALTH_EVERY_S from a process of its own, as a kubelet's probe; its
    series as a Sampler's: (seconds since started, (seconds it took, status))."""

    def __init__(self, port: int) -> None:
        super().__init__(daemon=True)
        self.series: list[tuple[float, object]] = []
        self.started = time.perf_counter()  # CLOCK_MONOTONIC: the prober's clock too
        url = f"http://127.0.0.1:{port}/health"
        command = [sys.executable, "-c", PROBE, url, str(HEALTH_EVERY_S), str(HEALTH_TIMEOUT_S)]
        self.process = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
        try:
            os.setpriority(os.PRIO_PROCESS, self.process.pid, PROBE_NICENESS)
            self.niceness = PROBE_NICENESS
        except PermissionError:
            self.niceness = 0

    def run(self) -> None:
        for line in self.process.stdout:
            at, seconds, status = json.loads(line)
            self.series.append((at - self.started, (seconds, status)))

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(30)
        self.join(5)


def server_metrics(port: int) -> dict[str, float]:
    """The samples named translate_door* and translate_rejected*, and translate_requests_total by code
    (the health probe's requests left out)."""
    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    values: dict[str, float] = {}
    for family in text_string_to_metric_families(body):
        for s in family.samples:
            if s.name.startswith(("translate_door", "translate_rejected")) and not s.name.endswith("_created"):
                key = s.name + "".join(f"{{{k}={v}}}" for k, v in sorted(s.labels.items()))
            elif s.name == "translate_requests_total" and s.labels.get("method") != "HTTP /health":
                key = f"translate_requests_total{{code={s.labels.get('code')}}}"
            else:
                continue
            values[key] = values.get(key, 0.0) + s.value
    return values


@dataclass
class FrontDoorRun:
    """What one front door's flood measured."""

    door: str
    server_command: list[str]
    capacity: float
    capacity_outcomes: dict[str, int]  # the capacity run's requests that ended in time, by class and outcome
    rate: float
    records: list[Record]
    flood_started: float  # seconds after the samplers started
    idle_bytes: int
    memory: list[tuple[float, object]]
    health: list[tuple[float, object]]
    health_niceness: int  # the prober's OS niceness (PROBE_NICENESS where it may raise it, else 0)
    metrics_before: dict[str, float]
    metrics_after: dict[str, float]
    door_peaks: dict[str, float]  # the largest value of each translate_door* sample
    generator_cores: float  # the load generator's CPU seconds per second over the flood and the drain

    def outcomes(self, kind: str | None = None) -> dict[str, list[Record]]:
        chosen = [r for r in self.records if kind is None or r.kind == kind]
        return {o: [r for r in chosen if r.outcome == o] for o in ("answered", "refused", "failed", "lost")}

    def latencies(self, outcome: str, kind: str | None = None) -> list[float]:
        return [r.latency for r in self.outcomes(kind)[outcome]]

    def peak_bytes(self) -> int:
        return max((int(v) for _, v in self.memory), default=0)

    def health_seconds(self) -> list[float]:
        return [seconds for _, (seconds, _) in self.health]

    def health_misses(self) -> int:
        return sum(status != "200" for _, (_, status) in self.health)

    def checks(self, limit: int) -> list[tuple[bool, str]]:
        """(met, what) for each goal."""
        counts = {o: len(rs) for o, rs in self.outcomes().items()}
        refusal_p99 = percentile(self.latencies("refused"), 0.99)
        sentence_p99 = percentile(self.latencies("answered", "sentence"), 0.99)
        health_max = max(self.health_seconds(), default=float("nan"))
        return [
            (counts["failed"] == 0, f"failed {counts['failed']}"),
            (counts["lost"] == 0, f"lost {counts['lost']}"),
            (not counts["refused"] or refusal_p99 <= REFUSAL_P99_S, f"refusals p99 {_ms(refusal_p99)} ms"),
            (sentence_p99 <= SENTENCE_P99_S, f"answered sentences p99 {sentence_p99:.2f} s"),
            (self.peak_bytes() < limit, f"peak memory {self.peak_bytes() / MIB:.0f} of {limit / MIB:.0f} MiB"),
            (health_max <= HEALTH_MAX_S and not self.health_misses(), f"/health max {_ms(health_max)} ms"),
        ]

    def verdict(self, limit: int) -> str:
        checks = self.checks(limit)
        missed = [what for met, what in checks if not met]
        head = "PASS" if not missed else f"FAIL ({'; '.join(missed)})"
        return f"{self.door}: {head}: " + ", ".join(what for _, what in checks)


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.0f}" if seconds == seconds else "-"


def _latencies(values: list[float], unit: str = "s") -> str:
    """p50 / p99 / max (count)."""
    if not values:
        return "- (0)"
    scale, digits = (1000, 0) if unit == "ms" else (1, 2)
    points = [percentile(values, 0.5), percentile(values, 0.99), max(values)]
    return " / ".join(f"{p * scale:.{digits}f}" for p in points) + f" ({len(values)})"


def _series_points(series: list[tuple[float, object]], value: Callable[[object], float], every: int) -> str:
    """About SERIES_POINTS points "t s: value" of a series, each the largest value of its stretch."""
    if not series:
        return "-"
    points = []
    for start in range(0, len(series), every):
        chunk = series[start : start + every]
        t, v = max(chunk, key=lambda point: value(point[1]))
        points.append(f"{t:.0f} s: {value(v):.0f}")
    return ", ".join(points)


def run_front_door(door_class, args, flags: list[str]) -> FrontDoorRun:
    """A fresh server, its capacity through ``door_class``, then the flood through it."""
    first, *others = DEFAULT_MODELS
    models = [flag for model in others for flag in ("--model", str(model))]
    http_port = free_port()
    process, port, metrics_port = start_subprocess_server(
        first, *models, "--http-port", str(http_port), *flags, start_timeout_s=args.start_timeout
    )
    try:
        idle = resident_bytes(process.pid)
        memory = Sampler(lambda: resident_bytes(process.pid), RSS_EVERY_S)
        health = HealthProbe(http_port)
        gauges = Sampler(lambda: server_metrics(metrics_port), METRICS_EVERY_S)
        for sampler in (memory, health, gauges):
            sampler.start()
        traffic = Traffic(args.data, args.document_chars, args.seed)
        door_port = http_port if door_class is HttpDoor else port
        try:
            measured = asyncio.run(flood(door_class(door_port, args.client_timeout), traffic, args, metrics_port))
        finally:
            for sampler in (memory, health, gauges):
                sampler.stop()
        peaks: dict[str, float] = {}
        for _, values in gauges.series:
            for key, value in values.items():
                if key.startswith("translate_door"):
                    peaks[key] = max(peaks.get(key, value), value)
        flood_started = measured.pop("started") - memory.started
        return FrontDoorRun(
            door_class.name,
            process.args,
            **measured,
            flood_started=flood_started,
            idle_bytes=idle,
            memory=memory.series,
            health=health.series,
            health_niceness=health.niceness,
            door_peaks=peaks,
        )
    finally:
        process.terminate()
        try:
            process.wait(60)
        except Exception:
            process.kill()
            raise


async def flood(door, traffic: Traffic, args, metrics_port: int) -> dict:
    """Capacity, then the flood: FrontDoorRun's capacity, rate, records and metrics, and when it started."""
    async with door:
        print(f"{door.name}: capacity, {args.capacity_seconds:.0f} s ...", file=sys.stderr, flush=True)
        capacity, capacity_outcomes = await measure_capacity(door, traffic, args.capacity_seconds)
        if not capacity:
            raise SystemExit(f"{door.name}: nothing answered in {args.capacity_seconds} s; raise --capacity-seconds")
        rate = args.rate or args.times * capacity
        times = schedule(rate, args.seconds, args.seed)
        numbered = (traffic.request(n) for n in range(len(times)))
        requests = [(kind, door.prepare(text, markup)) for kind, text, markup in numbered]
        gc.freeze()  # the prepared requests are never garbage: collections that walk them paused the generator
        print(
            f"{door.name}: capacity {capacity:.2f} req/s; flood of {len(times)} requests at {rate:.2f} req/s for "
            f"{args.seconds:.0f} s, then up to {args.drain_seconds:.0f} s to drain ...",
            file=sys.stderr,
            flush=True,
        )
        quiet = await until_quiet(metrics_port, args.drain_seconds)
        print(f"{door.name}: the server was quiet {quiet:.1f} s after the capacity run", file=sys.stderr, flush=True)
        before = await asyncio.to_thread(server_metrics, metrics_port)
        started, cpu = time.perf_counter(), time.process_time()
        records = await send_flood(door, requests, times, args.drain_seconds)
        cores = (time.process_time() - cpu) / (time.perf_counter() - started)
        after = await asyncio.to_thread(server_metrics, metrics_port)
    return dict(
        capacity=capacity,
        capacity_outcomes=capacity_outcomes,
        rate=rate,
        records=records,
        started=started,
        generator_cores=cores,
        metrics_before=before,
        metrics_after=after,
    )


def report(runs: list[FrontDoorRun], args, argv: Sequence[str], limit: int) -> list[str]:
    server = shlex.join(str(part) for part in runs[0].server_command) if runs else "-"
    offered = f"{args.rate:g} req/s" if args.rate else f"{args.times:g}x capacity"
    lines = [
        "# A flood of long documents",
        "",
        f"command: `python benchmarks/flood.py {shlex.join(argv)}`",
        f"date: {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC",
        f"machine: {describe_cpu()}; the load generator (one asyncio process: aiohttp, grpc.aio) shares these "
        "cores with the server",
        f"server: `{server}` (its defaults, both default models, as `make serve`; free ports; a fresh server per "
        "front door)",
        f"load: every {DOCUMENT_EVERY}th request a new document of at most {args.document_chars:,} characters "
        "(alternately plain text and HTML), the others 1 or 2 test_2016_flickr sentences; capacity: closed loop, "
        f"{CAPACITY_CLIENTS} clients, {args.capacity_seconds:.0f} s; flood: Poisson arrivals at "
        f"{offered} for {args.seconds:.0f} s, then up to {args.drain_seconds:.0f} s to drain; client timeout "
        f"{args.client_timeout:.0f} s",
        f"goals: 0 failed, 0 lost, refusals p99 <= {REFUSAL_P99_S * 1000:.0f} ms, answered sentences p99 <= "
        f"{SENTENCE_P99_S:.0f} s, resident memory under the pod's limit ({limit / MIB:.0f} MiB, "
        f"deploy/k8s/base/deployment.yaml) throughout, /health <= {HEALTH_MAX_S * 1000:.0f} ms throughout",
        "",
        "## Verdicts",
        "",
        *(f"- {run.verdict(limit)}" for run in runs),
        "",
        "## Requests",
        "",
        "| front door | capacity req/s | offered req/s | sent | answered | refused | failed | lost "
        "| documents sent / answered |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for run in runs:
        counts = {o: len(rs) for o, rs in run.outcomes().items()}
        documents = run.outcomes("document")
        lines.append(
            f"| {run.door} | {run.capacity:.2f} | {run.rate:.2f} | {len(run.records)} | {counts['answered']} | "
            f"{counts['refused']} | {counts['failed']} | {counts['lost']} | "
            f"{sum(map(len, documents.values()))} / {len(documents['answered'])} |"
        )
    lines += ["", "Capacity runs, requests that ended in time by class and outcome:", ""]
    lines += [f"- {run.door}: {run.capacity_outcomes}" for run in runs]
    lines += [
        "",
        "Latencies: p50 / p99 / max (count).",
        "",
        "| front door | refusals ms | answered sentences s | answered documents s |",
        "|---|---|---|---|",
    ]
    for run in runs:
        lines.append(
            f"| {run.door} | {_latencies(run.latencies('refused'), 'ms')} | "
            f"{_latencies(run.latencies('answered', 'sentence'))} | "
            f"{_latencies(run.latencies('answered', 'document'))} |"
        )
    lines += [
        "",
        "## Refusals and failures by kind",
        "",
        "| front door | outcome | kind | count | sent, s into the flood | ended after, s |",
        "|---|---|---|---|---|---|",
    ]
    for run in runs:
        kinds: dict[tuple[str, str], list[Record]] = {}
        for r in run.records:
            if r.outcome in ("refused", "failed"):
                kinds.setdefault((r.outcome, r.detail), []).append(r)
        for (outcome, kind), rs in sorted(kinds.items()):
            sent, took = [r.sent_at for r in rs], [r.latency for r in rs]
            lines.append(
                f"| {run.door} | {outcome} | {kind} | {len(rs)} | {min(sent):.1f} to {max(sent):.1f} | "
                f"{min(took):.2f} to {max(took):.2f} |"
            )
    lines += [
        "",
        "## The load generator",
        "",
        "| front door | sends late by, p50 / p99 / max ms | its CPU over the flood and drain, cores |",
        "|---|---|---|",
    ]
    for run in runs:
        late = _latencies([r.late for r in run.records], "ms").rsplit(" (", 1)[0]
        lines.append(f"| {run.door} | {late} | {run.generator_cores:.2f} |")
    lines += [
        "",
        f"## Resident memory (every {RSS_EVERY_S} s from /proc; the pod's limit {limit / MIB:.0f} MiB)",
        "",
        "Series: seconds since the capacity run started, MiB (the largest of each stretch); the flood starts at "
        "the time given.",
        "",
        "| front door | idle MiB | peak MiB | peak / limit | flood starts | series |",
        "|---|---|---|---|---|---|",
    ]
    for run in runs:
        every = max(1, len(run.memory) // SERIES_POINTS)
        lines.append(
            f"| {run.door} | {run.idle_bytes / MIB:.0f} | {run.peak_bytes() / MIB:.0f} | "
            f"{run.peak_bytes() / limit:.2f} | {run.flood_started:.0f} s | "
            f"{_series_points(run.memory, lambda v: v / MIB, every)} |"
        )
    lines += [
        "",
        f"## /health (GET every {HEALTH_EVERY_S} s, a new connection each, from a process of its own, at niceness "
        f"{', '.join(sorted({str(run.health_niceness) for run in runs}))})",
        "",
        "| front door | probes | p50 ms | p99 ms | max ms | over 100 ms | not 200 | series: seconds, largest ms |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for run in runs:
        seconds = run.health_seconds()
        every = max(1, len(seconds) // SERIES_POINTS)
        lines.append(
            f"| {run.door} | {len(seconds)} | {_ms(percentile(seconds, 0.5))} | {_ms(percentile(seconds, 0.99))} | "
            f"{_ms(max(seconds, default=float('nan')))} | {sum(s > HEALTH_MAX_S for s in seconds)} | "
            f"{run.health_misses()} | {_series_points(run.health, lambda v: v[0] * 1000, every)} |"
        )
    lines += [
        "",
        f"## Server metrics (before the flood, after the drain; peaks of translate_door* sampled every "
        f"{METRICS_EVERY_S:.0f} s)",
        "",
        "| front door | sample | before | after | delta | peak |",
        "|---|---|---|---|---|---|",
    ]
    for run in runs:
        for key in sorted(run.metrics_before.keys() | run.metrics_after.keys()):
            before, after = run.metrics_before.get(key, 0.0), run.metrics_after.get(key, 0.0)
            peak = run.door_peaks.get(key)
            lines.append(
                f"| {run.door} | `{key}` | {before:g} | {after:g} | {after - before:g} | "
                f"{'-' if peak is None else f'{peak:g}'} |"
            )
    return lines


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, default=MULTI30K, help="the Multi30k folder")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "flood.md", help="the Markdown report")
    parser.add_argument("--api", action="append", choices=("http", "grpc"), help="front doors (default both)")
    parser.add_argument("--times", type=float, default=5.0, help="the flood's rate, in capacities")
    parser.add_argument(
        "--rate", type=float, default=0.0, help="the flood's rate in requests/s instead of --times capacities"
    )
    parser.add_argument("--seconds", type=float, default=600.0, help="the flood's length")
    parser.add_argument("--capacity-seconds", type=float, default=30.0, help="the capacity run's length")
    args = parsed(parser, argv, QUICK, client_timeout_s=600.0, start_timeout_s=120.0)
    args.api = args.api or ["http", "grpc"]
    return args


def parsed(
    parser: argparse.ArgumentParser,
    argv: Sequence[str] | None,
    quick: dict[str, float],
    client_timeout_s: float,
    start_timeout_s: float,
) -> argparse.Namespace:
    """``argv`` parsed by ``parser`` with the flags every flood takes added: the drain, the documents' size, each
    call's timeout, the servers' flags and start, the seed, and --quick (``quick``'s values unless given)."""
    parser.add_argument("--drain-seconds", type=float, default=120.0, help="how long answers may come after it")
    parser.add_argument("--document-chars", type=int, default=99_000, help="a document's size, at most")
    parser.add_argument("--client-timeout", type=float, default=client_timeout_s, help="each call's timeout, s")
    parser.add_argument("--server-flag", action="append", default=[], help="a flag for each server (repeat)")
    parser.add_argument("--start-timeout", type=float, default=start_timeout_s, help="seconds a server may take")
    parser.add_argument(
        "--grace-seconds",
        type=float,
        default=ServerConfig.grace_seconds,
        help="each server's --grace-seconds (its default), which SIGTERM waits out and an aging connection's calls get",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true", help=f"for the suite: {quick}, unless given")
    args = parser.parse_args(argv)
    if args.quick:
        parser.set_defaults(**quick)
        args = parser.parse_args(argv)
    return args


def serving_defaults(grace_seconds: float) -> list[str]:
    """Flags that undo start_subprocess_server's test settings (CPU provider, no cache): the server's defaults, and
    ``grace_seconds`` (the test servers' 1 s is also what an aging gRPC connection's calls get)."""
    defaults = {f.name: f.default for f in fields(ServerConfig)}
    return ["--provider", "auto", "--cache-mib", str(defaults["cache_mib"]), "--grace-seconds", f"{grace_seconds:g}"]


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse_args(argv)
    _, limit = deployment_settings()
    flags = [*serving_defaults(args.grace_seconds), *args.server_flag]
    doors = {"http": HttpDoor, "grpc": GrpcDoor}
    runs = [run_front_door(doors[api], args, flags) for api in args.api]
    lines = report(runs, args, argv, limit)
    args.out.write_text("\n".join(lines) + "\n")
    for run in runs:
        print(run.verdict(limit))
    print(f"wrote {args.out}", file=sys.stderr)
    return 0 if all(met for run in runs for met, _ in run.checks(limit)) else 1


if __name__ == "__main__":
    sys.exit(main())
