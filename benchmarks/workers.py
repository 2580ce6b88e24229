"""Two ways to spend the cores on a bulk job, in one process, alternating (not a test): one batch at a time
on every core's thread (translate-file --workers 1 --threads N), or a batch per core on one thread each
(--workers N --threads 1, the default), and one thread alone for scale. Output tokens/s over length-sorted
batches of 32 of test_2016_flickr, greedy and beam 4, fp32 and int8, medians of --repeats:

    python benchmarks/workers.py --data ../shared/data/multi30k --out benchmarks/workers.md
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

from common.corpus import MULTI30K, read_lines
from runtime import offline
from runtime.backend import OrtBackend
from runtime.cpu import describe_cpu
from runtime.offline import translate_in_batches
from runtime.options import EngineSettings
from runtime.translate_file import runtime_options
from server.config import DEFAULT_MODEL_DIR

ROOT = Path(__file__).resolve().parents[1]


def rate(model: OrtBackend, texts: list[str], beam: int, workers: int) -> float:
    counted: list[int] = []

    def translate_ids(ids: list[list[int]]) -> list[list[int]]:
        outputs = offline.translate_ids(model, ids, beam, 256)
        counted.append(sum(len(output) + 1 for output in outputs))
        return outputs

    started = time.perf_counter()
    translate_in_batches(model.tokenizer, texts, translate_ids, 32, workers)
    return sum(counted) / (time.perf_counter() - started)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, default=DEFAULT_MODEL_DIR)
    parser.add_argument("--data", type=Path, default=MULTI30K)
    parser.add_argument("--sentences", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    cores = len(os.sched_getaffinity(0))
    texts = read_lines(args.data / "test_2016_flickr.en.gz")[: args.sentences]
    settings = {  # name: (intra-op threads, workers)
        "1 thread": (1, 1),
        f"1 batch on {cores} threads": (cores, 1),
        f"{cores} batches on 1 thread each": (1, cores),
    }
    lines = [
        f"command: python {' '.join(sys.argv)}",
        f"machine: {describe_cpu(cores)}; {len(texts)} sentences, batches of 32; medians of "
        f"{args.repeats}, settings alternating",
        "",
        "| variant | search | " + " | ".join(settings) + f" | {cores} batches / 1 batch |",
        "|---" * (len(settings) + 3) + "|",
    ]
    for variant in ("fp32", "int8"):
        models = {  # the settings translate-file uses
            threads: OrtBackend(
                args.model, runtime_options(EngineSettings(variant=variant, provider="cpu", intra_op_threads=threads))
            )
            for threads in {threads for threads, _ in settings.values()}
        }
        for beam in (1, 4):
            rates: dict[str, list[float]] = {name: [] for name in settings}
            for repeat in range(args.repeats):
                for name in settings if repeat % 2 == 0 else reversed(list(settings)):
                    threads, workers = settings[name]
                    rates[name].append(rate(models[threads], texts, beam, workers))
            med = [statistics.median(rates[name]) for name in settings]
            search = "greedy" if beam == 1 else f"beam {beam}"
            cells = " | ".join(f"{value:,.0f}" for value in med)
            lines.append(f"| {variant} | {search} | {cells} | {med[2] / med[1]:.2f} |")
            print(lines[-1], file=sys.stderr, flush=True)
    report = "\n".join(lines) + "\n"
    print(report)
    if args.out:
        args.out.write_text(report)


if __name__ == "__main__":
    main()
