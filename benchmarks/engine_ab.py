"""One engine case's tokens/s, for before/after comparisons across checkouts (not a test):

    python benchmarks/engine_ab.py TREE BATCH BEAM SENTENCES [--data DIR] [--variant fp32|int8] [--threads N]

Loads TREE's engine (its own code, first on ``sys.path``; TREE may be a ``git worktree add`` of another commit,
with this checkout's ``exported/``) on translate-file's runtime options, decodes the first SENTENCES sentences of
test_2016_flickr in batches of BATCH at BEAM once to warm up and once timed, and prints output tokens (eos
counted) per second. Run it for each tree in turn, alternating, in fresh processes: the cases of ``python -m
export.benchmark --against ctranslate2`` for our engine alone, before against after. Works on checkouts from
before ``runtime_options`` took an ``EngineSettings``.
"""

from __future__ import annotations

import argparse
import inspect
import os
import sys
import time
from pathlib import Path


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("tree", type=Path)
    parser.add_argument("batch", type=int)
    parser.add_argument("beam", type=int)
    parser.add_argument("sentences", type=int)
    parser.add_argument("--data", type=Path, help="the Multi30k folder (default: common/corpus.py's MULTI30K)")
    parser.add_argument("--model", type=Path, default=Path(__file__).resolve().parents[1] / "exported/default")
    parser.add_argument("--variant", default="fp32")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    tree = args.tree.resolve()
    os.chdir(tree)
    sys.path.insert(0, str(tree))
    from common.corpus import MULTI30K, corpus_path, read_lines
    from runtime import offline
    from runtime.backend import OrtBackend
    from runtime.translate_file import runtime_options

    if "variant" in inspect.signature(runtime_options).parameters:  # before EngineSettings
        options = runtime_options(args.variant, threads=args.threads)
    else:
        from runtime.options import EngineSettings

        settings = EngineSettings(variant=args.variant, provider="cpu", intra_op_threads=args.threads)
        options = runtime_options(settings)
    engine = OrtBackend(args.model, options)
    texts = read_lines(corpus_path(args.data or MULTI30K, "test_2016_flickr", "en"))[: args.sentences]
    sources = engine.tokenizer.encode_source(texts)

    def run() -> list[list[int]]:
        outputs = []
        for i in range(0, len(sources), args.batch):
            outputs += offline.translate_ids(engine, sources[i : i + args.batch], args.beam, 256)
        return outputs

    run()
    start = time.perf_counter()
    outputs = run()
    print(f"{sum(len(o) + 1 for o in outputs) / (time.perf_counter() - start):.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
