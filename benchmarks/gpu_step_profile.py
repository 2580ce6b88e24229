"""Where a decoder step's time goes on a GPU: steps of one bucketed batch at a fixed size, timed, for a kernel
profiler to attribute (``benchmarks/gpu_device.sh profile`` runs it under Nsight Compute's per-kernel summary).

``python benchmarks/gpu_step_profile.py --model DIR --rows 1 [--beam 4] [--steps 200] [--graphs]`` fills a batch
with ``--rows`` sources (their beams on top), steps it ``--warmup`` times, then ``--steps`` times, and prints the
mean time per step and per run. Without ``--graphs`` every kernel is launched on its own, which is what a
profiler names one by one; ``--fusions`` lets ONNX Runtime fuse what the engine keeps apart on the CPU.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from runtime import providers
from runtime.backend import OrtBackend
from runtime.options import EngineSettings, RuntimeOptions
from runtime.search import Decoding


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, required=True)
    parser.add_argument("--provider", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument("--variant", default="fp16")
    parser.add_argument("--rows", type=int, default=1, help="sources in the batch")
    parser.add_argument("--beam", type=int, default=1)
    parser.add_argument("--steps-per-run", type=int, default=1)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--graphs", action="store_true", help="replay each bucket's step as a CUDA graph")
    parser.add_argument("--fusions", action="store_true", help="ONNX Runtime's fusions on (the engine turns some off)")
    args = parser.parse_args(argv)
    options = RuntimeOptions(
        settings=EngineSettings(variant=args.variant, provider=args.provider, batch_layout="buckets"),
        io_binding=True,
        cuda_graphs=args.graphs,
        steps_per_run=args.steps_per_run,
    )
    kept, providers.NO_FUSIONS = providers.NO_FUSIONS, [] if args.fusions else providers.NO_FUSIONS
    try:
        engine = OrtBackend(args.model, options)
    finally:
        providers.NO_FUSIONS = kept
    sources = [[10 + (7 * i + j) % 500 for j in range(12)] for i in range(args.rows)]
    limit = (args.warmup + args.steps) * args.steps_per_run + 2  # within a test sentence's bucket (64) by default
    batch = engine.new_batch(Decoding(eos_id=-1))  # no eos: every row decodes for every step
    batch.add(list(range(args.rows)), engine.encode_sources(sources), [args.beam] * args.rows, [limit] * args.rows)
    for _ in range(args.warmup):
        batch.step()
    start = time.perf_counter()
    for _ in range(args.steps):
        batch.step()
    seconds = (time.perf_counter() - start) / args.steps
    print(
        f"{args.variant} on {args.provider}, {args.rows} sources x beam {args.beam} ({batch.rows} rows), "
        f"{args.steps_per_run} steps per run, graphs {args.graphs}, fusions {args.fusions}: "
        f"{seconds * 1e3:.3f} ms per run, {seconds / args.steps_per_run * 1e3:.3f} ms per step",
        flush=True,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
