"""The two batch layouts on the CPU provider (not a test): compact (runtime/batch.py) against buckets
(runtime/slotted_rows.py), on test_2016_flickr with sentences joining as others leave:

    python benchmarks/batch_layout.py --data ../shared/data/multi30k --out benchmarks/batch_layout.md

Sentences join a running batch in groups of 1-3 (a fixed random sequence) whenever fewer than ``in flight`` are
decoding, as the server's lanes take arrivals between steps, so rows join and leave mid-bucket. Per model,
variant, beam and in-flight count: how many outputs are token-identical between the layouts (every sentence,
one pass each); and for the default model, sentences/s of each layout (the first ``--speed-sentences``,
medians of ``--repeats``, the layouts alternating), on one intra-op thread. For int8 the report also gives how
identical the compact layout is to itself at another in-flight count: int8 quantizes each step's activations
with one scale over all its rows, so its outputs depend on which rows share a step in either layout.
"""

from __future__ import annotations

import argparse
import gzip
import shlex
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from runtime.backend import OrtBackend  # noqa: E402
from runtime.cpu import describe_cpu  # noqa: E402
from runtime.options import flat_options  # noqa: E402
from runtime.search import default_max_output  # noqa: E402

LAYOUTS = ("compact", "buckets")
SOURCE = {"default": "en", "default-de-en": "de"}


def continuous(backend: OrtBackend, sources: list[list[int]], beam: int, in_flight: int) -> list[list[int]]:
    """Every source decoded, joining in groups of 1-3 whenever fewer than ``in_flight`` decode."""
    rng = np.random.default_rng(0)
    batch = backend.new_batch(backend.decoding())
    pending, results = list(range(len(sources))), {}
    while pending or len(batch):
        room = in_flight - len(batch)
        if pending and room > 0:
            take = min(room, int(rng.integers(1, 4)), len(pending))
            group, pending = pending[:take], pending[take:]
            joining = [sources[i] for i in group]
            limits = [default_max_output(len(source), 256) for source in joining]
            batch.add(group, backend.encode_sources(joining), [beam] * take, limits)
        results.update(batch.step())
    return [results[i].tokens for i in range(len(sources))]


def engine_parser(doc: str) -> argparse.ArgumentParser:
    """The flags of a benchmark of two engine paths on test_2016_flickr (this one, benchmarks/k_steps.py)."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, required=True)
    parser.add_argument("--models", default="default,default-de-en", help="folders under exported/")
    parser.add_argument("--variants", default="fp32,int8")
    parser.add_argument("--sentences", type=int, default=1000, help="for the identity counts")
    parser.add_argument("--speed-sentences", type=int, default=300)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, required=True)
    return parser


def sides(model: str, variant: str, option: str, values) -> dict:
    """A backend of the model's variant on one CPU thread for each value of a RuntimeOptions ``option``."""
    folder = ROOT / "exported" / model
    return {
        value: OrtBackend(
            folder,
            flat_options(provider="cpu", variant=variant, intra_op_threads=1, **{option: value}),
        )
        for value in values
    }


def flickr(data: Path, model: str, count: int) -> list[str]:
    """The first ``count`` test_2016_flickr sentences in the model's source language."""
    with gzip.open(data / f"test_2016_flickr.{SOURCE[model]}.gz", "rt", encoding="utf-8") as lines:
        return [line.strip() for line in lines if line.strip()][:count]


def main() -> int:
    parser = engine_parser(__doc__)
    parser.add_argument("--beams", default="1,4")
    parser.add_argument("--in-flight", default="1,16,64")
    args = parser.parse_args()
    beams = [int(b) for b in args.beams.split(",")]
    flights = [int(n) for n in args.in_flight.split(",")]
    identity, speed, self_identity = [], [], []
    for model in args.models.split(","):
        texts = flickr(args.data, model, args.sentences)
        for variant in args.variants.split(","):
            backends = sides(model, variant, "batch_layout", LAYOUTS)
            sources = backends["compact"].tokenizer.encode_source(texts)
            for beam in beams:
                outputs = {}
                for in_flight in flights:
                    for layout in LAYOUTS:
                        outputs[layout, in_flight] = continuous(backends[layout], sources, beam, in_flight)
                    pairs = zip(outputs["compact", in_flight], outputs["buckets", in_flight], strict=True)
                    same = sum(a == b for a, b in pairs)
                    identity.append((model, variant, beam, in_flight, same, len(sources)))
                    print(identity[-1], flush=True)
                if variant == "int8":
                    one, most = outputs["compact", flights[0]], outputs["compact", flights[-1]]
                    same = sum(a == b for a, b in zip(one, most, strict=True))
                    self_identity.append((model, variant, beam, flights[0], flights[-1], same, len(sources)))
                if model != "default":
                    continue
                for in_flight in flights:
                    rates = {layout: [] for layout in LAYOUTS}
                    for repeat in range(args.repeats):
                        for layout in LAYOUTS if repeat % 2 == 0 else LAYOUTS[::-1]:
                            start = time.perf_counter()
                            continuous(backends[layout], sources[: args.speed_sentences], beam, in_flight)
                            rates[layout].append(args.speed_sentences / (time.perf_counter() - start))
                    speed.append((variant, beam, in_flight, *(statistics.median(rates[x]) for x in LAYOUTS)))
                    print(speed[-1], flush=True)
    lines = [
        "# Batch layouts on the CPU: compact against buckets",
        "",
        f"command: `python benchmarks/batch_layout.py {shlex.join(sys.argv[1:])}`",
        f"machine: {describe_cpu()}; ONNX Runtime's CPU provider, one intra-op thread.",
        "",
        "Outputs token-identical between the layouts (sentences joining in groups of 1-3 as others leave):",
        "",
        "| model | variant | beam | in flight | identical |",
        "|---|---|---|---|---|",
    ]
    for model, variant, beam, in_flight, same, total in identity:
        lines.append(f"| {model} | {variant} | {beam} | {in_flight} | {same}/{total} ({same / total:.1%}) |")
    if self_identity:
        lines += ["", "int8, the compact layout against itself at another in-flight count:", ""]
        lines += ["| model | beam | in flight | against | identical |", "|---|---|---|---|---|"]
        for model, _, beam, one, most, same, total in self_identity:
            lines.append(f"| {model} | {beam} | {one} | {most} | {same}/{total} ({same / total:.1%}) |")
    lines += [
        "",
        f"Sentences/s, the default model, {args.speed_sentences} sentences, medians of {args.repeats}:",
        "",
        "| variant | beam | in flight | compact | buckets | buckets / compact |",
        "|---|---|---|---|---|---|",
    ]
    for variant, beam, in_flight, compact, bucketed in speed:
        lines.append(
            f"| {variant} | {beam} | {in_flight} | {compact:.1f} | {bucketed:.1f} | {bucketed / compact:.2f} |"
        )
    args.out.write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
