"""Language detection (not a test): what server/documents/detect.py's LanguageDetector costs and gets right for the
default models' languages (en and de served), in each ``--language-detection`` mode.

    python benchmarks/language_detection.py --data ../shared/data/multi30k --out benchmarks/language_detection.md

Resident memory: a fresh process's VmRSS after building the detector, against before it (lingua not imported: what
``off`` holds). Accuracy, on test_2016_flickr: English and German sentences, and their first one to three words
(testkit.sentences.first_words), that source "auto" (LanguageDetector.best) takes as their language; French ones,
which no model reads, that it refuses as French. Time: per English or German sentence, one thread. Confidence
(accurate mode): the top confidence /detect gives each English and German sentence at each calibration power
(server/documents/detect.py's SHARPNESS; 1 is lingua's own), and what it gives the first 1-3 words it takes wrongly.
"""

from __future__ import annotations

import argparse
import gc
import re
import shlex
import statistics
import subprocess
import sys
import time
from datetime import date
from importlib.metadata import version
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from common.corpus import MULTI30K, corpus_path, read_lines  # noqa: E402
from runtime.cpu import describe_cpu  # noqa: E402
from server.documents.detect import SHARPNESS, Detected, LanguageDetector  # noqa: E402
from server.errors import InvalidRequest  # noqa: E402
from testkit.sentences import first_words  # noqa: E402

SERVED = ("en", "de")
MODES = ("accurate", "light")
# What short and odd texts come to, besides the corpus: greetings, coin tosses, nonsense, no letters.
DETECTED = re.compile(r"source=auto detected (\w+)")  # how LanguageDetector.best names a language no model reads
EXAMPLES = ("Hello", "Danke", "A man", "Bonjour", "Le chat dort sur le canapé.", "Hola", "asdfgh qwerty zxcv", "12345")


def resident_mib() -> float:
    status = Path("/proc/self/status").read_text()
    return next(int(line.split()[1]) for line in status.splitlines() if line.startswith("VmRSS:")) / 1024


def memory_added_mib(mode: str) -> float:
    """In a fresh process: the resident memory building the detector adds."""
    command = [sys.executable, __file__, "--memory-of", mode]
    return float(subprocess.run(command, capture_output=True, text=True, check=True).stdout)


def verdict(detector: LanguageDetector, text: str) -> str:
    """What source "auto" makes of text: its language, or the language it is refused as ("refused" otherwise)."""
    try:
        return detector.best([text]).language
    except InvalidRequest as error:
        named = DETECTED.match(str(error))
        return f"refused as {named[1]}" if named else "refused"


def share(verdicts: list[str], wanted: str) -> str:
    return f"{100 * sum(v == wanted for v in verdicts) / len(verdicts):.1f}%"


def row(mode: str, data: Path) -> tuple[str, str]:
    """This mode's line of the accuracy table, and of the examples table."""
    detector = LanguageDetector(SERVED, mode)
    figures, seconds, sentences = [], 0.0, 0
    for language in (*SERVED, "fr"):
        lines = read_lines(corpus_path(data, "test_2016_flickr", language))
        wanted = "refused as French" if language == "fr" else language
        started = time.perf_counter()
        figures.append(share([verdict(detector, line) for line in lines], wanted))
        if language in SERVED:
            seconds, sentences = seconds + time.perf_counter() - started, sentences + len(lines)
        figures.append(share([verdict(detector, text) for text in first_words(lines)], wanted))
    memory = memory_added_mib(mode)
    accuracy = f"| {mode} | +{memory:.0f} MiB | {' | '.join(figures)} | {1000 * seconds / sentences:.2f} |"
    return accuracy, f"| {mode} | {' | '.join(verdict(detector, text) for text in EXAMPLES)} |"


def top(found: list[Detected]) -> tuple[str, float]:
    """The first language found and its confidence ("" and 0 where none was)."""
    return (found[0].language, found[0].confidence) if found else ("", 0.0)


def confidence_cells(detector: LanguageDetector, lines: list[str], language: str) -> list[str]:
    """The sentences' confidence in language (0 where another comes first): 5th percentile / median / share at
    95 or more; and of their first words taken as another language, the median confidence and how many reach 95."""
    tops = [confidence if found == language else 0.0 for found, confidence in map(top, map(detector.detect, lines))]
    high = sum(c >= 95 for c in tops) / len(tops)
    spread = f"{statistics.quantiles(tops, n=20)[0]:.1f} / {statistics.median(tops):.1f} / {100 * high:.1f}%"
    short = map(top, map(detector.detect, first_words(lines)))
    wrong = [confidence for found, confidence in short if found not in ("", language)]
    return [spread, f"{statistics.median(wrong):.1f}, {sum(c >= 95 for c in wrong)} of {len(wrong)}"]


def confidence_rows(data: Path) -> list[str]:
    """A line per calibration power (accurate mode): each served language's cells, and "A man"'s confidence."""
    corpus = {language: read_lines(corpus_path(data, "test_2016_flickr", language)) for language in SERVED}
    detector = LanguageDetector(SERVED, "accurate")
    rows = []
    for power in (1, 2, 3, 4):
        detector.sharpness = power
        cells = [cell for language, lines in corpus.items() for cell in confidence_cells(detector, lines, language)]
        cells.append(f"{top(detector.detect('A man'))[1]:.1f}")
        rows.append(f"| {power}{' (SHARPNESS)' if power == SHARPNESS else ''} | {' | '.join(cells)} |")
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, default=MULTI30K)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "language_detection.md")
    parser.add_argument("--memory-of", choices=MODES, help=argparse.SUPPRESS)  # the fresh process memory_added_mib runs
    args = parser.parse_args()
    if args.memory_of:
        gc.collect()
        before = resident_mib()
        LanguageDetector(SERVED, args.memory_of)
        gc.collect()
        print(resident_mib() - before)
        return 0
    rows = [row(mode, args.data) for mode in MODES]
    lines = [
        f"command: `python benchmarks/language_detection.py {shlex.join(sys.argv[1:])}` ({date.today()})",
        f"machine: {describe_cpu()}; lingua {version('lingua-language-detector')}; served: {', '.join(SERVED)}",
        "",
        "| mode | resident memory (against off) | en sentences right | en first 1-3 words right | de sentences right "
        "| de first 1-3 words right | fr sentences refused as French | fr first 1-3 words refused as French "
        "| ms per sentence |",
        "|---|---|---|---|---|---|---|---|---|",
        *(accuracy for accuracy, _ in rows),
        "",
        f"| mode | {' | '.join(f'`{text}`' for text in EXAMPLES)} |",
        f"|---|{'---|' * len(EXAMPLES)}",
        *(examples for _, examples in rows),
        "",
        "| calibration power | en sentences: 5th percentile / median / ≥ 95 | en first words taken wrongly: median, "
        "≥ 95 | de sentences: 5th percentile / median / ≥ 95 | de first words taken wrongly: median, ≥ 95 "
        "| `A man` |",
        "|---|---|---|---|---|---|",
        *confidence_rows(args.data),
    ]
    args.out.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
