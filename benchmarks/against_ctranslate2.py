"""Our engine against CTranslate2 on the same weights and token ids:
``python benchmarks/against_ctranslate2.py --model exported/default [--threads 2] [--repeats 3]``.

The checkpoint is exported to the Marian format (OPUS-MT layout) and converted by CTranslate2's own
converter; both engines translate the same test_2016_flickr token ids with the same thread count and
the same output cap (ours counts eos: min(256, 2·source + 10); CT2 gets that minus one), alternating
engines within each repeat. Output tokens/s (each best hypothesis' tokens + eos), medians.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import statistics
import sys
import tempfile
import time
from pathlib import Path

import ctranslate2
import numpy as np
import onnxruntime as ort

from export.__main__ import main as export_main
from export.runtime import OrtModel, RuntimeOptions
from model.checkpoint import DEFAULT_CHECKPOINT
from model.corpus import corpus_path, read_lines
from model.marian import opus_mt_order
from model.search import default_max_output

CASES = ((1, 1, 150), (32, 1, 1000), (1, 4, 150), (32, 4, 1000))  # batch, beam, sentences
CAP = 256


def ct2_model(checkpoint: Path, work: Path) -> tuple[Path, dict[str, int]]:
    marian, converted = work / "marian", work / "ct2"
    if not converted.exists():
        export = ["--format", "marian", "--marian-layout", "opus-mt", "--checkpoint", str(checkpoint)]
        if export_main([*export, "--out", str(marian), "--force"]) != 0:
            raise SystemExit(f"the Marian export of {checkpoint} failed (see above)")
        ctranslate2.converters.TransformersConverter(str(marian)).convert(str(converted), force=True)
    return converted, json.loads((marian / "vocab.json").read_text())


def cpu_name() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.machine()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, required=True, help="exported folder with fp32 and int8 variants")
    parser.add_argument("--checkpoint", type=Path, default=DEFAULT_CHECKPOINT)
    parser.add_argument("--data", type=Path, default=Path(__file__).resolve().parents[2] / "shared/data/multi30k")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--work-dir", type=Path, default=Path(tempfile.gettempdir()) / "ct2-benchmark")
    args = parser.parse_args(argv)
    converted, vocab = ct2_model(args.checkpoint, args.work_dir)
    ours = {
        variant: OrtModel(args.model, RuntimeOptions(variant, "cpu", args.threads, False, small_batch_threads=1))
        for variant in ("fp32", "int8")
    }
    c = ours["fp32"].config
    order = opus_mt_order(c).numpy()
    to_theirs, piece = np.argsort(order), {i: p for p, i in vocab.items()}
    # One CT2 translator alive at a time: its OpenMP threads spin, and a second pool would slow every engine.
    # float32 is CT2's fastest type on this CPU (its int8 was 2.2x slower when measured for the issue).
    types = ["float32"]
    theirs = {
        t: ctranslate2.Translator(str(converted), "cpu", compute_type=t, inter_threads=1, intra_threads=args.threads)
        for t in types
    }
    texts = read_lines(corpus_path(args.data, "test_2016_flickr", "en"))

    def run_ours(model: OrtModel, sources: list[list[int]], batch: int, beam: int) -> list[list[int]]:
        return [
            out for i in range(0, len(sources), batch) for out in model.translate_ids(sources[i : i + batch], beam, CAP)
        ]

    def run_theirs(translator, sources: list[list[int]], batch: int, beam: int) -> list[list[int]]:
        outputs = []
        for i in range(0, len(sources), batch):
            chunk = sources[i : i + batch]
            pieces = [[piece[int(to_theirs[t])] for t in row] + ["</s>"] for row in chunk]
            limit = max(default_max_output(len(row) + 1, CAP) for row in chunk) - 1
            results = translator.translate_batch(
                pieces, beam_size=beam, max_batch_size=batch, max_decoding_length=limit
            )
            outputs += [[int(order[vocab[p]]) for p in r.hypotheses[0]] for r in results]
        return outputs

    print(f"command: python benchmarks/against_ctranslate2.py {shlex.join(sys.argv[1:])}")
    print(
        f"machine: {cpu_name()}, {len(os.sched_getaffinity(0))} cores; {args.threads} threads each; "
        f"onnxruntime {ort.__version__}, ctranslate2 {ctranslate2.__version__}; medians of {args.repeats}\n"
    )
    print(
        "| case | ours fp32 | ours int8 | CT2 float32 | best ours / CT2 | fp32 / CT2 float32 | identical (best ours vs CT2) |"
    )
    print("|---|---|---|---|---|---|---|")
    for batch, beam, count in CASES:
        sources = ours["fp32"].tokenizer.encode_source(texts[:count])
        engines = {f"ours {v}": (run_ours, m) for v, m in ours.items()}
        engines |= {f"CT2 {t}": (run_theirs, tr) for t, tr in theirs.items()}
        rates: dict[str, list[float]] = {name: [] for name in engines}
        outputs = {}
        for _ in range(args.repeats):
            for name, (run, engine) in engines.items():
                start = time.perf_counter()
                outputs[name] = run(engine, sources, batch, beam)
                rates[name].append(sum(len(o) + 1 for o in outputs[name]) / (time.perf_counter() - start))
        med = {name: statistics.median(r) for name, r in rates.items()}
        best_ours = max(("ours fp32", "ours int8"), key=med.get)
        best_ct2 = max((n for n in med if n.startswith("CT2")), key=med.get)
        same = np.mean([a == b for a, b in zip(outputs[best_ours], outputs[best_ct2], strict=True)])
        name = f"batch {batch}, {'greedy' if beam == 1 else f'beam {beam}'}"
        cells = " | ".join(f"{med.get(n, float('nan')):,.0f}" for n in ("ours fp32", "ours int8", "CT2 float32"))
        print(
            f"| {name} | {cells} | {med[best_ours] / med[best_ct2]:.2f} ({best_ours} / {best_ct2}) | "
            f"{med['ours fp32'] / med['CT2 float32']:.2f} | {same:.1%} |",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
