"""Two exported folders of the same checkpoint decoded in one process, alternating within each repeat (not a
test): what a change to the graphs buys, as ratios that the machine's drift between runs does not reach.

    python benchmarks/export_ab.py --base /tmp/before --model exported/default [--variant fp32] [--threads 2]

Make ``--base`` with the code before the change (``git worktree add /tmp/old COMMIT`` and its
``python -m export --out /tmp/before``). Output tokens per second over test_2016_flickr sentences in batches of the
batch size (as ``export.benchmark`` sends them), medians of ``--repeats``, and the share of identical outputs.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

from common.corpus import MULTI30K, corpus_path, read_lines
from runtime import offline
from runtime.backend import OrtBackend
from runtime.cpu import describe_cpu
from runtime.options import EngineSettings
from runtime.translate_file import runtime_options

ROOT = Path(__file__).resolve().parents[1]

CASES = ((32, 1, 1000), (32, 4, 1000), (1, 1, 150))  # (batch, beam, sentences), as export.benchmark's


def rate(model: OrtBackend, sources: list[list[int]], batch: int, beam: int) -> tuple[float, list[list[int]]]:
    """Output tokens (eos included) per second of decoding ``sources`` in batches of ``batch``, and the outputs."""
    outputs, start = [], time.perf_counter()
    for i in range(0, len(sources), batch):
        outputs += offline.translate_ids(model, sources[i : i + batch], beam, 256)
    return sum(len(output) + 1 for output in outputs) / (time.perf_counter() - start), outputs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base", type=Path, required=True, help="the folder exported before the change")
    parser.add_argument("--model", type=Path, default=ROOT / "exported/default", help="the folder exported after")
    parser.add_argument("--variant", default="fp32")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--sentences", type=int, help="at most this many per case")
    parser.add_argument("--data", type=Path, default=MULTI30K)
    args = parser.parse_args(argv)
    options = runtime_options(
        EngineSettings(variant=args.variant, provider="cpu", intra_op_threads=args.threads)
    )  # translate-file's, as export.benchmark's
    models = {"base": OrtBackend(args.base, options), "this": OrtBackend(args.model, options)}
    texts = read_lines(corpus_path(args.data, "test_2016_flickr", "en"))
    print(f"command: python {' '.join(sys.argv)}")
    print(
        f"machine: {describe_cpu()}; {args.variant}, {args.threads} threads; medians of {args.repeats}, alternating\n"
    )
    print("| case | base tok/s | this tok/s | this / base | identical |")
    print("|---|---|---|---|---|")
    for batch, beam, count in CASES:
        sources = models["base"].tokenizer.encode_source(texts[: min(count, args.sentences or count)])
        rates: dict[str, list[float]] = {name: [] for name in models}
        outputs = {}
        for repeat in range(args.repeats):
            for name in list(models) if repeat % 2 == 0 else list(models)[::-1]:
                value, outputs[name] = rate(models[name], sources, batch, beam)
                rates[name].append(value)
        base, this = (statistics.median(rates[name]) for name in models)
        same = np.mean([a == b for a, b in zip(outputs["base"], outputs["this"], strict=True)])
        name = f"batch {batch}, {'greedy' if beam == 1 else f'beam {beam}'}"
        print(f"| {name} | {base:,.0f} | {this:,.0f} | {this / base:.2f} | {same:.1%} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
