"""What alternatives cost: ``python benchmarks/alternatives.py --model DIR [--sentences 40] [--rounds 3]``.

An in-process server (cache off, the server's default beam: greedy) answers test_2016_flickr sentences one
HTTP /translate request at a time: with ``alternatives`` 0 and 3 (the beam widened to 4), with 0 and 3 over
gRPC at beam 4 (what assembling the alternatives costs beside the beam), and as format=html with the first
word in <b> (the aligner places each alternative's markup). Prints the median ms per request of the
alternating rounds.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from common.corpus import MULTI30K, corpus_path, read_lines  # noqa: E402
from runtime.cpu import describe_cpu  # noqa: E402
from testkit.servers import http, start_server  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, required=True)
    parser.add_argument("--data", type=Path, default=MULTI30K)
    parser.add_argument("--sentences", type=int, default=40)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    sentences = read_lines(corpus_path(args.data, "test_2016_flickr", "en"))[: args.sentences]
    marked = [f"<p><b>{first}</b> {rest}</p>" for first, rest in (s.split(" ", 1) for s in sentences)]
    server = start_server(args.model, max_output_tokens=256, cache_mib=0)

    def over_http(texts: list[str], alternatives: int, format: str = "text") -> Callable[[], None]:
        def send() -> None:
            for q in texts:
                fields = {"q": q, "source": "en", "target": "de", "format": format, "alternatives": alternatives}
                status, _, body = http(server, "/translate", fields)
                assert status == 200, body

        return send

    def over_grpc(alternatives: int) -> Callable[[], None]:
        return lambda: [server.translate([s], beam=4, alternatives=alternatives) for s in sentences]

    conditions = {
        "HTTP alternatives 0 (greedy)": over_http(sentences, 0),
        "HTTP alternatives 3 (beam 4)": over_http(sentences, 3),
        "gRPC beam 4, alternatives 0": over_grpc(0),
        "gRPC beam 4, alternatives 3": over_grpc(3),
        "HTTP html, alternatives 0": over_http(marked, 0, "html"),
        "HTTP html, alternatives 3": over_http(marked, 3, "html"),
    }
    try:
        for send in conditions.values():
            send()  # warm
        times: dict[str, list[float]] = {name: [] for name in conditions}
        for _ in range(args.rounds):
            for name, send in conditions.items():
                started = time.perf_counter()
                send()
                times[name].append((time.perf_counter() - started) / len(sentences) * 1000)
    finally:
        server.close()
    print(f"machine: {describe_cpu()}; {args.model}, fp32; {len(sentences)} sentences, {args.rounds} rounds")
    for name, values in times.items():
        rounds = ", ".join(f"{v:.1f}" for v in values)
        print(f"{name}: median {statistics.median(values):.1f} ms per request ({rounds})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
