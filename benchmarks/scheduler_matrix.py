"""Continuous batching against static over a matrix of traffic mixes (not a test).

    python benchmarks/scheduler_matrix.py --data ../shared/data/multi30k --out benchmarks

Each cell is one traffic mix, offered open loop (Poisson arrivals) at a share of the capacity measured for it:
- the share of requests that are one sentence (--short, %); the rest are long: documents of 10-40 sentences
  (doc:10-40) or one run-on sentence of 100-1,000 tokens (run-on:100-1000) (--long);
- the offered rate as a share of the static scheduler's capacity (closed loop, 32 clients) (--load): the same
  offered load for both, so a scheduler with less capacity shows it;
- the translation cache off, or on with 0, 50 or 90% of the sentences repeating one sent before (--cache);
- one model (en→de) or two served at once, half the traffic each (--models);
- greedy or beam 4 (--beam).
Sentences come from the corpus's train split (--split; German for de→en), new ones in file order, so the cache
hits only the repeats asked for (a split shorter than a run starts over, and repeats itself). With the cache on,
a server starts afresh before each of its runs, so each run starts with an empty cache. Static and continuous
alternate within each repeat; medians of --repeats. "Short" requests are the single sentences (up to SHORT_MAX
tokens). The load generator runs in this process, on the same cores.

Writes scheduler_matrix.md (every cell, each scheduler: throughput, short p50/p99, long p99, errors) and
scheduler_matrix.png: a heat map of continuous / static short p99 (below 1: continuous is better). The whole
matrix is 288 cells, about 12 hours at the default 30 s runs: pick slices with the factor flags.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import statistics
import sys
import time
from dataclasses import astuple, dataclass
from pathlib import Path

import sentencepiece as spm

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from client import loadtest, loadtest_report  # noqa: E402
from common.corpus import MULTI30K  # noqa: E402
from runtime.cpu import describe_cpu  # noqa: E402
from server.config import DEFAULT_MODELS  # noqa: E402
from testkit.servers import start_subprocess_server  # noqa: E402

SCHEDULERS = ("static", "continuous")
MODELS = tuple(DEFAULT_MODELS)  # en→de, de→en
PAIRS = ("en:de", "de:en")  # their traffic's languages
# A single Multi30k sentence has at most about 60 tokens; a document of 10 or more, or a run-on sentence of
# 100 or more, has more.
SHORT_MAX = 64
CAPACITY_CLIENTS = 32
CACHE_MIB = 64  # the server's default


@dataclass(frozen=True)
class Cell:
    models: int  # 1: en→de; 2: en→de and de→en at once
    cache: str  # "off", or the share of sentences repeated with the cache on ("0", "50", "90")
    beam: int
    long: str  # "doc:10-40" or "run-on:100-1000"
    short: int  # % of requests that are one sentence
    load: float  # offered rate / capacity

    def profiles(self, corpus: Path) -> list[tuple[str, str]]:
        """(languages, profile spec) of each model's traffic, from ``corpus``.LANG.gz (e.g. multi30k/train)."""
        repeated = 0 if self.cache == "off" else int(self.cache)
        return [
            (languages, f"corpus:{corpus}.{languages[:2]}.gz:{self.short}:{self.long}:{repeated}")
            for languages in PAIRS[: self.models]
        ]


class Servers:
    """A static and a continuous server with one cell's models and cache setting."""

    def __init__(self, models: int, cache: str) -> None:
        self.models, self.cache = models, cache
        self.running: dict[str, tuple] = {}

    def start(self, names: tuple[str, ...] = SCHEDULERS) -> dict[str, int]:
        """(Re)start the servers of ``names`` (an empty cache); every server's gRPC port."""
        self.stop(names)
        first, *others = MODELS[: self.models]
        flags = [flag for model in others for flag in ("--model", str(model))]
        cache = ["--cache-mib", "0" if self.cache == "off" else str(CACHE_MIB)]
        for name in names:
            self.running[name] = start_subprocess_server(first, *flags, *cache, "--scheduler", name)
        return {name: port for name, (_, port, _) in self.running.items()}

    def stop(self, names: tuple[str, ...] = SCHEDULERS) -> None:
        for name in names:
            if name in self.running:
                process, _, _ = self.running.pop(name)
                process.terminate()
                process.wait(30)


def run_load(port: int, cell: Cell, corpus: Path, tokenizers: dict, rate: float, seconds: float, seed: int) -> dict:
    """One run of the cell's traffic: open loop at ``rate`` requests/s in all (closed loop of
    CAPACITY_CLIENTS clients when 0), split evenly between the models."""
    profiles = cell.profiles(corpus)

    async def both() -> list:
        runs = []
        for languages, spec in profiles:
            args = loadtest.bounded(port, 10**9, seconds, "--languages", languages, "--beam", str(cell.beam))
            profile = loadtest.Profile(spec, tokenizers[languages], seed)
            clients = CAPACITY_CLIENTS // len(profiles) if not rate else 0
            runs.append(loadtest.drive(args, profile, clients, rate / len(profiles)))
        return await asyncio.gather(*runs)

    runs = asyncio.run(both())
    results = [r for run in runs for r in run.results]
    ok = [r for r in results if r.code == "OK"]
    short = [r.latency for r in ok if r.input_tokens <= SHORT_MAX]
    long = [r.latency for r in ok if r.input_tokens > SHORT_MAX]
    window_end = min(r.started for r in results) + seconds
    return {
        "requests_per_s": len(ok) / max(run.seconds for run in runs),  # all answered / time to the last answer
        # answered while requests were still being sent: a scheduler that answers long requests later is
        # not charged for the tail it leaves at the end of a short run, only for falling behind
        "window_per_s": sum(r.started + r.latency <= window_end for r in ok) / seconds,
        "short_p50": loadtest_report.percentile(short, 0.5),
        "short_p99": loadtest_report.percentile(short, 0.99),
        "long_p99": loadtest_report.percentile(long, 0.99),
        "errors": len(results) - len(ok),
    }


def measure(cells: list[Cell], args) -> dict[Cell, dict]:
    tokenizers = {
        languages: spm.SentencePieceProcessor(model_file=str(model / "sentencepiece.model"))
        for languages, model in zip(PAIRS, MODELS, strict=True)
    }
    measured: dict[Cell, dict] = {}
    by_servers = itertools.groupby(cells, key=lambda c: (c.models, c.cache))
    for (models, cache), group in by_servers:
        servers = Servers(models, cache)
        ports = servers.start() if cache == "off" else {}  # with the cache on, (re)started before each run
        try:
            capacity: dict[tuple, dict[str, float]] = {}
            for cell in group:
                mix = astuple(cell)[:-1]
                if mix not in capacity:  # the loads of one mix share its capacity
                    if cache != "off":
                        ports = servers.start()
                    capacity[mix] = {
                        name: run_load(ports[name], cell, args.corpus, tokenizers, 0, args.capacity_seconds, 0)[
                            "requests_per_s"
                        ]
                        for name in SCHEDULERS
                    }
                rate = cell.load * capacity[mix]["static"]
                runs: dict[str, list[dict]] = {name: [] for name in SCHEDULERS}
                for repeat in range(args.repeats):
                    for name in SCHEDULERS if repeat % 2 == 0 else SCHEDULERS[::-1]:
                        if cache != "off":
                            ports = servers.start((name,))
                        runs[name].append(
                            run_load(ports[name], cell, args.corpus, tokenizers, rate, args.seconds, repeat + 1)
                        )
                measured[cell] = {
                    "capacity": capacity[mix],
                    "rate": rate,
                    **{name: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for name, rs in runs.items()},
                }
                print(cell, json.dumps(measured[cell]), file=sys.stderr, flush=True)
        finally:
            servers.stop()
    return measured


def report(measured: dict[Cell, dict], args, started: float) -> list[str]:
    lines = [
        f"command: `python benchmarks/scheduler_matrix.py {' '.join(sys.argv[1:])}`",
        f"machine: {describe_cpu()}; {args.seconds:.0f} s per run, medians of {args.repeats}, schedulers "
        f"alternating; capacity: closed loop of {CAPACITY_CLIENTS} clients for {args.capacity_seconds:.0f} s; "
        f"short = one sentence (up to {SHORT_MAX} tokens); {time.monotonic() - started:.0f} s in all",
        "",
        "| models | cache (repeated %) | search | long | short % | load | capacity static / continuous req/s "
        "| offered req/s | scheduler | throughput req/s | short p50 s | short p99 s | long p99 s | errors |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for cell, m in measured.items():
        capacity = f"{m['capacity']['static']:.1f} / {m['capacity']['continuous']:.1f}"
        for name in SCHEDULERS:
            r = m[name]
            lines.append(
                f"| {cell.models} | {cell.cache} | {search_name(cell.beam)} | {cell.long} | {cell.short} "
                f"| {cell.load:.0%} | {capacity} | {m['rate']:.1f} | {name} "
                f"| {r['requests_per_s']:.2f} | {r['short_p50']:.3f} | {r['short_p99']:.3f} | {r['long_p99']:.3f} "
                f"| {r['errors']:.0f} |"
            )
    lines += [
        "",
        "| cell | continuous / static short p99 | continuous / static throughput | continuous / static capacity |",
        "|---|---|---|---|",
    ]
    for cell, m in measured.items():
        s, c = m["static"], m["continuous"]
        lines.append(
            f"| {label(cell)} | {c['short_p99'] / s['short_p99']:.2f} | "
            f"{c['requests_per_s'] / s['requests_per_s']:.2f} | "
            f"{m['capacity']['continuous'] / m['capacity']['static']:.2f} |"
        )
    return lines


def search_name(beam: int) -> str:
    return "greedy" if beam == 1 else f"beam {beam}"


def label(cell: Cell) -> str:
    cache = "cache off" if cell.cache == "off" else f"cache {cell.cache}% rep."
    return (
        f"{cell.models} model{'s' if cell.models > 1 else ''}, {cache}, {search_name(cell.beam)}, {cell.long}, "
        f"{cell.short}% short, {cell.load:.0%} load"
    )


def heat_map(measured: dict[Cell, dict], path: Path) -> None:
    """Rows: long kind, short share, cache; columns: models, search, load."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    rows = sorted({(c.long, c.short, c.cache) for c in measured})
    columns = sorted({(c.models, c.beam, c.load) for c in measured})
    ratio = np.full((len(rows), len(columns)), np.nan)
    for cell, m in measured.items():
        row, column = (
            rows.index((cell.long, cell.short, cell.cache)),
            columns.index((cell.models, cell.beam, cell.load)),
        )
        ratio[row, column] = m["continuous"]["short_p99"] / m["static"]["short_p99"]
    figure, axes = plt.subplots(figsize=(2 + 0.9 * len(columns), 1.5 + 0.45 * len(rows)))
    image = axes.imshow(np.log2(ratio), cmap="RdYlGn_r", vmin=-3, vmax=3, aspect="auto")
    for (i, j), value in np.ndenumerate(ratio):
        if not np.isnan(value):
            axes.text(j, i, f"{value:.2f}", ha="center", va="center", fontsize=8)
    axes.set_xticks(range(len(columns)), [f"{m}m {search_name(b)}\n{load:.0%}" for m, b, load in columns], fontsize=7)
    axes.set_yticks(range(len(rows)), [f"{long} {short}% {cache}" for long, short, cache in rows], fontsize=7)
    axes.set_title("continuous / static short p99\n(below 1: continuous better)", fontsize=9)
    figure.colorbar(image, label="log2 of the ratio")
    figure.tight_layout()
    figure.savefig(path, dpi=110)


def comma_list(kind):
    return lambda text: [kind(part) for part in text.split(",")]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, default=MULTI30K)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks")
    parser.add_argument(
        "--split",
        default="train",
        help="the corpus split the sentences come from (test_2016_flickr: a pool of 1,000 that repeats after its end)",
    )
    parser.add_argument("--short", type=comma_list(int), default=[50, 80, 95])
    parser.add_argument("--long", type=comma_list(str), default=["doc:10-40", "run-on:100-1000"])
    parser.add_argument("--load", type=comma_list(float), default=[0.5, 0.7, 0.9])
    parser.add_argument("--cache", type=comma_list(str), default=["off", "0", "50", "90"])
    parser.add_argument("--models", type=comma_list(int), default=[1, 2])
    parser.add_argument("--beam", type=comma_list(int), default=[1, 4])
    parser.add_argument("--seconds", type=float, default=30.0, help="one measured run")
    parser.add_argument("--capacity-seconds", type=float, default=15.0, help="one capacity run")
    parser.add_argument("--repeats", type=int, default=1)
    args = parser.parse_args(argv)
    args.corpus = args.data / args.split
    if not all(Path(f"{args.corpus}.{lang}.gz").exists() for lang in ("en", "de")):
        parser.error(f"no corpus at {args.data} ({args.split}.en.gz and {args.split}.de.gz)")
    cells = [
        Cell(models, cache, beam, long, short, load)
        for models, cache, beam, long, short, load in itertools.product(
            args.models, args.cache, args.beam, args.long, args.short, args.load
        )
    ]
    started = time.monotonic()
    measured = measure(cells, args)
    lines = report(measured, args, started)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "scheduler_matrix.md").write_text("\n".join(lines) + "\n")
    heat_map(measured, args.out / "scheduler_matrix.png")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
