"""A long HTML document against the same text as single sentences: the server's CPU per input token (not a test).

    python benchmarks/document_cost.py --data ../shared/data/multi30k --out benchmarks/document_cost.md

One server at its defaults (the translation cache off, so both sides translate everything). Each repeat sends one
document of just under --chars characters (train-split sentences, eight to a ``<p>`` paragraph) as one HTTP
request in format "html", then the same sentences as single-sentence HTTP requests from --clients closed-loop
clients, alternating; each side's CPU is the server process's (user + system, from /proc) over its requests, its
input tokens the server's own translate_input_tokens_total. Medians over --repeats, each repeat on new sentences.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
import urllib.request
from datetime import date
from pathlib import Path

import aiohttp

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT)]

from common.corpus import MULTI30K, read_lines  # noqa: E402
from runtime.cpu import describe_cpu  # noqa: E402
from server.config import DEFAULT_MODELS  # noqa: E402
from testkit.servers import free_port, start_subprocess_server  # noqa: E402

SENTENCES_PER_PARAGRAPH = 8


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def input_tokens(metrics_port: int) -> float:
    text = urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=30).read().decode()
    return sum(
        float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith("translate_input_tokens_total{")
    )


def document(sentences: list[str], chars: int) -> tuple[str, list[str]]:
    """An HTML document of whole paragraphs of ``sentences`` under ``chars`` characters, and the sentences it holds."""
    html, used = "", []
    for start in range(0, len(sentences), SENTENCES_PER_PARAGRAPH):
        paragraph = sentences[start : start + SENTENCES_PER_PARAGRAPH]
        piece = "<p>" + " ".join(paragraph) + "</p>\n"
        if len(html) + len(piece) > chars:
            break
        html, used = html + piece, used + paragraph
    return html, used


async def post_all(url: str, bodies: list[dict], clients: int) -> None:
    """Every body posted once by ``clients`` closed-loop clients; each must be answered 200."""
    pending = iter(bodies)
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600)) as session:

        async def client() -> None:
            for body in pending:
                async with session.post(url, json=body) as response:
                    assert response.status == 200, (response.status, await response.text())
                    await response.read()

        await asyncio.gather(*(client() for _ in range(clients)))


def measure(pid: int, metrics_port: int, send) -> tuple[float, float, float]:
    """(CPU ms per input token, input tokens, wall seconds) of the server over ``send()``."""
    cpu, tokens, started = cpu_seconds(pid), input_tokens(metrics_port), time.monotonic()
    send()
    wall = time.monotonic() - started
    time.sleep(0.2)  # the last answer's bookkeeping
    used, counted = cpu_seconds(pid) - cpu, input_tokens(metrics_port) - tokens
    return 1000 * used / counted, counted, wall


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, default=MULTI30K)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "document_cost.md")
    parser.add_argument("--chars", type=int, default=99_000)
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--server-flag", action="append", default=[], help="a flag for python -m server")
    parser.add_argument("--checkout", type=Path, default=None, help="the checkout whose server runs (default: this)")
    args = parser.parse_args()
    lines = list(read_lines(args.data / "train.en.gz"))
    models = list(DEFAULT_MODELS)
    http_port = free_port()
    flags = ("--model", str(models[1]), "--http-port", str(http_port), *args.server_flag)
    process, _, metrics_port = start_subprocess_server(models[0], *flags, cwd=args.checkout)
    rows = []
    try:
        url = f"http://127.0.0.1:{http_port}/translate"
        offset = 0
        for _ in range(args.repeats):
            html, used = document(lines[offset:], args.chars)
            offset += len(used)
            one = [{"q": html, "source": "en", "target": "de", "format": "html"}]
            singles = [{"q": sentence, "source": "en", "target": "de"} for sentence in used]
            as_document = measure(process.pid, metrics_port, lambda: asyncio.run(post_all(url, one, 1)))
            as_sentences = measure(process.pid, metrics_port, lambda: asyncio.run(post_all(url, singles, args.clients)))
            rows.append((len(html), len(used), as_document, as_sentences))
            print(rows[-1], flush=True)
    finally:
        process.terminate()
        process.wait(60)
    ratios = [document[0] / sentences[0] for _, _, document, sentences in rows]
    report = [
        "# A long HTML document against the same text as single sentences",
        "",
        f"command: `python benchmarks/document_cost.py {' '.join(sys.argv[1:])}`, {date.today()}",
        f"machine: {describe_cpu()}; the load generator on the same cores; the server of "
        f"{args.checkout or 'this checkout'} at its defaults, cache off"
        f"{', ' + ' '.join(args.server_flag) if args.server_flag else ''}",
        "",
        "| repeat | characters | sentences | document: CPU ms / input token | wall s | sentences: CPU ms / input token "
        "| wall s | document / sentences |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for n, ((chars, count, document_side, sentence_side), ratio) in enumerate(zip(rows, ratios, strict=True), 1):
        report.append(
            f"| {n} | {chars:,} | {count:,} | {document_side[0]:.3f} | {document_side[2]:.1f} | {sentence_side[0]:.3f} "
            f"| {sentence_side[2]:.1f} | {ratio:.2f} |"
        )
    report += ["", f"median document / sentences: **{statistics.median(ratios):.2f}×**"]
    args.out.write_text("\n".join(report) + "\n")
    print("\n".join(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
