"""The quality side of the server's default variant and beam (not a test): corpus BLEU on test_2016_flickr of
both default models, fp32 and int8, greedy and beam 4, through ``translate-file`` (the engine the server runs,
the runaway guard as served):

    python benchmarks/defaults_quality.py --data ../shared/data/multi30k --out benchmarks/defaults_quality.md

The throughput side is benchmarks/every_core.py with an int8 side (``--side int8=.:--variant int8``).
"""

from __future__ import annotations

import argparse
import gzip
import subprocess
import sys
from itertools import product
from pathlib import Path

import sacrebleu

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from runtime.cpu import describe_cpu  # noqa: E402

MODELS = {"en→de": ("default", "en", "de"), "de→en": ("default-de-en", "de", "en")}


def read(path: Path) -> list[str]:
    with gzip.open(path, "rt", encoding="utf-8") as lines:
        return [line.rstrip("\n") for line in lines]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    rows = []
    for (pair, (folder, source, target)), variant, beam in product(MODELS.items(), ("fp32", "int8"), (1, 4)):
        sources = read(args.data / f"test_2016_flickr.{source}.gz")
        references = read(args.data / f"test_2016_flickr.{target}.gz")
        command = [sys.executable, "-m", "runtime.translate_file", "--model", str(ROOT / "exported" / folder)]
        command += ["--variant", variant, "--beam", str(beam)]
        done = subprocess.run(
            command, cwd=ROOT, input="\n".join(sources) + "\n", capture_output=True, text=True, check=True
        )
        outputs = done.stdout.splitlines()
        assert len(outputs) == len(sources), (len(outputs), len(sources))
        bleu = sacrebleu.corpus_bleu(outputs, [references]).score
        rows.append(f"| {pair} | {variant} | {'greedy' if beam == 1 else f'beam {beam}'} | {bleu:.2f} |")
        print(rows[-1], flush=True)
    lines = [
        "# Default variant and beam: quality",
        "",
        f"command: `python benchmarks/defaults_quality.py {' '.join(sys.argv[1:])}`",
        f"machine: {describe_cpu()}; sacreBLEU {sacrebleu.__version__}, default tokenization, test_2016_flickr "
        "(1,000 sentences).",
        "",
        "| model | variant | search | BLEU |",
        "|---|---|---|---|",
        *rows,
    ]
    args.out.write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
