"""Small batches on one thread or on both (not a test): translate-file's engine with one batch at a time on 2
intra-op threads, where batches under runtime.backend.SMALL_BATCH_ROWS rows step either on sessions of one
thread or on the same 2-thread sessions as large batches. Output tokens/s over test_2016_flickr sentences in
file order, chunked by --batch, for fp32 and int8 and a matrix of small row counts (batch x beam), the two
settings alternating in one process, medians of --repeats:

    python benchmarks/small_batch_threads.py --data ../shared/data/multi30k --out benchmarks/small_batch_threads.md
"""

from __future__ import annotations

import argparse
import shlex
import statistics
import sys
import time
from datetime import date
from pathlib import Path

from common.corpus import MULTI30K, corpus_path, read_lines
from runtime import offline
from runtime.backend import OrtBackend
from runtime.cpu import describe_cpu
from runtime.options import EngineSettings, RuntimeOptions
from server.config import DEFAULT_MODEL_DIR

ROOT = Path(__file__).resolve().parents[1]

CASES = [(1, 1), (8, 1), (1, 4), (3, 4)]  # (sentences per batch, beam): 1 to 12 rows, all under SMALL_BATCH_ROWS


def rate(model: OrtBackend, sources: list[list[int]], batch: int, beam: int) -> float:
    started, tokens = time.perf_counter(), 0
    for start in range(0, len(sources), batch):
        tokens += sum(len(output) + 1 for output in offline.translate_ids(model, sources[start : start + batch], beam))
    return tokens / (time.perf_counter() - started)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, default=DEFAULT_MODEL_DIR)
    parser.add_argument("--data", type=Path, default=MULTI30K)
    parser.add_argument("--sentences", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, help="append the report to this Markdown file")
    args = parser.parse_args()
    lines = [
        f"## {date.today()}",
        "",
        f"command: python benchmarks/small_batch_threads.py {shlex.join(sys.argv[1:])}",
        f"machine: {describe_cpu()}; one batch at a time, 2 intra-op threads, spinning during runs; "
        f"{args.sentences} sentences in file order; medians of {args.repeats}, alternating",
        "",
        "| variant | batch | beam | rows | 1 thread tokens/s | 2 threads tokens/s | 2 / 1 |",
        "|---|---|---|---|---|---|---|",
    ]
    for variant in ("fp32", "int8"):
        models = {
            small: OrtBackend(
                args.model,
                RuntimeOptions(
                    settings=EngineSettings(variant=variant, provider="cpu", batch_layout=2),
                    spinning=True,
                    small_batch_threads=small,
                ),
            )
            for small in (1, 2)
        }
        texts = read_lines(corpus_path(args.data, "test_2016_flickr", "en"))[: args.sentences]
        sources = models[1].tokenizer.encode_source(texts)
        for batch, beam in CASES:
            rates: dict[int, list[float]] = {1: [], 2: []}
            for _ in range(args.repeats):
                for small, model in models.items():
                    rates[small].append(rate(model, sources, batch, beam))
            one, two = (statistics.median(rates[small]) for small in (1, 2))
            cells = [variant, batch, beam, batch * beam, f"{one:,.0f}", f"{two:,.0f}", f"{two / one:.2f}"]
            lines.append("| " + " | ".join(map(str, cells)) + " |")
            print(lines[-1], flush=True)
    report = "\n".join(lines) + "\n"
    if args.out:
        with args.out.open("a") as out:
            out.write("\n" + report if args.out.exists() else report)
    print(report)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
