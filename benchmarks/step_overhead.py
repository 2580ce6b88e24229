"""Time per decoder step outside ONNX Runtime's run, batch 1 greedy by default:
``python benchmarks/step_overhead.py --model DIR [--variant int8] [--sentences 150] [--repeats 3]
[--batch 32 --beam 4]``.

test_2016_flickr sentences are translated in batches of ``--batch`` in file order, as the CTranslate2
benchmark sends them (``runtime.offline.translate_ids``, translate-file's settings on 2 threads: one thread for
small batches); every ``DecodeBatch.step`` is timed whole and so is the ``run_with_iobinding`` call inside
it. What is left is the engine's own per-step work: the search, the cache bookkeeping and binding. Prints
medians per step over all steps of all repeats (and the mean, which counts the steps that rebind), and
that work's share of the decode loop and of the whole translation (the encoder included).
"""

from __future__ import annotations

import argparse
import shlex
import statistics
import sys
import time
from pathlib import Path

from common.corpus import MULTI30K, corpus_path, read_lines
from runtime import offline
from runtime.backend import OrtBackend
from runtime.cpu import describe_cpu
from runtime.options import EngineSettings
from runtime.translate_file import runtime_options

ROOT = Path(__file__).resolve().parents[1]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, required=True)
    parser.add_argument("--variant", default="int8")
    parser.add_argument("--data", type=Path, default=MULTI30K)
    parser.add_argument("--sentences", type=int, default=150)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--batch", type=int, default=1, help="sentences decoded together")
    parser.add_argument("--beam", type=int, default=1)
    args = parser.parse_args()
    options = runtime_options(EngineSettings(variant=args.variant, provider="cpu", intra_op_threads=2))
    model = OrtBackend(args.model, options)
    sources = model.tokenizer.encode_source(read_lines(corpus_path(args.data, "test_2016_flickr", "en")))
    sources = sources[: args.sentences]
    runs: list[float] = []
    steps: list[float] = []
    for session in {model.decoder, model.small_decoder}:
        original = session.run_with_iobinding

        def timed(binding, run_options=None, original=original):
            start = time.perf_counter()
            original(binding, run_options)
            runs.append(time.perf_counter() - start)

        session.run_with_iobinding = timed
    new_batch = model.new_batch

    def timed_batch(decoding=None):
        batch = new_batch(decoding)
        step = batch.step

        def timed_step():
            start = time.perf_counter()
            finished = step()
            steps.append(time.perf_counter() - start)
            return finished

        batch.step = timed_step
        return batch

    model.new_batch = timed_batch
    batches = [sources[i : i + args.batch] for i in range(0, len(sources), args.batch)]
    started = time.perf_counter()
    for _ in range(args.repeats):
        for batch_ids in batches:
            offline.translate_ids(model, batch_ids, args.beam, 256)
    translating = time.perf_counter() - started
    outside = [whole - run for whole, run in zip(steps, runs, strict=True)]
    print(f"command: python benchmarks/step_overhead.py {shlex.join(sys.argv[1:])}")
    print(f"machine: {describe_cpu()}; {args.variant}; batch {args.batch}, beam {args.beam}; {len(steps)} steps")
    print(
        f"step: median {statistics.median(steps) * 1e3:.3f} ms; "
        f"inside run: median {statistics.median(runs) * 1e3:.3f} ms"
    )
    print(
        f"outside run, per step: median {statistics.median(outside) * 1e3:.3f} ms, "
        f"mean {statistics.fmean(outside) * 1e3:.3f} ms; {sum(outside) / sum(steps):.1%} of the decode loop, "
        f"{sum(outside) / translating:.1%} of the translation"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
