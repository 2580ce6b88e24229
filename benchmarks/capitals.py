"""Capitals translated as text (not a test): test_2016_flickr sent in capitals, and in lower case, through the
server (in process, each default model at the server's own variant and beam, the cache off), scored by BLEU
ignoring case against the same sentences sent as written; beside it, the model reading the capitals as sent (the
engine alone, as the server did before it read capitals in the model's case). Also the runaway guard's flags.

    python benchmarks/capitals.py --data ../shared/data/multi30k --out benchmarks/capitals.md
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import sacrebleu

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from common.corpus import corpus_path, read_lines  # noqa: E402
from runtime import offline  # noqa: E402
from runtime.backend import OrtBackend  # noqa: E402
from runtime.cpu import describe_cpu  # noqa: E402
from runtime.options import RuntimeOptions  # noqa: E402
from runtime.stops import stop_rules  # noqa: E402
from server.config import ServerConfig  # noqa: E402
from testkit.servers import RunningServer, free_port, server_config  # noqa: E402

MODELS = {"en→de": ("default", "en", "de"), "de→en": ("default-de-en", "de", "en")}
REQUEST = 50  # sentences a request


def caseless_bleu(outputs: list[str], references: list[list[str]]) -> float:
    """BLEU with case folded on both sides (str.casefold: "STRASSE", German's "Straße" in capitals, is "straße"
    folded, which sacreBLEU's lowercase option would count as another word)."""
    folded = [[line.casefold() for line in reference] for reference in references]
    return sacrebleu.corpus_bleu([line.casefold() for line in outputs], folded).score


def served(server: RunningServer, sentences: list[str]) -> tuple[list[str], int]:
    """Each sentence's translation over gRPC Translate (mirroring on, as a caller gets it) and how many the
    runaway guard flagged."""
    outputs, flagged = [], 0
    for first in range(0, len(sentences), REQUEST):
        response = server.translate(sentences[first : first + REQUEST], timeout=300)
        outputs += [t.text for t in response.translations]
        flagged += sum(bool(t.guard) for t in response.translations)
    return outputs, flagged


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--sentences", type=int, default=1000)
    args = parser.parse_args()
    defaults = ServerConfig()
    rows, variants = [], set()
    for pair, (folder, source, target) in MODELS.items():
        sources = read_lines(corpus_path(args.data, "test_2016_flickr", source))[: args.sentences]
        references = [read_lines(corpus_path(args.data, "test_2016_flickr", target))[: args.sentences]]
        model = ROOT / "exported" / folder
        config = server_config(
            model,
            http_port=free_port(),
            engine=defaults.engine,
            default_beam_size=defaults.default_beam_size,
            max_output_tokens=defaults.max_output_tokens,
        )
        server = RunningServer(config)
        try:
            for name, sent in (
                ("as written", sources),
                ("in capitals", [s.upper() for s in sources]),
                ("in lower case", [s.lower() for s in sources]),
            ):
                outputs, flagged = served(server, sent)
                bleu = caseless_bleu(outputs, references)
                rows.append(f"| {pair} | {name} | server | {bleu:.2f} | {flagged} |")
                print(rows[-1], flush=True)
            capitals = [s.upper() for s in sources]
            backend = OrtBackend(model, RuntimeOptions(settings=defaults.engine))
            variants.add(backend.variant)
            rules = stop_rules(defaults.max_repeats)  # the server's
            raw = offline.translate(backend, capitals, beam=defaults.default_beam_size, stop_rules=rules)
            bleu = caseless_bleu(raw, references)
            rows.append(f"| {pair} | in capitals | the model reading them as sent (before) | {bleu:.2f} | |")
            print(rows[-1], flush=True)
        finally:
            server.close()
    lines = [
        "# Capitals translated as text",
        "",
        f"command: `python benchmarks/capitals.py {' '.join(sys.argv[1:])}`",
        f"machine: {describe_cpu()}; sacreBLEU {sacrebleu.__version__}, default tokenization, case folded on "
        f"both sides (`str.casefold`: ß and SS alike), test_2016_flickr ({args.sentences:,} sentences); the "
        f"server's defaults (variant {defaults.engine.variant}: {', '.join(sorted(variants))} here, "
        f"beam {defaults.default_beam_size}), the cache off.",
        "",
        "| model | sources | read by | BLEU, case ignored | flagged by the runaway guard |",
        "|---|---|---|---|---|",
        *rows,
        "",
    ]
    args.out.write_text("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
