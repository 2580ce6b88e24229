"""Soak run (``make soak``, not in CI): a server under steady closed-loop load for
``--duration`` seconds; reports resident memory growth per hour after warm-up.

    python benchmarks/soak.py --model exported/default --duration 600
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from server import loadtest  # noqa: E402
from tests.server.test_lifecycle import start_subprocess_server  # noqa: E402


def rss(metrics_port: int) -> float:
    body = urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5).read().decode()
    return next(
        float(line.split()[1]) for line in body.splitlines() if line.startswith("process_resident_memory_bytes ")
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, default=ROOT / "exported/default")
    parser.add_argument("--duration", type=float, default=600.0)
    parser.add_argument("--warmup", type=float, default=60.0)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--profile", default="mix:90:10-30:100-300")
    args = parser.parse_args()
    process, port, metrics_port = start_subprocess_server(args.model)
    samples: list[tuple[float, float]] = []
    try:
        load = loadtest.parse_args(
            ["--target", f"127.0.0.1:{port}", "--metrics", "", "--requests", str(10**9), "--duration", "30"]
        )
        import sentencepiece as spm

        profile = loadtest.Profile(
            args.profile, spm.SentencePieceProcessor(model_file=str(args.model / "sentencepiece.model"))
        )
        start = time.monotonic()
        while time.monotonic() - start < args.duration:
            run = asyncio.run(loadtest.drive(load, profile, args.concurrency, 0.0))
            samples.append((time.monotonic() - start, rss(metrics_port)))
            errors = sum(r.code != "OK" for r in run.results)
            print(
                f"t={samples[-1][0]:6.0f}s rss={samples[-1][1] / 2**20:7.1f} MiB "
                f"requests={len(run.results)} errors={errors}",
                flush=True,
            )
    finally:
        process.terminate()
        process.wait(30)
    steady = [(t, m) for t, m in samples if t >= args.warmup]
    if len(steady) < 2:
        print("too short to measure growth; raise --duration")
        return 1
    slope = statistics.linear_regression([t for t, _ in steady], [m for _, m in steady]).slope
    print(
        f"memory growth after {args.warmup:.0f}s warm-up: {slope * 3600 / 2**20:+.1f} MiB/hour "
        f"(from {steady[0][1] / 2**20:.1f} to {steady[-1][1] / 2**20:.1f} MiB)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
