"""Continuous vs static batching under a mixed, long-tailed open-loop load (not a test).

    python tests/benchmarks/schedulers.py --model exported/default --out tests/benchmarks

Capacity is measured first (closed loop, the same mix, both schedulers; the
lower one counts); then each scheduler gets Poisson arrivals at 70% of it,
90% short texts (10-30 tokens) and 10% long ones (200-500 tokens), several
times, alternating. Reports medians of short-request p50/p99 and throughput.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import statistics
import sys
from pathlib import Path

import sentencepiece as spm

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from server import loadtest  # noqa: E402
from tests.server.test_lifecycle import start_subprocess_server  # noqa: E402

SHORT_MAX = 32


def run_load(port: int, tokenizer, profile_spec: str, concurrency: int, rate: float, requests: int, seed: int) -> dict:
    args = argparse.Namespace(
        target=f"127.0.0.1:{port}", metrics="", requests=requests, duration=600.0, deadline=120.0, beam=0
    )
    run = asyncio.run(loadtest.drive(args, loadtest.Profile(profile_spec, tokenizer, seed), concurrency, rate))
    short = [r.latency for r in run.results if r.code == "OK" and r.input_tokens <= SHORT_MAX]
    ok = [r for r in run.results if r.code == "OK"]
    return {
        "requests_per_s": len(ok) / run.seconds,
        "short_p50": loadtest.percentile(short, 0.5),
        "short_p99": loadtest.percentile(short, 0.99),
        "errors": len(run.results) - len(ok),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, default=ROOT / "exported/default")
    parser.add_argument("--out", type=Path, default=ROOT / "tests/benchmarks")
    parser.add_argument("--profile", default="mix:90:10-30:200-500")
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--load", type=float, default=0.7, help="share of the measured capacity offered")
    args = parser.parse_args()
    tokenizer = spm.SentencePieceProcessor(model_file=str(args.model / "sentencepiece.model"))
    servers = {name: start_subprocess_server(args.model, "--scheduler", name) for name in ("static", "continuous")}
    try:
        capacity = {name: run_load(port, tokenizer, args.profile, 32, 0.0, args.requests, 0)["requests_per_s"]
                    for name, (_, port, _) in servers.items()}  # fmt: skip
        rate = args.load * min(capacity.values())
        print(f"capacity {capacity}; offering {rate:.1f} requests/s", file=sys.stderr)
        results: dict[str, list[dict]] = {name: [] for name in servers}
        for repeat in range(args.repeats):
            for name, (_, port, _) in servers.items():
                results[name].append(run_load(port, tokenizer, args.profile, 0, rate, args.requests, seed=repeat + 1))
                print(name, results[name][-1], file=sys.stderr, flush=True)
    finally:
        for process, _, _ in servers.values():
            process.terminate()
            process.wait(30)
    med = {name: {k: statistics.median(r[k] for r in runs) for k in runs[0]} for name, runs in results.items()}
    lines = [
        f"command: `python tests/benchmarks/schedulers.py {' '.join(sys.argv[1:])}`",
        f"machine: {platform.machine()}, {os.cpu_count()} cores; profile {args.profile}; Poisson arrivals at {rate:.1f}/s "
        f"({args.load:.0%} of the measured capacity {min(capacity.values()):.1f}/s); {args.requests} requests per run; "
        f"medians of {args.repeats} runs, schedulers alternating",
        "",
        "| scheduler | short p50 s | short p99 s | throughput req/s | errors |",
        "|---|---|---|---|---|",
    ]
    for name, m in med.items():
        lines.append(
            f"| {name} | {m['short_p50']:.3f} | {m['short_p99']:.3f} | {m['requests_per_s']:.2f} | {m['errors']:.0f} |"
        )
    s, c = med["static"], med["continuous"]
    lines += ["", f"continuous vs static: short p99 {s['short_p99'] / c['short_p99']:.1f}× lower, "
                  f"short p50 {s['short_p50'] / c['short_p50']:.1f}× lower, throughput ×{c['requests_per_s'] / s['requests_per_s']:.2f}"]  # fmt: skip
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "schedulers.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
