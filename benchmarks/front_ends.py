"""Two models in one server, both front ends (not a test).

    python benchmarks/front_ends.py --data ../shared/data/multi30k --out benchmarks/front_ends.md

1. Idle memory per model: resident memory of a warm, idle server holding en→de alone, de→en alone, and both.
2. HTTP (the LibreTranslate API) against gRPC on the two-model server: closed loop, 1 / 8 / 64 clients, one
   test_2016_flickr sentence per request, en→de; the two front ends alternate within each repeat.
3. A mixed load of both pairs at once (English sources to en→de and German sources to de→en, each from its
   own closed-loop clients, over gRPC) under a small memory budget: each pair's throughput and latency, and the
   peaks of what the server reserved and held against the budget, sampled from its metrics port.

The clients run in this process on the same cores as the server: compare ratios within one run.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import threading
import time
import urllib.request
from pathlib import Path

import sentencepiece as spm

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from client import loadtest, loadtest_report  # noqa: E402
from common.corpus import MULTI30K  # noqa: E402
from runtime.cpu import describe_cpu  # noqa: E402
from server.config import DEFAULT_MODELS  # noqa: E402
from testkit.servers import free_port, start_subprocess_server  # noqa: E402

EN_DE, DE_EN = DEFAULT_MODELS
MIB = 1 << 20


def resident_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS")


def start(models: list[Path], *flags: str) -> tuple:
    """A server process on free ports: (process, gRPC port, metrics port, HTTP port)."""
    http_port = free_port()
    model_flags = [flag for model in models[1:] for flag in ("--model", str(model))]
    process, port, metrics_port = start_subprocess_server(
        models[0], *model_flags, "--http-port", str(http_port), *flags
    )
    return process, port, metrics_port, http_port


def stop(process) -> None:
    process.terminate()
    process.wait(30)


def idle_memory(settle_s: float = 3.0) -> list[tuple[str, float]]:
    rows = []
    for name, models in (("en→de", [EN_DE]), ("de→en", [DE_EN]), ("both", [EN_DE, DE_EN])):
        process, *_ = start(models)
        time.sleep(settle_s)
        rows.append((name, resident_bytes(process.pid) / MIB))
        stop(process)
    return rows


def drive(api: str, port: int, languages: str, profile: loadtest.Profile, clients: int, requests: int):
    args = loadtest.bounded(port, requests, 600, "--api", api, "--languages", languages, "--deadline", "120")
    return loadtest.drive(args, profile, clients, 0.0)


def summary(run) -> dict[str, float]:
    ok = [r.latency for r in run.results if r.code == "OK"]
    return {
        "req_s": len(ok) / run.seconds,
        "p50": loadtest_report.percentile(ok, 0.5),
        "p99": loadtest_report.percentile(ok, 0.99),
        "errors": len(run.results) - len(ok),
    }


def front_ends(data: Path, tokenizer, requests: int, repeats: int, concurrency: list[int]) -> list[str]:
    process, port, _, http_port = start([EN_DE, DE_EN])
    english = f"file:{data / 'test_2016_flickr.en.gz'}"
    runs: dict[tuple[int, str], list[dict]] = {}
    try:
        for repeat in range(repeats):
            for clients in concurrency:
                order = ("grpc", "http") if repeat % 2 == 0 else ("http", "grpc")
                for api in order:
                    target = port if api == "grpc" else http_port
                    profile = loadtest.Profile(english, tokenizer, repeat)
                    result = summary(asyncio.run(drive(api, target, "en:de", profile, clients, requests)))
                    runs.setdefault((clients, api), []).append(result)
                    print(f"\n{api} {clients} clients: {result}", file=sys.stderr, flush=True)
    finally:
        stop(process)
    lines = ["| clients | API | req/s | p50 s | p99 s | errors | HTTP / gRPC req/s |", "|---|---|---|---|---|---|---|"]
    for clients in concurrency:
        med = {
            api: {k: statistics.median(r[k] for r in runs[clients, api]) for k in runs[clients, api][0]}
            for api in ("grpc", "http")
        }
        for api in ("grpc", "http"):
            m = med[api]
            ratio = f"{med['http']['req_s'] / med['grpc']['req_s']:.2f}" if api == "http" else ""
            lines.append(
                f"| {clients} | {api} | {m['req_s']:.1f} | {m['p50']:.3f} | {m['p99']:.3f} | "
                f"{m['errors']:.0f} | {ratio} |"
            )
    return lines


class PeakSampler(threading.Thread):
    """Peaks of the server's memory gauges, read from its metrics port every 20 ms; ``held`` is the caches
    (self- and cross-attention) held at once."""

    NAMES = (
        "translate_memory_reserved_bytes",
        "translate_kv_cache_bytes",
        "translate_cross_attention_cache_bytes",
        "process_resident_memory_bytes",
    )

    def __init__(self, metrics_port: int) -> None:
        super().__init__(daemon=True)
        self.url = f"http://127.0.0.1:{metrics_port}/metrics"
        self.peaks = dict.fromkeys(self.NAMES + ("held",), 0.0)
        self.running = True

    def run(self) -> None:
        while self.running:
            body = urllib.request.urlopen(self.url, timeout=5).read().decode()
            values = {
                name: float(value)
                for name, _, value in (line.partition(" ") for line in body.splitlines())
                if name in self.NAMES
            }
            values["held"] = values["translate_kv_cache_bytes"] + values["translate_cross_attention_cache_bytes"]
            for name in self.peaks:
                self.peaks[name] = max(self.peaks[name], values[name])
            time.sleep(0.02)


def mixed(data: Path, tokenizers: dict[str, object], requests: int, clients: int, budget_mib: int) -> list[str]:
    process, port, metrics_port, _ = start([EN_DE, DE_EN], "--memory-budget-mib", str(budget_mib))
    idle = resident_bytes(process.pid)
    sampler = PeakSampler(metrics_port)
    sampler.start()

    async def both():
        english = loadtest.Profile(f"file:{data / 'test_2016_flickr.en.gz'}", tokenizers["en:de"], 1)
        german = loadtest.Profile(f"file:{data / 'test_2016_flickr.de.gz'}", tokenizers["de:en"], 2)
        return await asyncio.gather(
            drive("grpc", port, "en:de", english, clients, requests),
            drive("grpc", port, "de:en", german, clients, requests),
        )

    try:
        forward, backward = asyncio.run(both())
    finally:
        sampler.running = False
        sampler.join()
        stop(process)
    peaks = sampler.peaks
    lines = ["| pair | clients | req/s | p50 s | p99 s | errors |", "|---|---|---|---|---|---|"]
    for pair, run in (("en→de", forward), ("de→en", backward)):
        s = summary(run)
        lines.append(f"| {pair} | {clients} | {s['req_s']:.1f} | {s['p50']:.3f} | {s['p99']:.3f} | {s['errors']} |")
    lines += [
        "",
        f"memory budget {budget_mib} MiB: peak reserved by admission (the estimate the budget bounds) "
        f"{peaks['translate_memory_reserved_bytes'] / MIB:.1f} MiB; peak resident growth over idle "
        f"{(peaks['process_resident_memory_bytes'] - idle) / MIB:.1f} MiB (idle {idle / MIB:.0f} MiB); cache "
        f"buffers allocated at peak {peaks['held'] / MIB:.1f} MiB "
        "(reserved for the longest output, paged in as written)",
    ]
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, default=MULTI30K)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "front_ends.md")
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--concurrency", default="1,8,64")
    parser.add_argument("--mixed-clients", type=int, default=32, help="closed-loop clients per pair")
    parser.add_argument("--mixed-budget-mib", type=int, default=8, help="small enough to bind under the load")
    args = parser.parse_args()
    tokenizers = {
        pair: spm.SentencePieceProcessor(model_file=str(folder / "sentencepiece.model"))
        for pair, folder in (("en:de", EN_DE), ("de:en", DE_EN))
    }
    concurrency = [int(c) for c in args.concurrency.split(",")]
    memory = idle_memory()
    apis = front_ends(args.data, tokenizers["en:de"], args.requests, args.repeats, concurrency)
    mix = mixed(args.data, tokenizers, args.requests, args.mixed_clients, args.mixed_budget_mib)
    lines = [
        f"command: `python benchmarks/front_ends.py {' '.join(sys.argv[1:])}`",
        f"machine: {describe_cpu()}, clients in one process on the same cores; "
        f"default server settings (fp32, continuous, lanes 64); {args.requests} requests per run",
        "",
        "Idle resident memory (warm server, no requests):",
        "",
        "| models | RSS MiB |",
        "|---|---|",
        *[f"| {name} | {mib:.0f} |" for name, mib in memory],
        "",
        f"HTTP vs gRPC, en→de, test_2016_flickr sentences, medians of {args.repeats}, front ends alternating:",
        "",
        *apis,
        "",
        f"Both pairs at once, {args.mixed_clients} closed-loop clients each (gRPC), test_2016_flickr sources:",
        "",
        *mix,
    ]
    args.out.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
