"""Glossaries on Multi30k's test_2016_flickr, both directions (not a test): are the expected terms there, and
what does BLEU do?

    python benchmarks/glossary_eval.py --model exported/default --data ../shared/data/multi30k
    python benchmarks/glossary_eval.py --model exported/default-de-en --data ../shared/data/multi30k

Each sentence gets its own glossary of 1 to 3 entries, source word → the word its reference uses for it. The
pairs come from the model's aligner (runtime/aligner.py, the heads server/documents/placement.py places markup with) run
on the source and the *reference* (forced alignment): a source word and a reference word
(server/documents/placement.py's units) are paired where each is the other's best-attended word, both are alphabetic, at
least 3 letters, appear once in their sentence and neither is a stop word (a short list per language below). That is a
precise dictionary heuristic, not a gold lexicon: it keeps only confident one-to-one pairs, which is what a glossary's
user would write. The sentences are translated through an in-process server (testkit), over gRPC, each with its glossary
in ``options.glossary`` and once without; the report gives

- the share of expected target terms present, once per occurrence of the source term matched (a term counts as
  present where the output holds it verbatim, or with its first letter made a capital at a sentence's start, as
  the service writes it), with and without the glossary;
- corpus BLEU (sacreBLEU, default tokenization) of the outputs with and without, on all the sentences.

Nothing of the corpus is written anywhere but the report's figures.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import sacrebleu

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from common.corpus import MULTI30K, corpus_path, read_lines  # noqa: E402
from proto import translate_pb2  # noqa: E402
from server.documents.aligned import source_words, unit_spans  # noqa: E402
from server.documents.glossary import Glossary  # noqa: E402
from testkit.servers import start_server  # noqa: E402

MAX_TERMS = 3
EN_STOP = "the and with are while who his her their its from into onto for that this there some"
DE_STOP = "der die das den dem des und mit ein eine einen einem einer ist sind auf von für sich"
STOP_WORDS = {"en": frozenset(EN_STOP.split(" ")), "de": frozenset(DE_STOP.split(" "))}


def words_of(pieces: list[str]) -> list[str]:
    """The words (server/documents/placement.py's units) of token pieces."""
    return ["".join(pieces[a:b]).replace("▁", "") for a, b in unit_spans(pieces)]


def term_pairs(engine, source: str, reference: str) -> dict[str, str]:
    """Up to MAX_TERMS source word → reference word pairs, each the other's best-attended word (see the doc)."""
    source_ids = engine.tokenizer.encode_source([source])[0]
    reference_ids = engine.tokenizer.encode_target([reference])[0]
    attention = engine.align([(source_ids, reference_ids)])[0]  # (reference tokens, source tokens)
    source_pieces, target_pieces = engine.source_pieces(source_ids), engine.target_pieces(reference_ids)
    source_of = source_words(source_pieces)
    target_of = source_words(target_pieces)
    attention = attention[: len(target_of), : len(source_of)]  # eos's row and column left out, where there
    rows, columns = np.asarray(target_of[: attention.shape[0]]), np.asarray(source_of[: attention.shape[1]])
    by_word = np.zeros((max(target_of) + 1, max(source_of) + 1))  # (reference words, source words)
    np.add.at(by_word, (rows[:, None], columns[None, :]), attention)
    sources, targets = words_of(source_pieces), words_of(target_pieces)
    stop = STOP_WORDS.get(engine.source_language, set())
    target_stop = STOP_WORDS.get(engine.target_language, set())  # a glossary maps content words on both sides
    pairs: dict[str, str] = {}
    for s, word in enumerate(sources):
        t = int(by_word[:, s].argmax())
        mutual = int(by_word[t].argmax()) == s
        usable = word.isalpha() and len(word) >= 3 and word.lower() not in stop and targets[t].isalpha()
        usable = usable and targets[t].lower() not in target_stop
        once = sources.count(word) == 1 and targets.count(targets[t]) == 1 and len(targets[t]) >= 3
        if mutual and usable and once and word.lower() not in {k.lower() for k in pairs}:
            pairs[word] = targets[t]
    return dict(list(pairs.items())[:MAX_TERMS])


def present(output: str, term: str, times: int) -> bool:
    """The term at least ``times`` times, verbatim or with a capital first letter (a sentence's start)."""
    capital = term[:1].upper() + term[1:]
    found = output.count(term) + (output.count(capital) if capital != term else 0)
    return found >= times


def translate(stub, texts: list[str], glossaries: list[dict[str, str]] | None) -> tuple[list[str], list[dict]]:
    def one(i: int) -> tuple[str, dict]:
        options = translate_pb2.TranslateOptions(glossary=glossaries[i] if glossaries else {}, mirror_formatting=False)
        answer = stub.Translate(translate_pb2.TranslateRequest(texts=[texts[i]], options=options), timeout=120)
        return answer.translations[0].text, dict(answer.translations[0].glossary_applied)

    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(one, range(len(texts))))
    return [text for text, _ in results], [applied for _, applied in results]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, default=ROOT / "exported" / "default")
    parser.add_argument("--data", type=Path, default=MULTI30K)
    parser.add_argument("--split", default="test_2016_flickr")
    parser.add_argument("--limit", type=int, default=0, help="the first N sentences only (0: all)")
    parser.add_argument("--out", type=Path, help="append the report (markdown) to this file")
    parser.add_argument("--variant", default="fp32", help="the engine's variant (the server's default: auto, int8)")
    args = parser.parse_args()
    manifest = json.loads((args.model / "manifest.json").read_text())
    source_language, target_language = manifest["source_language"], manifest["target_language"]
    sources = read_lines(corpus_path(args.data, args.split, source_language))
    references = read_lines(corpus_path(args.data, args.split, target_language))
    if args.limit:
        sources, references = sources[: args.limit], references[: args.limit]
    server = start_server(args.model, max_output_tokens=256, variant=args.variant)
    try:
        engine = server.server.models.default
        started = time.monotonic()
        glossaries = [term_pairs(engine, s, r) for s, r in zip(sources, references, strict=True)]
        built = time.monotonic() - started
        plain, _ = translate(server.stub, sources, None)
        glossed, applied = translate(server.stub, sources, glossaries)
    finally:
        server.close()
    expected = hits_with = hits_without = 0
    for source, glossary, with_it, without_it in zip(sources, glossaries, glossed, plain, strict=True):
        matched = Counter(o.key for o in Glossary(glossary).find(source))  # what the service matches
        for key, times in matched.items():
            expected += times
            hits_with += times * present(with_it, glossary[key], times)
            hits_without += times * present(without_it, glossary[key], times)
    with_terms = sum(1 for g in glossaries if g)
    bleu_without = sacrebleu.corpus_bleu(plain, [references]).score
    bleu_with = sacrebleu.corpus_bleu(glossed, [references]).score
    entries = sum(len(g) for g in glossaries)
    lines = [
        f"command: `python benchmarks/glossary_eval.py {' '.join(sys.argv[1:])}`",
        f"model: {manifest['name']} ({source_language}→{target_language}); {args.split}, {len(sources)} sentences, "
        f"{with_terms} with a glossary ({entries} entries, built in {built:.0f} s); {args.variant}, greedy",
        "",
        "| | expected target terms present | BLEU |",
        "|---|---|---|",
        f"| without the glossary | {hits_without}/{expected} ({100 * hits_without / max(expected, 1):.1f}%) "
        f"| {bleu_without:.2f} |",
        f"| with the glossary | {hits_with}/{expected} ({100 * hits_with / max(expected, 1):.1f}%) | {bleu_with:.2f} |",
        "",
        f"entries applied by the service: {sum(sum(a.values()) for a in applied)} of {expected} occurrences matched",
    ]
    report = "\n".join(lines) + "\n"
    print(report)
    if args.out:
        with open(args.out, "a") as out:
            out.write(report + "\n")
    return 0 if hits_with == expected else 1


if __name__ == "__main__":
    sys.exit(main())
