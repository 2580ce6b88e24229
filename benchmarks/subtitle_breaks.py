"""A subtitle's line break: each line translated as a text of its own, or the cue one text with the break an
atom the aligner places (what /translate_file does, server/documents/subtitles.py) (not a test).

    python benchmarks/subtitle_breaks.py --model exported/default --data ../shared/data/multi30k

The sentences of test_2016_flickr longer than a subtitle line (42 characters) are wrapped at the space nearest
their middle, as a two-line cue; BLEU of the lines joined again, against the references, for both ways and for
the sentence sent unwrapped; and where the aligner put the break (inside the output, and the shorter line's share
of its characters).
"""

from __future__ import annotations

import argparse
import datetime
import json
import re
import sys
from pathlib import Path

import sacrebleu

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from common.corpus import MULTI30K, corpus_path, read_lines  # noqa: E402
from runtime.cpu import describe_cpu  # noqa: E402
from server.documents.files import read_document  # noqa: E402
from testkit.servers import http, start_server  # noqa: E402

LINE_CHARACTERS = 42  # the usual limit of a subtitle line


def wrap(sentence: str) -> tuple[str, str]:
    at = min((m.start() for m in re.finditer(" ", sentence)), key=lambda n: abs(n - len(sentence) / 2))
    return sentence[:at], sentence[at + 1 :]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, default=ROOT / "exported" / "default")
    parser.add_argument("--data", type=Path, default=MULTI30K)
    parser.add_argument("--split", default="test_2016_flickr")
    parser.add_argument("--sentences", type=int, default=400)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "subtitle_breaks.md")
    args = parser.parse_args()
    manifest = json.loads((args.model / "manifest.json").read_text())
    source, target = manifest["source_language"], manifest["target_language"]
    pairs = [
        (s, r)
        for s, r in zip(
            read_lines(corpus_path(args.data, args.split, source)),
            read_lines(corpus_path(args.data, args.split, target)),
            strict=True,
        )
        if len(s) > LINE_CHARACTERS
    ][: args.sentences]
    sources, references = [s for s, _ in pairs], [r for _, r in pairs]
    server = start_server(args.model, max_output_tokens=256, batch_limit=len(pairs) * 2)

    def translate(texts: list[str], format: str) -> list[str]:
        status, _, answer = http(
            server, "/translate", {"q": texts, "source": source, "target": target, "format": format}
        )
        assert status == 200, answer
        return answer["translatedText"]

    lines = [wrap(s) for s in sources]
    cues = "".join(f"{n}\n00:00:0{n % 10},000 --> 00:00:0{n % 10},500\n{a}\n{b}\n\n" for n, (a, b) in enumerate(lines))
    document = read_document("film.srt", cues.encode())
    placed = translate(document.texts, document.format)
    written = [cue.split("\n")[2:] for cue in document.write(placed).decode().split("\n\n")[:-1]]
    line_by_line = translate([line for pair in lines for line in pair], "text")
    inside = [re.fullmatch(r"(.+?)\s*<!--0-->\s*(.+)", p, re.S) for p in placed]
    shorter = [min(len(m[1]), len(m[2])) / (len(m[1]) + len(m[2])) for m in inside if m]
    rows = [
        ("the sentence unwrapped (the ceiling)", translate(sources, "text")),
        (
            "each line a text of its own",
            [f"{a} {b}" for a, b in zip(line_by_line[::2], line_by_line[1::2], strict=True)],
        ),
        ("the cue one text, the break an atom (/translate_file)", [" ".join(lines) for lines in written]),
    ]
    out = [
        f"command: `python benchmarks/subtitle_breaks.py {' '.join(sys.argv[1:])}`",
        f"date: {datetime.date.today()}; CPU: {describe_cpu()}",
        f"model: {manifest['name']} ({source}→{target}), fp32, greedy; {args.split}: the first {len(pairs)} sentences "
        f"over {LINE_CHARACTERS} characters, each wrapped at the space nearest its middle",
        "",
        "| how a two-line cue is translated | BLEU |",
        "|---|---|",
        *(f"| {name} | {sacrebleu.corpus_bleu(hyps, [references]).score:.1f} |" for name, hyps in rows),
        "",
        f"The aligner put the break inside the output in {len(shorter)} of {len(pairs)} cues; the shorter line held "
        f"{sum(shorter) / max(len(shorter), 1):.0%} of the characters on average (the source's: "
        f"{sum(min(len(a), len(b)) / (len(a) + len(b)) for a, b in lines) / len(lines):.0%}); "
        f"{sum(len(cue) == 2 for cue in written)} of the {len(written)} cues written kept two lines.",
    ]
    server.close()
    args.out.write_text("\n".join(out) + "\n")
    print("\n".join(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
