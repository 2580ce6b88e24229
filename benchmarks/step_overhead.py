"""Time per decoder step outside ONNX Runtime's run, batch 1 greedy:
``python benchmarks/step_overhead.py --model DIR [--variant int8] [--sentences 150] [--repeats 3]``.

Each test_2016_flickr sentence is translated alone (translate-file's settings: one thread
for small batches); every ``DecodeBatch.step`` is timed whole and so is the ``run_with_iobinding``
call inside it. What is left is the engine's own per-step work: the search, the cache bookkeeping
and binding. Prints medians per step over all steps of all repeats (and the mean, which counts the
rare steps that rebind).
"""

from __future__ import annotations

import argparse
import os
import platform
import shlex
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from export.runtime import OrtModel  # noqa: E402
from export.translate_file import runtime_options  # noqa: E402
from model.corpus import corpus_path, read_lines  # noqa: E402
from model.search import decode, pad_sources  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, required=True)
    parser.add_argument("--variant", default="int8")
    parser.add_argument("--data", type=Path, default=ROOT.parent / "shared/data/multi30k")
    parser.add_argument("--sentences", type=int, default=150)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    options = runtime_options(args.variant, threads=2)
    model = OrtModel(args.model, options)
    c = model.config
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
    for _ in range(args.repeats):
        for source in sources:
            src_tokens, src_mask = pad_sources([source], c.pad_id, c.eos_id)
            batch = model.new_batch()
            step = batch.step

            def timed_step(step=step):
                start = time.perf_counter()
                finished = step()
                steps.append(time.perf_counter() - start)
                return finished

            batch.step = timed_step
            decode(batch, *model.encode(src_tokens, src_mask), src_mask, [source], 1, c.eos_id, 256)
    outside = [whole - run for whole, run in zip(steps, runs, strict=True)]
    print(f"command: python benchmarks/step_overhead.py {shlex.join(sys.argv[1:])}")
    print(f"machine: {platform.machine()}, {len(os.sched_getaffinity(0))} cores; {args.variant}; {len(steps)} steps")
    print(
        f"step: median {statistics.median(steps) * 1e3:.3f} ms; "
        f"inside run: median {statistics.median(runs) * 1e3:.3f} ms"
    )
    print(
        f"outside run, per step: median {statistics.median(outside) * 1e3:.3f} ms, "
        f"mean {statistics.fmean(outside) * 1e3:.3f} ms"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
