"""Several greedy steps per decoder run on the CPU provider (not a test): ``RuntimeOptions.steps_per_run`` k
against one step per run, on test_2016_flickr:

    python benchmarks/k_steps.py --data ../shared/data/multi30k --out benchmarks/k_steps.md

Per k: the default model's batch-1 greedy tokens/s (each sentence decoded alone, the first ``--speed-sentences``,
medians of ``--repeats``, the values of k alternating) and the share of that time spent inside ONNX Runtime's
decoder runs (the rest is the host: the search, the cache's lengths, Python between runs); and how many
outputs are token-identical to k = 1, every sentence, batch 1 and batch 32, for each model and variant. One
intra-op thread.
"""

from __future__ import annotations

import shlex
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.batch_layout import engine_parser, flickr, sides  # noqa: E402
from runtime.cpu import describe_cpu  # noqa: E402
from runtime.offline import translate_ids  # noqa: E402


class Timed:
    """A session's method (``run_with_iobinding``, ``run``), timed until ``restore``."""

    def __init__(self, session, method: str) -> None:
        self.session, self.method = session, method
        self.run, self.seconds = getattr(session, method), 0.0
        setattr(session, method, self)

    def restore(self) -> None:
        setattr(self.session, self.method, self.run)

    def __call__(self, *args):
        start = time.perf_counter()
        try:
            return self.run(*args)
        finally:
            self.seconds += time.perf_counter() - start


def main() -> int:
    parser = engine_parser(__doc__)
    parser.add_argument("--k", default="1,2,4,8")
    args = parser.parse_args()
    ks = [int(k) for k in args.k.split(",")]
    identity, speed = [], []
    for model in args.models.split(","):
        texts = flickr(args.data, model, args.sentences)
        for variant in args.variants.split(","):
            backends = sides(model, variant, "steps_per_run", ks)
            sources = backends[ks[0]].tokenizer.encode_source(texts)
            outputs = {}
            for k, backend in backends.items():
                alone = [translate_ids(backend, [source])[0] for source in sources]
                batched = [
                    out for at in range(0, len(sources), 32) for out in translate_ids(backend, sources[at : at + 32])
                ]
                outputs[k] = (alone, batched)
                same = [
                    sum(a == b for a, b in zip(mine, first, strict=True))
                    for mine, first in zip(outputs[k], outputs[ks[0]], strict=True)
                ]
                identity.append((model, variant, k, *same, len(sources)))
                print(identity[-1], flush=True)
            if model != "default":
                continue
            runs = {k: [] for k in ks}
            for repeat in range(args.repeats):
                for k in ks if repeat % 2 == 0 else ks[::-1]:
                    backend = backends[k]
                    session = backend.k_steps.session if backend.k_steps else backend.decoder
                    timed = Timed(session, "run_with_iobinding"), Timed(backend.encoder, "run")
                    start = time.perf_counter()
                    tokens = sum(
                        len(translate_ids(backend, [source])[0]) + 1 for source in sources[: args.speed_sentences]
                    )
                    seconds = time.perf_counter() - start
                    for each in timed:
                        each.restore()
                    runs[k].append((tokens / seconds, timed[0].seconds / seconds, timed[1].seconds / seconds))
            for k in ks:
                rate, decoder, encoder = (statistics.median(run[i] for run in runs[k]) for i in range(3))
                speed.append((variant, k, rate, decoder, encoder))
                print(speed[-1], flush=True)
    lines = [
        "# Several greedy steps per decoder run, on the CPU",
        "",
        f"command: `python benchmarks/k_steps.py {shlex.join(sys.argv[1:])}`",
        f"machine: {describe_cpu()}; ONNX Runtime's CPU provider, one intra-op thread.",
        "",
        f"Batch 1, greedy, the default model, {args.speed_sentences} sentences each alone, medians of "
        f"{args.repeats}, k alternating (tokens counted with eos):",
        "",
        "| variant | k | tokens/s | against k = 1 | time in the decoder's runs | in the encoder's | the host's |",
        "|---|---|---|---|---|---|---|",
    ]
    base = {variant: rate for variant, k, rate, *_ in speed if k == ks[0]}
    for variant, k, rate, decoder, encoder in speed:
        lines.append(
            f"| {variant} | {k} | {rate:.0f} | {rate / base[variant]:.2f} | {decoder:.0%} | {encoder:.0%} | "
            f"{1 - decoder - encoder:.0%} |"
        )
    lines += [
        "",
        f"Outputs token-identical to k = {ks[0]} (greedy):",
        "",
        "| model | variant | k | batch 1 | batch 32 |",
        "|---|---|---|---|---|",
    ]
    for model, variant, k, alone, batched, total in identity:
        if k != ks[0]:
            lines.append(f"| {model} | {variant} | {k} | {alone}/{total} | {batched}/{total} |")
    args.out.write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
