"""Which attention places markup best: each decoder layer's cross-attention (and their mean), read at
the step that predicted an output word (offset 0) or the step that read it (offset 1).

No gold alignments exist for Multi30k, so a small English→German lexicon of words the demo model
knows stands in for them: for every source word in the lexicon whose translation appears exactly
once in the output, an inline tag around the source word should land exactly on that output word.
Reported: the share of such tags placed exactly (the span server.documents.markup would give it is that one
word), and the share whose span contains it.

    python benchmarks/alignment.py --model exported/default --data ../shared/data/multi30k
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort

from common.corpus import MULTI30K, corpus_path, read_lines
from export.aligner import build_aligner
from model.checkpoint import load_checkpoint
from runtime import offline
from runtime.backend import OrtBackend
from runtime.cpu import describe_cpu
from runtime.options import EngineSettings, RuntimeOptions
from server.documents.aligned import align_units, source_words, unit_spans

# English word -> the starts of its German translations (lower case).
LEXICON = {
    english: tuple(german.split("/"))
    for english, german in (
        line.split(" ", 1)
        for line in """
man mann/männer
men männer
woman frau
women frauen
girl mädchen
boy junge
child kind
children kinder
dog hund
dogs hunde
people menschen/leute/personen
red rot
blue blau
black schwarz
white weiß
green grün
yellow gelb
water wasser
street straße
ball ball
bike fahrrad/rad
bicycle fahrrad
car auto
hat hut
snow schnee
beach strand
grass gras
building gebäude
table tisch
guitar gitarre
jacket jacke
shirt hemd/t-shirt
two zwei
three drei
four vier
young jung
small klein
little klein
large groß
big groß
group gruppe
crowd menge/menschenmenge
city stadt
field feld
air luft
camera kamera
sidewalk gehweg/bürgersteig
mountain berg
horse pferd
baby baby
food essen
player spieler
wall wand/mauer
front vor
sitting sitzt/sitzen
standing steht/stehen
walking geht/gehen/läuft/laufen
playing spielt/spielen
riding fährt/reitet/fahren/reiten
""".splitlines()
        if line
    )
}


# Means of two readings: (layer, offset, layer, offset).
COMBINATIONS = [(2, 0, 0, 1), (1, 0, 0, 1), (2, 0, 1, 0)]


def reading(alignment: np.ndarray, layer, offset, outputs: int, sources: int) -> np.ndarray:
    """The (outputs, sources) probabilities of one choice: a layer (or "mean", or "a+b" with offsets "x+y")."""
    if isinstance(layer, str) and "+" in layer:
        (a, b), (x, y) = (map(int, layer.split("+")), map(int, offset.split("+")))
        return (reading(alignment, a, x, outputs, sources) + reading(alignment, b, y, outputs, sources)) / 2
    matrix = alignment.mean(axis=0) if layer == "mean" else alignment[layer]
    return matrix[offset : offset + outputs, :sources]


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, default=Path("exported/default"))
    parser.add_argument("--data", type=Path, default=MULTI30K)
    parser.add_argument("--split", default="test_2016_flickr")
    parser.add_argument("--sentences", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=3)
    return parser.parse_args(argv)


def main(argv=None) -> None:
    args = parse_args(argv)
    model = OrtBackend(args.model, RuntimeOptions(settings=EngineSettings(intra_op_threads=2)))
    tokenizer = model.tokenizer
    sources = read_lines(corpus_path(args.data, args.split, "en"))[: args.sentences]
    ids = tokenizer.encode_source(sources)
    outputs = offline.translate_ids(model, ids)
    # Every layer, not only those the export's aligner keeps: a full aligner from the checkpoint.
    checkpoint, _ = load_checkpoint(Path(model.manifest["checkpoint"]["path"]))
    full = build_aligner(checkpoint, checkpoint.config.n_decoder_layers).SerializeToString()
    session = ort.InferenceSession(full, providers=["CPUExecutionProvider"])
    every = model.aligner.alignments(list(zip(ids, outputs, strict=True)), session)
    layers = every[0].shape[0]
    choices = [(layer, offset) for layer in [*range(layers), "mean"] for offset in (0, 1)]
    choices += [(f"{a}+{b}", f"{x}+{y}") for a, x, b, y in COMBINATIONS if max(a, b) < layers]
    exact = {choice: 0 for choice in choices}
    contains = {choice: 0 for choice in choices}
    cases = 0
    for source, output, alignment in zip(ids, outputs, every, strict=True):
        pieces = tokenizer.source_pieces(source)
        words = source_words(pieces)
        source_units = unit_spans(pieces)
        spans = unit_spans(tokenizer.target_pieces(output))
        target_units = [u.lower() for u in tokenizer.decode([output[a:b] for a, b in spans])]
        for w, (a, b) in enumerate(source_units):
            word = "".join(pieces[a:b]).lstrip("▁").lower()
            expected = [u for u, unit in enumerate(target_units) if unit.startswith(LEXICON.get(word, ("\0",)))]
            if len(expected) != 1:
                continue
            cases += 1
            for layer, offset in choices:
                rows = reading(alignment, layer, offset, len(output), len(source))
                aligned = [u for u, v in enumerate(align_units(rows, words, spans)) if v == w]
                exact[(layer, offset)] += aligned == expected
                contains[(layer, offset)] += bool(aligned) and min(aligned) <= expected[0] <= max(aligned)
    # What markup costs: the aligner over every pair against decoding them, alternating, 2 threads each.
    pairs = list(zip(ids, outputs, strict=True))
    decode_s, align_s = [], []
    for _ in range(args.repeats):
        started = time.perf_counter()
        offline.translate_ids(model, ids)
        decode_s.append(time.perf_counter() - started)
        started = time.perf_counter()
        model.aligner.align(pairs)
        align_s.append(time.perf_counter() - started)
    print(f"command: python {' '.join(sys.argv)}")
    print(f"machine: {describe_cpu()}; model {args.model}; {len(sources)} {args.split} sentences, greedy fp32")
    print(f"lexicon words with exactly one expected output word: {cases}\n")
    print("| layer | offset | tag placed exactly | span contains the word |")
    print("|---|---|---|---|")
    for choice in choices:
        print(f"| {choice[0]} | {choice[1]} | {exact[choice] / cases:.1%} | {contains[choice] / cases:.1%} |")
    decode, align = statistics.median(decode_s), statistics.median(align_s)
    print(
        f"\nthe aligner (1 thread, the export's readings) over the {len(pairs)} translations: {align:.2f} s against "
        f"{decode:.2f} s to decode them (greedy, fp32, 2 threads; medians of {args.repeats}, alternating): "
        f"{align / decode:.0%} of decoding time"
    )


if __name__ == "__main__":
    main()
