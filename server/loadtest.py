"""Load generator for the translation API: ``translate-loadtest`` (or ``python -m server.loadtest``).

Closed loop (``--concurrency N``, or a sweep ``--concurrency 1,8,64``) or open
loop (``--rate R`` Poisson arrivals per second); bounded by ``--requests``
and ``--duration``, each request with a ``--deadline``. Input lengths come
from a profile:

  file:PATH             real sentences, one per line (.gz allowed)
  fixed:N               texts of N tokens
  uniform:A-B           lengths drawn uniformly from A..B tokens
  mix:P:A-B:C-D         P% short texts (A..B tokens), the rest long (C..D tokens)

Generated texts are made of short filler sentences; append ``:run-on`` to a
fixed/uniform/mix profile for texts that are one sentence each (no sentence
breaks, so the server cannot split a long text into short sentences).

``--api http`` drives the LibreTranslate HTTP API (``--target localhost:5000``, ``POST /translate``
with ``--languages en:de``) instead of gRPC, so both front ends are measured the same way; HTTP statuses
are reported under their gRPC twins' names (server/errors.py) and output tokens are the translation
re-tokenized (HTTP does not return the count).

Reports throughput, latency percentiles overall and per length bucket, errors
by status code, and the server's metric deltas (scraped from ``--metrics``),
as JSON and Markdown, with PNG plots when ``--out`` is given.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import ssl
import sys
import time
import urllib.request
from collections.abc import Awaitable, Callable, Sequence
from contextlib import AsyncExitStack
from dataclasses import asdict, dataclass, field
from pathlib import Path

import aiohttp
import grpc
import sentencepiece as spm
from prometheus_client.parser import text_string_to_metric_families

from model.corpus import read_lines
from proto import translate_pb2, translate_pb2_grpc
from server.access import ATTEMPT_HEADER
from server.channel import aio_channel
from server.config import DEFAULT_MODEL_DIR
from server.metrics import length_bucket

FILLER = [
    "A man in a blue shirt is walking down the street with his dog.",
    "Two children are playing with a ball in the park near the river.",
    "A woman is sitting on a bench and reading a book in the sun.",
    "A group of people are standing in front of a large old building.",
    "A young boy jumps into the water while his friends watch him.",
]


class Profile:
    """Texts with a requested number of source tokens, as the server's tokenizer counts them."""

    def __init__(self, spec: str, tokenizer: spm.SentencePieceProcessor, seed: int = 0) -> None:
        self.spec, self.tokenizer, self.rng = spec, tokenizer, random.Random(seed)
        kind, _, rest = spec.partition(":")
        self.run_on = kind != "file" and rest.endswith(":run-on")
        rest = rest.removesuffix(":run-on") if self.run_on else rest
        self.lines: list[str] = read_lines(rest) if kind == "file" else []
        if kind not in ("file", "fixed", "uniform", "mix"):
            raise ValueError(
                f"unknown profile {spec!r}: use file:PATH, fixed:N, uniform:A-B or mix:P:A-B:C-D (+ :run-on)"
            )
        self.kind, self.args = kind, rest

    @staticmethod
    def _range(text: str) -> tuple[int, int]:
        low, _, high = text.partition("-")
        return int(low), int(high or low)

    def length(self) -> int:
        if self.kind == "fixed":
            return int(self.args)
        if self.kind == "uniform":
            return self.rng.randint(*self._range(self.args))
        share, short, long = self.args.split(":")
        return self.rng.randint(*self._range(short if self.rng.random() * 100 < float(share) else long))

    def text_of_length(self, tokens: int) -> str:
        """Filler sentences joined until the text has ``tokens`` tokens, then cut to exactly that.
        Run-on texts join them as clauses (no sentence-ending punctuation)."""
        pieces, count = [], 0
        while count < tokens:
            sentence = self.rng.choice(FILLER)
            if self.run_on:
                sentence = sentence.rstrip(".") + (" and" if pieces else "")
            pieces.append(sentence)
            count += len(self.tokenizer.encode(sentence))
        ids, cut = self.tokenizer.encode(" ".join(pieces)), tokens
        while True:  # re-tokenizing the cut text can merge or split pieces: cut until it fits
            text = self.tokenizer.decode(ids[:cut])
            excess = len(self.tokenizer.encode(text)) - tokens
            if excess <= 0 or cut <= 1:
                return text
            cut -= excess

    def next(self) -> tuple[str, int]:
        text = self.rng.choice(self.lines) if self.kind == "file" else self.text_of_length(self.length())
        return text, len(self.tokenizer.encode(text))


@dataclass
class Result:
    input_tokens: int
    latency: float
    code: str
    output_tokens: int = 0
    started: float = 0.0
    attempts: int = 1  # gRPC: the attempt that answered (the service config retries UNAVAILABLE, CANCELLED)


@dataclass
class Run:
    mode: str
    concurrency: int
    rate: float
    results: list[Result] = field(default_factory=list)
    seconds: float = 0.0
    server: dict[str, float] = field(default_factory=dict)


def percentile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def scrape(url: str | None) -> dict[str, float]:
    """Selected samples of the server's metrics (sums over labels)."""
    if not url:
        return {}
    wanted = (
        "translate_queue_wait_seconds_sum",
        "translate_queue_wait_seconds_count",
        "translate_batch_size_sentences_sum",
        "translate_batch_size_sentences_count",
        "translate_kv_cache_bytes",
        "translate_memory_reserved_bytes",
        "process_resident_memory_bytes",
        "translate_requests_total",
    )
    body = urllib.request.urlopen(url, timeout=5).read().decode()
    values: dict[str, float] = {}
    for family in text_string_to_metric_families(body):
        for sample in family.samples:
            if sample.name in wanted:
                values[sample.name] = values.get(sample.name, 0.0) + sample.value
    return values


# HTTP statuses under their gRPC twins' names (server/errors.py), so both APIs report alike.
HTTP_CODES = {
    200: "OK",
    400: "INVALID_ARGUMENT",
    429: "RESOURCE_EXHAUSTED",
    499: "CANCELLED",
    500: "INTERNAL",
    503: "UNAVAILABLE",
    504: "DEADLINE_EXCEEDED",
}
Send = Callable[[str], Awaitable[tuple[str, int, int]]]  # text -> (status code name, output tokens, attempts)


def grpc_sender(channel: grpc.aio.Channel, args) -> Send:
    stub = translate_pb2_grpc.TranslatorStub(channel)
    options = translate_pb2.TranslateOptions(beam_size=args.beam)
    source, _, target = args.languages.partition(":")

    async def send(text: str) -> tuple[str, int]:
        try:
            request = translate_pb2.TranslateRequest(
                texts=[text], options=options, source_language=source, target_language=target
            )
            call = stub.Translate(request, timeout=args.deadline)
            response = await call
            attempt = dict(await call.trailing_metadata() or ()).get(ATTEMPT_HEADER)
            return ("OK", response.translations[0].output_tokens, int(attempt) if attempt else 1)
        except grpc.aio.AioRpcError as error:
            attempt = dict(error.trailing_metadata() or ()).get(ATTEMPT_HEADER)
            return error.code().name, 0, int(attempt) if attempt else 1

    return send


def http_sender(session: aiohttp.ClientSession, args, tokenizer: spm.SentencePieceProcessor) -> Send:
    source, _, target = args.languages.partition(":")
    url = f"{'https' if args.tls_ca else 'http'}://{args.target}/translate"

    async def send(text: str) -> tuple[str, int]:
        try:
            async with session.post(url, json={"q": text, "source": source, "target": target}) as response:
                body = await response.json(content_type=None)
                if response.status != 200:
                    return HTTP_CODES.get(response.status, f"HTTP_{response.status}"), 0, 1
                return "OK", len(tokenizer.encode(body["translatedText"])), 1
        except asyncio.TimeoutError:
            return "DEADLINE_EXCEEDED", 0, 1
        except aiohttp.ClientError:
            return "UNAVAILABLE", 0, 1

    return send


def grpc_channel(args) -> grpc.aio.Channel:
    """Plaintext, or TLS trusting --tls-ca (mutual with --tls-cert/--tls-key); with the service config
    (server/channel.py: round robin over the target's addresses, retries of UNAVAILABLE)."""
    if not args.tls_ca:
        return aio_channel(args.target)
    key, cert = (Path(p).read_bytes() if p else None for p in (args.tls_key, args.tls_cert))
    credentials = grpc.ssl_channel_credentials(Path(args.tls_ca).read_bytes(), key, cert)
    options = [("grpc.ssl_target_name_override", args.tls_server_name)] if args.tls_server_name else []
    return aio_channel(args.target, credentials, options)


def tls_context(args) -> ssl.SSLContext | None:
    if not args.tls_ca:
        return None
    context = ssl.create_default_context(cafile=args.tls_ca)
    if args.tls_cert:
        context.load_cert_chain(args.tls_cert, args.tls_key)
    return context


async def one_request(send: Send, profile: Profile, run: Run, progress) -> None:
    text, tokens = profile.next()
    start = time.perf_counter()
    code, output_tokens, attempts = await send(text)
    result = Result(tokens, time.perf_counter() - start, code, output_tokens, attempts=attempts)
    result.started = start
    run.results.append(result)
    progress()


async def drive(args, profile: Profile, concurrency: int, rate: float) -> Run:
    run = Run("open" if rate else "closed", concurrency, rate)
    done = {"n": 0}
    bar_every = max(1, args.requests // 20)

    def progress() -> None:
        done["n"] += 1
        if done["n"] % bar_every == 0 or done["n"] == args.requests:
            width = 30 * done["n"] // args.requests
            print(
                f"\r[{'#' * width}{'.' * (30 - width)}] {done['n']}/{args.requests}",
                end="",
                file=sys.stderr,
                flush=True,
            )

    peak = {"translate_kv_cache_bytes": 0.0, "process_resident_memory_bytes": 0.0}

    async def sample_peaks() -> None:
        while True:
            values = await asyncio.to_thread(scrape, args.metrics)
            for name in peak:
                peak[name] = max(peak[name], values.get(name, 0.0))
            await asyncio.sleep(0.25)

    before = scrape(args.metrics)
    sampler = asyncio.create_task(sample_peaks()) if args.metrics else None
    end_by = time.monotonic() + args.duration
    async with AsyncExitStack() as stack:
        if args.api == "http":
            timeout = aiohttp.ClientTimeout(total=args.deadline)
            # one connection per client, as gRPC multiplexes its one
            connector = aiohttp.TCPConnector(limit=0, ssl=tls_context(args) or True)
            session = await stack.enter_async_context(aiohttp.ClientSession(timeout=timeout, connector=connector))
            send = http_sender(session, args, profile.tokenizer)
        else:
            send = grpc_sender(await stack.enter_async_context(grpc_channel(args)), args)
        start = time.perf_counter()
        if rate:  # open loop: Poisson arrivals, answered or not
            tasks = []
            for _ in range(args.requests):
                if time.monotonic() > end_by:
                    break
                tasks.append(asyncio.create_task(one_request(send, profile, run, progress)))
                await asyncio.sleep(profile.rng.expovariate(rate))
            await asyncio.gather(*tasks)
        else:  # closed loop: each client sends its next request when the last is answered
            remaining = {"n": args.requests}

            async def client() -> None:
                while remaining["n"] > 0 and time.monotonic() < end_by:
                    remaining["n"] -= 1
                    await one_request(send, profile, run, progress)

            await asyncio.gather(*(client() for _ in range(concurrency)))
        run.seconds = time.perf_counter() - start
    if sampler:
        sampler.cancel()
    after = scrape(args.metrics)
    run.server = {
        f"{k}_delta": after.get(k, 0.0) - before.get(k, 0.0) for k in after if k.endswith(("_sum", "_count", "_total"))
    }
    run.server.update({f"{k}_peak": v for k, v in peak.items()})
    print(file=sys.stderr)
    return run


def summarize(run: Run) -> dict:
    ok = [r for r in run.results if r.code == "OK"]
    codes: dict[str, int] = {}
    for r in run.results:
        codes[r.code] = codes.get(r.code, 0) + 1
    buckets: dict[str, list[float]] = {}
    for r in ok:
        buckets.setdefault(length_bucket(r.input_tokens), []).append(r.latency)

    def stats(latencies: list[float]) -> dict[str, float]:
        return {
            "count": len(latencies),
            "p50": percentile(latencies, 0.5),
            "p90": percentile(latencies, 0.9),
            "p99": percentile(latencies, 0.99),
            "max": max(latencies, default=float("nan")),
        }

    s = run.server
    return {
        "mode": run.mode,
        "concurrency": run.concurrency,
        "rate": run.rate,
        "requests": len(run.results),
        "seconds": run.seconds,
        "requests_per_second": len(ok) / run.seconds if run.seconds else 0.0,
        "input_tokens_per_second": sum(r.input_tokens for r in ok) / run.seconds if run.seconds else 0.0,
        "output_tokens_per_second": sum(r.output_tokens for r in ok) / run.seconds if run.seconds else 0.0,
        "latency": stats([r.latency for r in ok]),
        "by_length": {
            b: stats(v) for b, v in sorted(buckets.items(), key=lambda kv: int(kv[0].split("-")[0].rstrip("+")))
        },
        "codes": codes,
        "server": s,
        "answered": len(ok),
        "lost": len(run.results) - len(ok),
        "retried": sum(r.attempts > 1 for r in run.results),
        "server_mean_queue_wait_seconds": s.get("translate_queue_wait_seconds_sum_delta", 0)
        / max(s.get("translate_queue_wait_seconds_count_delta", 0), 1),
        "server_mean_batch_sentences": s.get("translate_batch_size_sentences_sum_delta", 0)
        / max(s.get("translate_batch_size_sentences_count_delta", 0), 1),
    }


def markdown(summaries: list[dict], command: str) -> str:
    lines = [
        f"command: `{command}`",
        "",
        "| mode | concurrency / rate | sent | answered / retried / lost | req/s | in tok/s | p50 s | p90 s | p99 s "
        "| max s | codes | server batch | server queue wait s | peak KV bytes | peak RSS MiB |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for s in summaries:
        lat, srv = s["latency"], s["server"]
        load = f"{s['rate']}/s" if s["mode"] == "open" else str(s["concurrency"])
        lines.append(
            f"| {s['mode']} | {load} | {s['requests']} | {s['answered']} / {s['retried']} / {s['lost']} | "
            f"{s['requests_per_second']:.1f} | {s['input_tokens_per_second']:.0f} | "
            f"{lat['p50']:.3f} | {lat['p90']:.3f} | {lat['p99']:.3f} | {lat['max']:.3f} | {s['codes']} | "
            f"{s['server_mean_batch_sentences']:.1f} | {s['server_mean_queue_wait_seconds']:.3f} | "
            f"{srv.get('translate_kv_cache_bytes_peak', 0):.0f} | "
            f"{srv.get('process_resident_memory_bytes_peak', 0) / 2**20:.0f} |"
        )
    lines += ["", "| length bucket | count | p50 s | p99 s |", "|---|---|---|---|"]
    for s in summaries:
        for bucket, b in s["by_length"].items():
            lines.append(
                f"| {bucket} ({s['mode']} {s['concurrency'] or s['rate']}) | {b['count']} | "
                f"{b['p50']:.3f} | {b['p99']:.3f} |"
            )
    return "\n".join(lines) + "\n"


def plot(runs: list[Run], summaries: list[dict], out: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    fig, ax = plt.subplots(figsize=(7, 4.5))
    answered = 0
    for run in runs:
        ok = [r for r in run.results if r.code == "OK"]
        answered += len(ok)
        label = f"{run.mode} {run.concurrency or run.rate}"
        ax.scatter([r.input_tokens for r in ok], [r.latency for r in ok], s=8, alpha=0.5, label=label)
    ax.set(xlabel="input tokens", ylabel="latency (s)", title="Latency vs input length (answered requests)")
    if answered:
        ax.set(xscale="log", yscale="log")
        ax.legend()
    paths.append(out / "latency_vs_length.png")
    fig.savefig(paths[-1], dpi=110, bbox_inches="tight")
    closed = [s for s in summaries if s["mode"] == "closed"]
    if closed:
        fig, ax = plt.subplots(figsize=(7, 4.5))
        ax.plot([s["concurrency"] for s in closed], [s["requests_per_second"] for s in closed], marker="o")
        ax.set(xlabel="concurrent clients", ylabel="requests/s", title="Throughput vs concurrency", xscale="log")
        paths.append(out / "throughput_vs_concurrency.png")
        fig.savefig(paths[-1], dpi=110, bbox_inches="tight")
    plt.close("all")
    return paths


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The load generator's options (benchmarks drive ``drive`` with these too)."""
    parser = argparse.ArgumentParser(
        prog="translate-loadtest", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--api", choices=["grpc", "http"], default="grpc", help="the front end to drive")
    parser.add_argument("--target", help="host:port (default localhost:50051 for grpc, localhost:5000 for http)")
    parser.add_argument("--languages", default="en:de", help="source:target of each request (the model it goes to)")
    parser.add_argument("--metrics", default="http://localhost:9464/metrics", help="server metrics URL ('' to skip)")
    parser.add_argument("--tokenizer", type=Path, default=DEFAULT_MODEL_DIR / "sentencepiece.model")
    parser.add_argument("--profile", default="uniform:8-40")
    parser.add_argument("--concurrency", default="8", help="closed loop clients; a comma list sweeps them")
    parser.add_argument(
        "--rate", type=float, default=0.0, help="open loop: Poisson arrivals per second (overrides --concurrency)"
    )
    parser.add_argument("--requests", type=int, default=200, help="requests per run")
    parser.add_argument("--duration", type=float, default=300.0, help="seconds at most per run")
    parser.add_argument("--deadline", type=float, default=60.0, help="per-request deadline in seconds")
    parser.add_argument("--beam", type=int, default=0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--tls-ca", help="TLS: the CA to verify the server with (HTTP: https)")
    parser.add_argument("--tls-cert", help="mutual TLS: the client certificate")
    parser.add_argument("--tls-key", help="mutual TLS: the client key")
    parser.add_argument("--tls-server-name", help="TLS: the name to verify instead of the target's host")
    parser.add_argument("--out", type=Path, help="folder for report.json, report.md and the plots")
    args = parser.parse_args(argv)
    args.target = args.target or ("localhost:5000" if args.api == "http" else "localhost:50051")
    if args.api == "http" and args.beam:
        parser.error("--beam applies to grpc only: the HTTP API decodes with the server's default beam")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    tokenizer = spm.SentencePieceProcessor(model_file=str(args.tokenizer))
    profile = Profile(args.profile, tokenizer, args.seed)
    loads = [(0, args.rate)] if args.rate else [(int(c), 0.0) for c in args.concurrency.split(",")]
    runs = [asyncio.run(drive(args, profile, concurrency, rate)) for concurrency, rate in loads]
    summaries = [summarize(run) for run in runs]
    command = "translate-loadtest " + " ".join(sys.argv[1:] if argv is None else argv)
    report = markdown(summaries, command)
    print(report)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "report.json").write_text(
            json.dumps(
                {"command": command, "runs": summaries, "results": [[asdict(r) for r in run.results] for run in runs]},
                indent=1,
            )
        )
        (args.out / "report.md").write_text(report)
        for path in plot(runs, summaries, args.out):
            print(f"wrote {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
