"""Twice the capacity, with long inputs, for a minute (not a test).

    python benchmarks/overload.py --data ../shared/data/multi30k --out benchmarks/overload.md

The server runs with the Kubernetes deployment's settings (its ConfigMap's TRANSLATE_* variables, both
default models). Capacity is measured first (closed loop, 32 clients, the same mix); then Poisson arrivals
at twice that rate for --seconds: 90% test_2016_flickr-length texts and 10% texts of 800-1,000 tokens.
Every request must be answered exactly once, by a translation or a documented refusal, and the server's
peak resident memory (sampled from /proc every 50 ms) must stay under the deployment's memory limit.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import threading
import time
from pathlib import Path

import sentencepiece as spm
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks")]

from front_ends import resident_bytes  # noqa: E402

from client import loadtest  # noqa: E402
from common.corpus import MULTI30K  # noqa: E402
from runtime.cpu import describe_cpu  # noqa: E402
from server.config import DEFAULT_MODELS  # noqa: E402
from testkit.servers import start_subprocess_server  # noqa: E402

DEPLOY = ROOT / "deploy" / "k8s" / "base"
REFUSALS = {"RESOURCE_EXHAUSTED", "DEADLINE_EXCEEDED"}  # documented answers under overload


def deployment_settings() -> tuple[dict[str, str], int]:
    """The ConfigMap's TRANSLATE_* variables and the container's memory limit in bytes."""
    environment = yaml.safe_load((DEPLOY / "configmap.yaml").read_text())["data"]
    deployment = yaml.safe_load((DEPLOY / "deployment.yaml").read_text())
    limit = deployment["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]["memory"]
    units = {"Gi": 1 << 30, "Mi": 1 << 20}
    return environment, int(float(limit[:-2]) * units[limit[-2:]])


class PeakRss(threading.Thread):
    def __init__(self, pid: int) -> None:
        super().__init__(daemon=True)
        self.pid, self.peak, self.running = pid, 0, True

    def run(self) -> None:
        while self.running:
            self.peak = max(self.peak, resident_bytes(self.pid))
            time.sleep(0.05)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, default=MULTI30K)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "overload.md")
    parser.add_argument("--seconds", type=float, default=60.0)
    args = parser.parse_args()
    environment, limit = deployment_settings()
    flags = [f"--{name[len('TRANSLATE_') :].lower().replace('_', '-')}={value}" for name, value in environment.items()]
    flags = [flag for flag in flags if not flag.startswith(("--port=", "--metrics-port=", "--http-port=", "--host="))]
    models = [arg for folder in list(DEFAULT_MODELS)[1:] for arg in ("--model", str(folder))]
    process, port, _ = start_subprocess_server(next(iter(DEFAULT_MODELS)), *models, *flags)
    idle = resident_bytes(process.pid)
    tokenizer = spm.SentencePieceProcessor(model_file=str(next(iter(DEFAULT_MODELS)) / "sentencepiece.model"))
    profile_spec = "mix:90:10-30:800-1000"
    target = ["--target", f"127.0.0.1:{port}", "--metrics", "", "--deadline", "30"]
    sampler = PeakRss(process.pid)
    try:
        capacity_args = loadtest.parse_args([*target, "--requests", "200", "--duration", "60"])
        capacity_run = asyncio.run(loadtest.drive(capacity_args, loadtest.Profile(profile_spec, tokenizer, 1), 32, 0.0))
        capacity = sum(r.code == "OK" for r in capacity_run.results) / capacity_run.seconds
        rate = 2 * capacity
        sampler.start()
        requests = int(rate * args.seconds)
        overload_args = loadtest.parse_args([*target, "--requests", str(requests), "--duration", str(args.seconds)])
        run = asyncio.run(loadtest.drive(overload_args, loadtest.Profile(profile_spec, tokenizer, 2), 0, rate))
    finally:
        sampler.running = False
        process.terminate()
        process.wait(60)
    summary = loadtest.summarize(run)
    answered = sum(summary["codes"].values())
    unexpected = {code: n for code, n in summary["codes"].items() if code != "OK" and code not in REFUSALS}
    lines = [
        f"command: `python benchmarks/overload.py {' '.join(sys.argv[1:])}`",
        f"machine: {describe_cpu()}, client on the same cores; "
        "server with the deployment's "
        f"ConfigMap ({' '.join(flags)}), both default models; profile {profile_spec}",
        "",
        f"capacity (closed loop, 32 clients): {capacity:.1f} req/s; offered: {rate:.1f} req/s (Poisson) for "
        f"{args.seconds:.0f} s",
        f"sent {len(run.results)}, answered {answered} (each exactly once: {answered == len(run.results)}); "
        f"by code {summary['codes']}; other codes: {unexpected or 'none'}",
        f"translated p50 {summary['latency']['p50']:.3f} s, p99 {summary['latency']['p99']:.3f} s",
        f"resident memory: idle {idle / 2**20:.0f} MiB, peak {sampler.peak / 2**20:.0f} MiB; deployment limit "
        f"{limit / 2**20:.0f} MiB (peak / limit {sampler.peak / limit:.2f})",
    ]
    args.out.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0 if answered == len(run.results) and not unexpected and sampler.peak < limit else 1


if __name__ == "__main__":
    sys.exit(main())
