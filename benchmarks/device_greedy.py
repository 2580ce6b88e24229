"""The device greedy step (runtime/step_graphs.py, ``device_greedy_graph``: SkipLayerNormalization written in, the
next step's tokens and lengths written on the device) against today's greedy step on the host, on the CPU
provider (not a test):

    python benchmarks/device_greedy.py --data ../shared/data/multi30k --out benchmarks/device_greedy.md

For each model and variant, every test_2016_flickr sentence decoded greedy with sentences joining in groups of 1-3
as others leave (``--in-flight`` at most at once), by the host's serving path (compact rows, numpy feeds, the
greedy step graph) and by the device path (buckets bound with IOBinding, as on CUDA, running the device greedy
step): how many outputs are token-identical. One intra-op thread.
"""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.batch_layout import continuous, engine_parser, flickr  # noqa: E402
from runtime.backend import OrtBackend  # noqa: E402
from runtime.cpu import describe_cpu  # noqa: E402
from runtime.options import flat_options  # noqa: E402

PATHS = {"host": {"batch_layout": "compact"}, "device": {"batch_layout": "buckets", "io_binding": True}}


def main() -> int:
    parser = engine_parser(__doc__)
    parser.add_argument("--in-flight", default="1,32")
    args = parser.parse_args()
    flights = [int(n) for n in args.in_flight.split(",")]
    rows = []
    for model in args.models.split(","):
        texts = flickr(args.data, model, args.sentences)
        for variant in args.variants.split(","):
            engines = {
                path: OrtBackend(
                    ROOT / "exported" / model, flat_options(provider="cpu", variant=variant, intra_op_threads=1, **spec)
                )
                for path, spec in PATHS.items()
            }
            assert engines["device"].device_k_steps is not None  # the device greedy step runs the greedy rows
            sources = engines["host"].tokenizer.encode_source(texts)
            for in_flight in flights:
                host, device = (continuous(engines[path], sources, 1, in_flight) for path in PATHS)
                same = sum(a == b for a, b in zip(host, device, strict=True))
                rows.append((model, variant, in_flight, same, len(sources)))
                print(rows[-1], flush=True)
    lines = [
        "# The device greedy step against the host's greedy step, on the CPU provider",
        "",
        f"command: `python benchmarks/device_greedy.py {shlex.join(sys.argv[1:])}`",
        f"machine: {describe_cpu()}; ONNX Runtime's CPU provider, one intra-op thread.",
        "",
        "Greedy outputs token-identical between the paths (sentences joining in groups of 1-3 as others leave):",
        "",
        "| model | variant | in flight | identical |",
        "|---|---|---|---|",
    ]
    lines += [f"| {m} | {v} | {n} | {same}/{total} ({same / total:.1%}) |" for m, v, n, same, total in rows]
    args.out.write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
