"""How the confidence score relates to translation quality (not a test).

    python benchmarks/confidence.py --model exported/default --data ../shared/data/multi30k

Translates test_2016_flickr with the engine (greedy, fp32, the server's runaway-output guard), gives each
sentence its confidence (the mean log-probability of its chosen tokens, runtime.search.Hypothesis.score)
and its sentence-level chrF against the reference, and reports mean chrF by confidence decile and the rank
correlation between the two.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import sacrebleu

from common.corpus import MULTI30K, corpus_path, read_lines
from runtime import offline
from runtime.backend import OrtBackend
from runtime.options import EngineSettings, RuntimeOptions
from runtime.stops import RepetitionGuard

ROOT = Path(__file__).resolve().parents[1]


def ranks(values: np.ndarray) -> np.ndarray:
    return np.argsort(np.argsort(values)).astype(np.float64)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, default=ROOT / "exported" / "default")
    parser.add_argument("--data", type=Path, default=MULTI30K)
    parser.add_argument("--split", default="test_2016_flickr")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "confidence.md")
    args = parser.parse_args()
    model = OrtBackend(args.model, RuntimeOptions(settings=EngineSettings(provider="cpu")))
    manifest = json.loads((args.model / "manifest.json").read_text())
    source, target = manifest["source_language"], manifest["target_language"]
    sources = read_lines(corpus_path(args.data, args.split, source))
    references = read_lines(corpus_path(args.data, args.split, target))
    ids = model.tokenizer.encode_source(sources)
    hypotheses = []
    for start in range(0, len(ids), 64):
        hypotheses += offline.hypotheses(model, ids[start : start + 64], 1, 256, (RepetitionGuard(),))
    outputs = model.tokenizer.decode([h.tokens for h in hypotheses])
    scores = np.array([h.score for h in hypotheses])
    chrf = np.array([sacrebleu.sentence_chrf(o, [r]).score for o, r in zip(outputs, references, strict=True)])
    spearman = float(np.corrcoef(ranks(scores), ranks(chrf))[0, 1])
    order = np.argsort(scores)
    lines = [
        f"command: `python benchmarks/confidence.py {' '.join(sys.argv[1:])}`",
        f"model: {manifest['name']} ({source}→{target}), fp32, greedy, guard on; {args.split}, {len(sources)} "
        f"sentences; sentence chrF (sacreBLEU); Spearman rank correlation of confidence and chrF: {spearman:.3f}",
        "",
        "| confidence decile | confidence range | mean exp(confidence) | mean sentence chrF | guard stops |",
        "|---|---|---|---|---|",
    ]
    for decile, part in enumerate(np.array_split(order, 10), start=1):
        low, high = scores[part].min(), scores[part].max()
        guarded = sum(hypotheses[i].stopped != "eos" for i in part)
        lines.append(
            f"| {decile} (lowest first) | {low:.3f} … {high:.3f} | {np.exp(scores[part]).mean():.3f} "
            f"| {chrf[part].mean():.1f} | {guarded} |"
        )
    args.out.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
