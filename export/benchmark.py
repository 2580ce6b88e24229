"""Decoding speed: ``python -m export.benchmark --model DIR [--data DIR]``, or against CTranslate2:
``python -m export.benchmark --against ctranslate2 [--base-sized]`` (see export/against_ctranslate2.py).

Output tokens per second on test_2016_flickr sentences, batch 1 and 32,
greedy and beam 4, for PyTorch without and with the KV cache, ONNX Runtime
fp32 and int8. Prints a Markdown table of medians over repeated runs.
"""

from __future__ import annotations

import argparse
import shlex
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import torch

from common.corpus import MULTI30K, corpus_path, read_lines
from model.checkpoint import DEFAULT_CHECKPOINT, length_penalty, load_checkpoint
from model.translate import TorchTranslator
from runtime.backend import OrtBackend
from runtime.cpu import describe_cpu
from runtime.options import EngineSettings
from runtime.translate_file import runtime_options

Translate = Callable[[list[list[int]], int], list[list[int]]]


def measure(translate: Translate, sources: list[list[int]], batch: int, beam: int, repeats: int) -> float:
    """Median output tokens per second of translating sources in batches of ``batch``."""
    rates = []
    for _ in range(repeats):
        tokens, start = 0, time.perf_counter()
        for i in range(0, len(sources), batch):
            tokens += sum(len(out) + 1 for out in translate(sources[i : i + batch], beam))
        rates.append(tokens / (time.perf_counter() - start))
    return statistics.median(rates)


def machine() -> str:
    return f"{describe_cpu()}, torch threads {torch.get_num_threads()}"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--against", choices=["pytorch", "ctranslate2"], default="pytorch")
    parser.add_argument("--model", type=Path, help="exported folder with the int8 variant (--against pytorch)")
    parser.add_argument("--checkpoint", type=Path, default=DEFAULT_CHECKPOINT)
    parser.add_argument("--data", type=Path, default=MULTI30K)
    parser.add_argument("--sentences", type=int, help="sentences per case (default: 64; ctranslate2: 150 / 1000)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2, help="ctranslate2: threads of each engine")
    parser.add_argument(
        "--workers",
        type=int,
        default=1,
        help="ctranslate2: batches each engine decodes at once, on one thread each (ours: translate-file's "
        "--workers; CT2: inter_threads); 1: one batch on --threads threads",
    )
    parser.add_argument("--base-sized", action="store_true", help="ctranslate2: a random transformer-base model")
    parser.add_argument(
        "--ct2-compute-type",
        choices=["float32", "int8"],
        help="ctranslate2: CT2's compute type (default: float32, int8 with --base-sized)",
    )
    parser.add_argument("--cap", type=int, help="ctranslate2: output cap in tokens (default 256; base-sized 40)")
    parser.add_argument(
        "--ort-beam-search",
        action="store_true",
        help="ctranslate2: also time ONNX Runtime's BeamSearch node over the same weights (fp32)",
    )
    parser.add_argument(
        "--work-dir",
        type=Path,
        default=Path(tempfile.gettempdir()) / "ct2-benchmark",
        help="ctranslate2: where the converted models are kept between runs",
    )
    args = parser.parse_args(argv)
    if args.against == "ctranslate2":
        from export.against_ctranslate2 import run_benchmark

        return run_benchmark(args)
    if args.model is None:
        parser.error("--model is required with --against pytorch")
    args.sentences = args.sentences or 64
    model, tokenizer = load_checkpoint(args.checkpoint)
    texts = read_lines(corpus_path(args.data, "test_2016_flickr", "en"))[: args.sentences]
    sources = tokenizer.encode_source(texts)
    torch_translator = TorchTranslator(model, tokenizer, length_penalty=length_penalty(args.checkpoint))
    fp32, int8 = (
        OrtBackend(args.model, runtime_options(EngineSettings(variant=v, provider="cpu"))) for v in ("fp32", "int8")
    )  # translate-file's settings
    variants: dict[str, Translate] = {
        "PyTorch, no cache": lambda s, b: torch_translator.translate_ids(s, b, use_cache=False),
        "PyTorch, KV cache": lambda s, b: torch_translator.translate_ids(s, b),
        "ONNX Runtime fp32": fp32.translate_ids,
        "ONNX Runtime int8": int8.translate_ids,
    }
    columns = [(batch, beam) for batch in (1, 32) for beam in (1, 4)]
    print(f"command: python -m export.benchmark {shlex.join(sys.argv[1:])}")
    print(f"machine: {machine()}; {len(texts)} sentences of test_2016_flickr, median of {args.repeats} runs\n")
    header = " | ".join(f"batch {b}, {'greedy' if k == 1 else f'beam {k}'}" for b, k in columns)
    print(f"| output tokens/s | {header} |")
    print("|---" * (len(columns) + 1) + "|")
    baseline = {}
    for name, translate in variants.items():
        cells = []
        for column in columns:
            rate = measure(translate, sources, *column, args.repeats)
            baseline.setdefault(column, rate)
            cells.append(f"{rate:,.0f} ({rate / baseline[column]:.1f}×)")
            print(f"  {name} {column}: {rate:.0f}", file=sys.stderr, flush=True)
        print(f"| {name} | " + " | ".join(cells) + " |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
