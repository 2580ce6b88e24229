"""Translate a file offline with an exported model: ``translate-file --model DIR < in.en > out.de``.

No server and no torch: numpy and ONNX Runtime through runtime/offline.py. One sentence per line,
translated in batches of similar source length (``--workers`` of them at once, sharing the model) and
written in the input order; empty lines stay empty and are not translated. ``--stats`` prints one JSON
line on stderr: the sentences translated, their output tokens (each output's tokens plus its eos, as the
benchmarks count them), the seconds spent translating (loading the model and reading stdin excluded) and
tokens per second.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from common import flags
from common.flags import setting
from runtime.backend import OrtBackend
from runtime.manifest import ModelFolderError
from runtime.offline import translate_ids, translate_in_batches
from runtime.options import EngineSettings, RuntimeOptions
from runtime.providers import resolve_provider
from runtime.stops import MAX_REPEATS, stop_rules

# Small batches step on the same sessions as large ones: offline, a second thread pays in fp32, whose steps
# read more weight bytes than one core can stream (1, 4, 8 and 12 rows: fp32 1.27-1.50x the tokens/s of one
# thread), and ties in int8 (0.98-1.07x); 2-core x86-64, benchmarks/small_batch_threads.md.
SMALL_BATCH_THREADS = None


def runtime_options(settings: EngineSettings) -> RuntimeOptions:
    """translate-file's options on the user's ``settings``, which the benchmarks time as ours: intra-op threads
    spin during a run only (runtime/options.py), every batch steps on the same sessions, and each batch's cache
    takes the last one's buffers."""
    return RuntimeOptions(
        settings=settings, spinning=True, small_batch_threads=SMALL_BATCH_THREADS, reuse_cache_buffers=True
    )


@dataclass(frozen=True)
class FileTranslation:
    model: Path = setting(help="exported model folder (python -m export)")
    engine: EngineSettings = setting(help="the engine's settings (its fields are flags)", factory=EngineSettings)
    beam: int = setting(1, "beam size (1: greedy)")
    batch_size: int = setting(32, "sentences per batch")
    workers: int = setting(0, "batches decoded at once, on threads sharing the model (0: CPU one per core, CUDA 1)")
    max_output_tokens: int = setting(256, "the longest output per sentence, eos included")
    max_repeats: int = setting(
        MAX_REPEATS,
        "the runaway-output guard, as the server's: an n-gram repeated more often in a row ends the sentence (0: off)",
    )
    stats: bool = setting(False, "print throughput as one JSON line on stderr")

    def __post_init__(self) -> None:
        problems = flags.choice_problems(self)
        if min(self.workers, self.engine.intra_op_threads) < 0:
            problems.append("--workers and --intra-op-threads must be 0 (automatic) or more")
        if min(self.beam, self.batch_size, self.max_output_tokens) < 1:
            problems.append("--beam, --batch-size and --max-output-tokens must be at least 1")
        if problems:
            raise ValueError("; ".join(problems))


def parse_args(argv: Sequence[str] | None) -> FileTranslation:
    return flags.command(FileTranslation, argv, "translate-file", __doc__)


def parallelism(workers: int, threads: int, provider: str, cores: int) -> tuple[int, int]:
    """(workers, intra-op threads per worker). On CPU, a core per worker with one thread each unless told
    otherwise: batches decoded side by side on one thread each beat one batch on every core, 1.33-1.54x
    in tokens/s at batch 32 (fp32 and int8, greedy and beam 4; 2-core x86-64, benchmarks/workers.md);
    a thread per op of a small batch spends much of its time waiting for the other. On CUDA one worker:
    the device is shared."""
    if provider == "cuda":
        return workers or 1, threads
    if not workers:
        workers = max(1, cores // threads) if threads else cores
    return workers, threads or max(1, cores // workers)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        provider = resolve_provider(args.engine.provider)
        cores = len(os.sched_getaffinity(0))
        workers, threads = parallelism(args.workers, args.engine.intra_op_threads, provider, cores)
        settings = dataclasses.replace(args.engine, provider=provider, intra_op_threads=threads)
        backend = OrtBackend(args.model, runtime_options(settings))
    except (ModelFolderError, ValueError) as e:
        print(f"translate-file: {e}", file=sys.stderr)
        return 2
    lines = [line.rstrip("\n") for line in sys.stdin]
    todo = [i for i, line in enumerate(lines) if line.strip()]
    rules = stop_rules(args.max_repeats)
    counted: list[int] = []  # output tokens per batch (list.append is atomic: workers append at once)

    def translate_batch(ids: list[list[int]]) -> list[list[int]]:
        outputs = translate_ids(backend, ids, args.beam, args.max_output_tokens, rules)
        counted.append(sum(len(output) + 1 for output in outputs))
        return outputs

    start = time.perf_counter()
    texts = [lines[i] for i in todo]
    translations = (
        translate_in_batches(backend.tokenizer, texts, translate_batch, args.batch_size, workers) if texts else []
    )
    seconds, output_tokens = time.perf_counter() - start, sum(counted)
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
