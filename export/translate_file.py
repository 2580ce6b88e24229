"""Translate a file offline with an exported model: ``translate-file --model DIR < in.en > out.de``.

No server and no torch: numpy and ONNX Runtime through export.runtime. One sentence per line,
translated in batches of similar source length and written in the input order; empty lines stay
empty and are not translated. ``--stats`` prints one JSON line on stderr: the sentences translated,
their output tokens (each output's tokens plus its eos, as the benchmarks count them), the seconds
spent translating (loading the model and reading stdin excluded) and tokens per second.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from export.manifest import ModelFolderError
from export.runtime import OrtModel, RuntimeOptions
from model.search import MAX_REPEATS, translate_in_batches

# CPU batches under SMALL_BATCH_ROWS rows step on sessions of this many threads: a second thread costs
# more than it saves there (2-core x86-64, benchmarks/threads.md and export/runtime.py).
SMALL_BATCH_THREADS = 1


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="translate-file", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", type=Path, required=True, help="exported model folder (python -m export)")
    parser.add_argument("--variant", default="fp32", help="fp32, int8 or fp16, as the folder has them")
    parser.add_argument("--provider", default="auto", help="cpu, cuda or auto (CUDA where available)")
    parser.add_argument("--beam", type=int, default=1, help="beam size (1 = greedy)")
    parser.add_argument("--batch-size", type=int, default=32, help="sentences per batch")
    parser.add_argument("--threads", type=int, default=0, help="intra-op threads (0: ONNX Runtime's default)")
    parser.add_argument("--max-output-tokens", type=int, default=256)
    parser.add_argument(
        "--max-repeats",
        type=int,
        default=MAX_REPEATS,
        help="the runaway-output guard, as the server's: an n-gram repeated more often in a row ends the "
        "sentence (0: off)",
    )
    parser.add_argument("--stats", action="store_true", help="print throughput as one JSON line on stderr")
    args = parser.parse_args(argv)
    if min(args.beam, args.batch_size, args.max_output_tokens) < 1:
        parser.error("--beam, --batch-size and --max-output-tokens must be at least 1")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    options = RuntimeOptions(
        variant=args.variant,
        provider=args.provider,
        intra_op_threads=args.threads,
        spinning=False,  # spinning cost throughput and latency in benchmarks/threads.md ...
        decoder_spinning=True,  # ... except the decoder's alone (export/runtime.py)
        small_batch_threads=SMALL_BATCH_THREADS,
    )
    try:
        model = OrtModel(args.model, options)
    except (ModelFolderError, ValueError) as e:
        print(f"translate-file: {e}", file=sys.stderr)
        return 2
    lines = [line.rstrip("\n") for line in sys.stdin]
    todo = [i for i, line in enumerate(lines) if line.strip()]
    output_tokens = 0

    def translate_ids(ids: list[list[int]]) -> list[list[int]]:
        nonlocal output_tokens
        outputs = model.translate_ids(ids, args.beam, args.max_output_tokens, args.max_repeats or None)
        output_tokens += sum(len(output) + 1 for output in outputs)
        return outputs

    start = time.perf_counter()
    texts = [lines[i] for i in todo]
    translations = translate_in_batches(model.tokenizer, texts, translate_ids, args.batch_size) if texts else []
    seconds = time.perf_counter() - start
    outputs = [""] * len(lines)
    for i, translation in zip(todo, translations, strict=True):
        outputs[i] = translation
    sys.stdout.writelines(f"{output}\n" for output in outputs)
    if args.stats:
        stats = {
            "sentences": len(todo),
            "output_tokens": output_tokens,
            "seconds": round(seconds, 6),
            "tokens_per_second": round(output_tokens / seconds, 1) if seconds else 0.0,
        }
        print(json.dumps(stats), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
