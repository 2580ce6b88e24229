"""Load generator for the translation API: ``translate-loadtest`` (or ``python -m client.loadtest``).

Closed loop (``--concurrency N``, or a sweep ``--concurrency 1,8,64``) or open
loop (``--rate R`` Poisson arrivals per second); bounded by ``--requests``
and ``--duration``, each request with a ``--deadline``. Input lengths come
from a profile:

  file:PATH             real sentences, one per line (.gz allowed)
  fixed:N               texts of N tokens
  uniform:A-B           lengths drawn uniformly from A..B tokens
  mix:P:A-B:C-D         P% short texts (A..B tokens), the rest long (C..D tokens)
  corpus:PATH:P:doc:A-B:R
  corpus:PATH:P:run-on:A-B:R
                        P% one sentence of PATH, the rest documents of A..B
                        of its sentences (doc) or one sentence of A..B tokens
                        made of its sentences as clauses (run-on); R% of the
                        sentences repeat one sent before (a translation cache
                        can answer them), the others are new, in file order

Generated texts are made of short filler sentences; append ``:run-on`` to a
fixed/uniform/mix profile for texts that are one sentence each (no sentence
breaks, so the server cannot split a long text into short sentences).

``--api http`` drives the LibreTranslate HTTP API (``--target 127.0.0.1:5000``, ``POST /translate``
with ``--languages en:de``) instead of gRPC, so both front ends are measured the same way; HTTP statuses
are reported under their gRPC twins' names (server/errors.py) and output tokens are the translation
re-tokenized (HTTP does not return the count).

Reports throughput, latency percentiles overall and per length bucket, errors
by status code, and the server's metric deltas (scraped from ``--metrics``),
as JSON and Markdown, with PNG plots when ``--out`` is given.
"""

from __future__ import annotations

import asyncio
import json
import random
import ssl
import sys
import time
import urllib.parse
from collections.abc import Awaitable, Callable, Sequence
from contextlib import AsyncExitStack
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Literal

import aiohttp
import grpc
import sentencepiece as spm

from client.channel import aio_channel, target_problem
from client.loadtest_report import THREAD_CPU, Result, Run, markdown, plot, scrape, summarize
from common import flags
from common.corpus import read_lines
from common.flags import setting
from proto import translate_pb2, translate_pb2_grpc
from server.config import DEFAULT_MODEL_DIR
from server.errors import grpc_code_of_http
from server.operations.access import ATTEMPT_HEADER

FILLER = [
    "A man in a blue shirt is walking down the street with his dog.",
    "Two children are playing with a ball in the park near the river.",
    "A woman is sitting on a bench and reading a book in the sun.",
    "A group of people are standing in front of a large old building.",
    "A young boy jumps into the water while his friends watch him.",
]


class Profile:
    """Texts with a requested number of source tokens, as the server's tokenizer counts them."""

    KINDS = "use file:PATH, fixed:N, uniform:A-B, mix:P:A-B:C-D (+ :run-on) or corpus:PATH:P:doc|run-on:A-B:R"

    def __init__(self, spec: str, tokenizer: spm.SentencePieceProcessor, seed: int = 0) -> None:
        self.spec, self.tokenizer, self.rng = spec, tokenizer, random.Random(seed)
        kind, _, rest = spec.partition(":")
        if kind not in ("file", "fixed", "uniform", "mix", "corpus"):
            raise ValueError(f"unknown profile {spec!r}: {self.KINDS}")
        self.run_on = kind not in ("file", "corpus") and rest.endswith(":run-on")
        rest = rest.removesuffix(":run-on") if self.run_on else rest
        self.lines: list[str] = []
        self.sent: list[str] = []  # corpus: the sentences sent so far, which repeats draw from
        if kind == "file":
            self.lines = read_lines(rest)
        elif kind == "corpus":
            self._corpus(spec, rest)
        self.kind, self.args = kind, rest

    def _corpus(self, spec: str, rest: str) -> None:
        try:
            path, share, long, lengths, repeated = rest.rsplit(":", 4)
            self.share, self.repeated, self.long_range = float(share), float(repeated), self._range(lengths)
        except ValueError:
            raise ValueError(f"bad profile {spec!r}: {self.KINDS}") from None
        if long not in ("doc", "run-on"):
            raise ValueError(f"bad profile {spec!r}: long texts are doc or run-on, not {long!r}")
        self.run_on = long == "run-on"
        self.lines = read_lines(path)
        self.fresh = self.rng.randrange(len(self.lines))  # where new sentences are taken from, in file order

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

    def sentence(self) -> str:
        """corpus: one of the sentences sent before (R% of the time), or the file's next one."""
        if self.sent and self.rng.random() * 100 < self.repeated:
            return self.rng.choice(self.sent)
        text = self.lines[self.fresh % len(self.lines)]
        self.fresh += 1
        self.sent.append(text)
        return text

    def text_of_length(self, tokens: int) -> str:
        """Sentences (filler, or the corpus's) joined until the text has ``tokens`` tokens, then cut to exactly
        that. Run-on texts join them as clauses (no sentence-ending punctuation)."""
        pieces, count = [], 0
        while count < tokens:
            sentence = self.sentence() if self.kind == "corpus" else self.rng.choice(FILLER)
            if self.run_on:
                sentence = sentence.rstrip(". ") + (" and" if pieces else "")
            pieces.append(sentence)
            count += len(self.tokenizer.encode(sentence))
        ids, cut = self.tokenizer.encode(" ".join(pieces)), tokens
        while True:  # re-tokenizing the cut text can merge or split pieces: cut until it fits
            text = self.tokenizer.decode(ids[:cut])
            excess = len(self.tokenizer.encode(text)) - tokens
            if excess <= 0 or cut <= 1:
                return text
            cut -= excess

    def corpus_text(self) -> str:
        if self.rng.random() * 100 < self.share:
            return self.sentence()
        size = self.rng.randint(*self.long_range)
        return self.text_of_length(size) if self.run_on else " ".join(self.sentence() for _ in range(size))

    def next(self) -> tuple[str, int]:
        if self.kind == "file":
            text = self.rng.choice(self.lines)
        elif self.kind == "corpus":
            text = self.corpus_text()
        else:
            text = self.text_of_length(self.length())
        return text, len(self.tokenizer.encode(text))


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
                    return grpc_code_of_http(response.status), 0, 1  # so both APIs report alike
                return "OK", len(tokenizer.encode(body["translatedText"])), 1
        except asyncio.TimeoutError:
            return "DEADLINE_EXCEEDED", 0, 1
        except aiohttp.ClientError:
            return "UNAVAILABLE", 0, 1

    return send


def grpc_channel(args) -> grpc.aio.Channel:
    """Plaintext, or TLS trusting --tls-ca (mutual with --tls-cert/--tls-key); with the service config
    (client/channel.py: round robin over the target's addresses, retries of UNAVAILABLE)."""
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
        start, cpu_start = time.perf_counter(), time.process_time()
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
        run.client_cpu_seconds = time.process_time() - cpu_start
    if sampler:
        sampler.cancel()
    after = scrape(args.metrics)
    run.server = {
        f"{k}_delta": after.get(k, 0.0) - before.get(k, 0.0)
        for k in after
        if k.endswith(("_sum", "_count", "_total")) or k.startswith(THREAD_CPU)
    }
    run.server.update({f"{k}_peak": v for k, v in peak.items()})
    print(file=sys.stderr)
    return run


@dataclass(frozen=True)
class LoadTest:
    """The load generator's options (benchmarks drive ``drive`` with these too)."""

    api: Literal["grpc", "http"] = setting("grpc", "the front end to drive")
    target: str = setting("", "host:port (default 127.0.0.1:50051 for grpc, 127.0.0.1:5000 for http)")
    languages: str = setting("en:de", "source:target of each request (the model it goes to)")
    metrics: str = setting("http://127.0.0.1:9464/metrics", "the server's metrics URL ('' to skip)")
    tokenizer: Path = setting(DEFAULT_MODEL_DIR / "sentencepiece.model", "counts the tokens of inputs and outputs")
    profile: str = setting(
        "uniform:8-40",
        "input lengths: file:PATH, fixed:N, uniform:A-B, mix:P:A-B:C-D or corpus:PATH:P:doc|run-on:A-B:R",
    )
    concurrency: tuple[int, ...] = setting((8,), "closed loop clients; a comma list sweeps them")
    rate: float = setting(0.0, "open loop: Poisson arrivals per second (overrides --concurrency)")
    requests: int = setting(200, "requests per run")
    duration: float = setting(300.0, "seconds at most per run")
    deadline: float = setting(60.0, "per-request deadline in seconds")
    beam: int = setting(0, "beam size (0: the server's default; grpc only)")
    seed: int = setting(0, "random seed of the profile")
    tls_ca: str | None = setting(None, "TLS: the CA to verify the server with (HTTP: https)")
    tls_cert: str | None = setting(None, "mutual TLS: the client certificate")
    tls_key: str | None = setting(None, "mutual TLS: the client key")
    tls_server_name: str | None = setting(None, "TLS: the name to verify instead of the target's host")
    out: Path | None = setting(None, "folder for report.json, report.md and the plots")

    def __post_init__(self) -> None:
        if not self.target:
            object.__setattr__(self, "target", "127.0.0.1:5000" if self.api == "http" else "127.0.0.1:50051")
        problems = flags.choice_problems(self)
        if problem := target_problem(self.target):
            problems.append(f"--target {problem}")
        if self.metrics and urllib.parse.urlsplit(self.metrics).scheme not in ("http", "https"):
            problems.append(f"--metrics {self.metrics!r}: give its URL, e.g. http://{self.metrics}/metrics")
        if self.api == "http" and self.beam:
            problems.append("--beam applies to grpc only: the HTTP API decodes with the server's default beam")
        if problems:
            raise ValueError("; ".join(problems))


def parse_args(argv: Sequence[str] | None = None) -> LoadTest:
    return flags.command(LoadTest, argv, "translate-loadtest", __doc__)


def bounded(port: int, requests: int, seconds: float = 600, *more: str) -> LoadTest:
    """A benchmark's run against a server on 127.0.0.1:``port``: at most ``requests`` requests in at most
    ``seconds``, no metrics scraped, and ``more`` flags (--api, --deadline, ...)."""
    return parse_args(
        [
            "--target",
            f"127.0.0.1:{port}",
            "--metrics",
            "",
            "--requests",
            str(requests),
            "--duration",
            str(seconds),
            *more,
        ]
    )


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    tokenizer = spm.SentencePieceProcessor(model_file=str(args.tokenizer))
    profile = Profile(args.profile, tokenizer, args.seed)
    loads = [(0, args.rate)] if args.rate else [(c, 0.0) for c in args.concurrency]
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
