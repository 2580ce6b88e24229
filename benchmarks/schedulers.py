"""Continuous vs static batching under a mixed, long-tailed open-loop load (not a test).

    python benchmarks/schedulers.py --model exported/default --out benchmarks

Capacity is measured first (closed loop, the same mix, both schedulers; the
lower one counts); then each scheduler gets Poisson arrivals at 70% of it,
90% short texts (10-30 tokens) and 10% long ones (200-500 tokens), several
times, alternating. Reports medians of short-request p50/p99 and throughput,
for long inputs that are one run-on sentence and for long inputs that are
documents of short sentences.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
from pathlib import Path

import sentencepiece as spm

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from client import loadtest, loadtest_report  # noqa: E402
from runtime.cpu import describe_cpu  # noqa: E402
from testkit.servers import start_subprocess_server  # noqa: E402

SHORT_MAX = 32
# Long inputs as one run-on sentence each (the server cuts them into pieces of long_input_tokens), and as
# documents of short sentences (the server splits them into sentences).
PROFILES = ("mix:90:10-30:200-500:run-on", "mix:90:10-30:200-500")


def run_load(port: int, tokenizer, profile_spec: str, concurrency: int, rate: float, requests: int, seed: int) -> dict:
    args = loadtest.bounded(port, requests, 600, "--deadline", "120")
    run = asyncio.run(loadtest.drive(args, loadtest.Profile(profile_spec, tokenizer, seed), concurrency, rate))
    short = [r.latency for r in run.results if r.code == "OK" and r.input_tokens <= SHORT_MAX]
    long = [r.latency for r in run.results if r.code == "OK" and r.input_tokens > SHORT_MAX]
    ok = [r for r in run.results if r.code == "OK"]
    return {
        "requests_per_s": len(ok) / run.seconds,
        "short_p50": loadtest_report.percentile(short, 0.5),
        "short_p99": loadtest_report.percentile(short, 0.99),
        "long_p50": loadtest_report.percentile(long, 0.5),
        "long_p99": loadtest_report.percentile(long, 0.99),
        "errors": len(run.results) - len(ok),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, default=ROOT / "exported/default")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks")
    parser.add_argument("--profiles", default=",".join(PROFILES), help="comma-separated load profiles")
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--load", type=float, default=0.7, help="share of the measured capacity offered")
    args = parser.parse_args()
    tokenizer = spm.SentencePieceProcessor(model_file=str(args.model / "sentencepiece.model"))
    servers = {name: start_subprocess_server(args.model, "--scheduler", name) for name in ("static", "continuous")}
    rows = []
    try:
        for profile in args.profiles.split(","):
            capacity = {
                name: run_load(port, tokenizer, profile, 32, 0.0, args.requests, 0)["requests_per_s"]
                for name, (_, port, _) in servers.items()
            }
            rate = args.load * min(capacity.values())
            print(f"{profile}: capacity {capacity}; offering {rate:.1f} requests/s", file=sys.stderr)
            results: dict[str, list[dict]] = {name: [] for name in servers}
            for repeat in range(args.repeats):
                for name, (_, port, _) in servers.items():
                    results[name].append(run_load(port, tokenizer, profile, 0, rate, args.requests, seed=repeat + 1))
                    print(profile, name, results[name][-1], file=sys.stderr, flush=True)
            med = {name: {k: statistics.median(r[k] for r in runs) for k in runs[0]} for name, runs in results.items()}
            rows.append((profile, capacity, rate, med))
    finally:
        stop_servers(servers)
    lines = [
        f"command: `python benchmarks/schedulers.py {' '.join(sys.argv[1:])}`",
        f"machine: {describe_cpu()}; Poisson arrivals at {args.load:.0%} of the lower "
        f"measured capacity (closed loop, 32 clients); {args.requests} requests per run; medians of {args.repeats} "
        "runs, schedulers alternating; short = up to 32 source tokens",
        "",
        "| profile | capacity static / continuous req/s | offered req/s | scheduler | short p50 s | short p99 s "
        "| long p50 s | long p99 s | throughput req/s | errors |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for profile, capacity, rate, med in rows:
        for name, m in med.items():
            lines.append(
                f"| {profile} | {capacity['static']:.1f} / {capacity['continuous']:.1f} | {rate:.1f} | {name} "
                f"| {m['short_p50']:.3f} | {m['short_p99']:.3f} | {m['long_p50']:.3f} | {m['long_p99']:.3f} "
                f"| {m['requests_per_s']:.2f} | {m['errors']:.0f} |"
            )
    lines.append("")
    for profile, _, _, med in rows:
        s, c = med["static"], med["continuous"]
        lines.append(
            f"- {profile}: continuous vs static: short p99 {s['short_p99'] / c['short_p99']:.1f}× lower, "
            f"short p50 {s['short_p50'] / c['short_p50']:.1f}× lower, "
            f"throughput ×{c['requests_per_s'] / s['requests_per_s']:.2f}"
        )
    write_report(args.out / "schedulers.md", lines)
    return 0


def stop_servers(servers: dict) -> None:
    for process, _, _ in servers.values():
        process.terminate()
        process.wait(30)


def write_report(path: Path, lines: list[str]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    sys.exit(main())
