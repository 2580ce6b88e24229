"""ONNX Runtime's intra-op threads in the server: spinning or not, and how many (not a test).

    python benchmarks/threads.py --model exported/default

Every variant runs as its own server process, side by side; each gets the
same closed-loop capacity run (32 clients) and open-loop Poisson runs at a
fixed rate, alternating. Reports capacity and medians of short-request
p50/p99, for both schedulers.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import sentencepiece as spm

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from schedulers import run_load, stop_servers, write_report  # noqa: E402

from runtime.cpu import describe_cpu  # noqa: E402
from testkit.servers import start_subprocess_server  # noqa: E402

VARIANTS = {
    "2 threads, spinning": ["--intra-op-threads", "0", "--intra-op-spinning", "true"],
    "2 threads, no spinning": ["--intra-op-threads", "0", "--intra-op-spinning", "false"],
    "1 thread": ["--intra-op-threads", "1"],
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, default=ROOT / "exported/default")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks")
    parser.add_argument("--profile", default="mix:90:10-30:200-500:run-on")
    parser.add_argument("--rate", type=float, default=23.0, help="open-loop requests/s")
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    tokenizer = spm.SentencePieceProcessor(model_file=str(args.model / "sentencepiece.model"))
    servers = {
        (scheduler, name): start_subprocess_server(args.model, "--scheduler", scheduler, *flags)
        for scheduler in ("static", "continuous")
        for name, flags in VARIANTS.items()
    }
    try:
        capacity = {
            key: run_load(port, tokenizer, args.profile, 32, 0.0, args.requests, 0)["requests_per_s"]
            for key, (_, port, _) in servers.items()
        }
        runs: dict[tuple[str, str], list[dict]] = {key: [] for key in servers}
        for repeat in range(args.repeats):
            for key, (_, port, _) in servers.items():
                runs[key].append(run_load(port, tokenizer, args.profile, 0, args.rate, args.requests, repeat + 1))
                print(key, runs[key][-1], file=sys.stderr, flush=True)
    finally:
        stop_servers(servers)
    lines = [
        f"command: `python benchmarks/threads.py {' '.join(sys.argv[1:])}`",
        f"machine: {describe_cpu()}, client on the same cores; profile {args.profile}; "
        f"capacity: closed loop, 32 clients; latency: Poisson arrivals at {args.rate:g}/s, {args.requests} requests "
        f"per run, medians of {args.repeats} runs; all variants side by side",
        "",
        "| scheduler | ONNX Runtime threads | capacity req/s | short p50 s | short p99 s | long p50 s |",
        "|---|---|---|---|---|---|",
    ]
    for (scheduler, name), results in runs.items():
        med = {k: statistics.median(r[k] for r in results) for k in results[0]}
        lines.append(
            f"| {scheduler} | {name} | {capacity[scheduler, name]:.1f} | {med['short_p50']:.3f} "
            f"| {med['short_p99']:.3f} | {med['long_p50']:.3f} |"
        )
    write_report(args.out / "threads.md", lines)
    return 0


if __name__ == "__main__":
    sys.exit(main())
