"""What a glossary costs the server, in CPU (not a test): the server process's CPU seconds per single-sentence
request under closed-loop gRPC clients, without a glossary, with a 50-entry inline glossary, and with a
10,000-entry stored one, the three alternating within each repeat:

    python benchmarks/glossary_cost.py --data ../shared/data/multi30k --out benchmarks/glossary_cost.md

The sentences are test_2016_flickr's English ones, en→de. The glossaries are what a product team would write:
the 50 inline entries are the 50 most frequent words of the train split's English side that are at least 4
letters long (so about as many requests hold a term as real traffic with a glossary of common product words
would; the report gives the share), each mapped to a target term; a rarer 50 are the words ranked 1,000-1,049
(a product's own terms, which most requests lack); the stored one holds the same 50 as the first and 9,950
terms that never occur, so the two differ only in the glossary's size, which matching must not pay for
(pyahocorasick: linear in the text); a second stored one holds the rarer 50 and the same 9,950. The server runs
with its defaults (the variant and beam it chooses), and the cache and the runaway guard off; its CPU is read
by psutil, so the clients' is not counted.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import gzip
import statistics
import subprocess
import sys
import time
from pathlib import Path

import grpc
import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from proto import translate_pb2, translate_pb2_grpc  # noqa: E402
from runtime.cpu import describe_cpu  # noqa: E402

INLINE_ENTRIES, STORED_ENTRIES = 50, 10_000
SETTLE = 200  # sentences each run sends unmeasured first
RARER_FROM = 1_000  # the rarer glossary: the train split's words ranked 1,000-1,049 by frequency


def cpu_seconds(process: psutil.Process) -> float:
    times = process.cpu_times()
    return times.user + times.system


def common_words(train: Path, count: int) -> list[str]:
    counts: collections.Counter[str] = collections.Counter()
    with gzip.open(train, "rt", encoding="utf-8") as lines:
        for line in lines:
            counts.update(w for w in line.lower().split() if w.isalpha() and len(w) >= 4)
    return [word for word, _ in counts.most_common(count)]


async def drive(port: int, sentences: list[str], clients: int, options: translate_pb2.TranslateOptions) -> int:
    """Every sentence once, one per request, ``clients`` at a time; the entries applied in all."""
    applied = 0
    queue = list(reversed(sentences))
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = translate_pb2_grpc.TranslatorStub(channel)

        async def client() -> None:
            nonlocal applied
            while queue:
                text = queue.pop()
                request = translate_pb2.TranslateRequest(
                    texts=[text], source_language="en", target_language="de", options=options
                )
                reply = await stub.Translate(request, timeout=60)
                applied += sum(reply.translations[0].glossary_applied.values())

        await asyncio.gather(*(client() for _ in range(clients)))
    return applied


async def create(port: int, entries: dict[str, str]) -> str:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = translate_pb2_grpc.TranslatorStub(channel)
        request = translate_pb2.CreateGlossaryRequest(
            name="cost", source_language="en", target_language="de", entries=entries
        )
        return (await stub.CreateGlossary(request, timeout=60)).glossary_id


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, required=True)
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--port", type=int, default=53051)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    with gzip.open(args.data / "test_2016_flickr.en.gz", "rt", encoding="utf-8") as lines:
        sentences = [line.strip() for line in lines if line.strip()]
    words = common_words(args.data / "train.en.gz", RARER_FROM + INLINE_ENTRIES)
    inline = {word: f"Begriff{i}" for i, word in enumerate(words[:INLINE_ENTRIES])}
    rarer = {word: f"Begriff{i}" for i, word in enumerate(words[RARER_FROM:])}
    unused = {f"unusedterm{i:05d}": f"Unbenutzt{i}" for i in range(STORED_ENTRIES - INLINE_ENTRIES)}
    stored, stored_rarer = {**inline, **unused}, {**rarer, **unused}
    flags = ["--host", "127.0.0.1", "--port", str(args.port), "--http-port", "0", "--metrics-port", "0"]
    flags += ["--cache-mib", "0", "--max-repeats", "0", "--access-log", "false"]
    process = subprocess.Popen(
        [sys.executable, "-m", "server", *flags], cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    server = psutil.Process(process.pid)
    try:
        deadline = time.monotonic() + 180
        while True:
            try:
                glossary_id = asyncio.run(create(args.port, stored))
                rarer_id = asyncio.run(create(args.port, stored_rarer))
                break
            except grpc.RpcError:
                if time.monotonic() > deadline or process.poll() is not None:
                    raise
                time.sleep(0.5)
        variants = {
            "none": translate_pb2.TranslateOptions(),
            f"inline, {len(inline)} entries": translate_pb2.TranslateOptions(glossary=inline),
            f"inline, {len(rarer)} rarer entries": translate_pb2.TranslateOptions(glossary=rarer),
            f"stored, {len(stored)} entries": translate_pb2.TranslateOptions(glossary_id=glossary_id),
            f"stored, {len(stored_rarer)} entries, the rarer 50 among them": translate_pb2.TranslateOptions(
                glossary_id=rarer_id
            ),
        }
        cpu: dict[str, list[float]] = {name: [] for name in variants}
        applied: dict[str, int] = {}
        for repeat in range(args.repeats):
            order = list(variants) if repeat % 2 == 0 else list(variants)[::-1]
            for name in order:
                # unmeasured first: the server's state after the previous variant (its memory, once returned to the
                # system while idle) is this variant's own before it is measured
                asyncio.run(drive(args.port, sentences[:SETTLE], args.clients, variants[name]))
                before = cpu_seconds(server)
                applied[name] = asyncio.run(drive(args.port, sentences, args.clients, variants[name]))
                cpu[name].append((cpu_seconds(server) - before) / len(sentences))
                print(name, repeat, cpu[name][-1], flush=True)
    finally:
        process.terminate()
        process.wait(30)
    holding = sum(any(w in s.lower().split() for w in inline) for s in sentences)
    holding_rarer = sum(any(w in s.lower().split() for w in rarer) for s in sentences)
    base = statistics.median(cpu["none"])
    lines = [
        "# What a glossary costs the server (CPU)",
        "",
        f"command: `python benchmarks/glossary_cost.py {' '.join(sys.argv[1:])}`",
        f"machine: {describe_cpu()}; {args.clients} closed-loop gRPC clients on the same cores, "
        f"{len(sentences)} test_2016_flickr sentences per run, one per request; medians of {args.repeats}, "
        "variants alternating; cache and runaway guard off.",
        "",
        f"Requests holding one of the 50 terms: {holding} of {len(sentences)} ({holding / len(sentences):.0%}); one "
        f"of the 50 rarer terms: {holding_rarer} ({holding_rarer / len(sentences):.0%}).",
        "",
        "| glossary | server CPU ms per request | against none (median of each repeat's) | entries applied per run |",
        "|---|---|---|---|",
    ]
    for name in variants:
        median = statistics.median(cpu[name])
        paired = statistics.median(mine / none for mine, none in zip(cpu[name], cpu["none"], strict=True))
        lines.append(f"| {name} | {median * 1000:.2f} | {paired:.3f}x | {applied[name]} |")
    dense = statistics.median(cpu[f"inline, {len(inline)} entries"])
    lines += [
        "",
        f"A request holding a term costs {(dense - base) * 1000 / (holding / len(sentences)):.2f} ms more (the inline "
        "50's extra CPU over the requests holding one of its terms): the aligner's pass over the sentence and its "
        "output, and placing the term; a request without one pays the matching only.",
    ]
    args.out.write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
