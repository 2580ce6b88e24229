"""Soak run (``make soak``, not in CI): a TLS server under steady closed-loop load for ``--duration``
seconds, the traffic mixed (``--window`` seconds of gRPC, then of HTTPS, in turn), its certificate rotated
a third of the way in (new files in place, signed by a second CA the clients also trust) and its model folder
swapped two thirds in (the folder renamed away and a fresh copy put where it was, under the running server);
reports resident memory growth per hour after warm-up and the errors of every window.

    python benchmarks/soak.py --model exported/default --duration 3600 --out benchmarks/soak.md
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import statistics
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import sentencepiece as spm  # noqa: E402

from client import loadtest  # noqa: E402
from runtime.cpu import describe_cpu  # noqa: E402
from testkit.certificates import make_certificates  # noqa: E402
from testkit.servers import free_port, start_subprocess_server  # noqa: E402


def rss(metrics_port: int) -> float:
    body = urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5).read().decode()
    return next(
        float(line.split()[1]) for line in body.splitlines() if line.startswith("process_resident_memory_bytes ")
    )


class Soak:
    """The server's files in a scratch folder: its certificate (two sets, the clients trusting both CAs) and
    a copy of the model, so that both can be replaced under it."""

    def __init__(self, scratch: Path, model: Path) -> None:
        self.sets = [make_certificates(scratch / name) for name in ("first", "second")]
        self.live, self.bundle, self.model, self.source = scratch / "live", scratch / "ca.pem", scratch / "model", model
        self.live.mkdir()
        self.bundle.write_text("".join((d / "ca.pem").read_text() for d in self.sets))
        self.install(self.sets[0])
        shutil.copytree(model, self.model)

    def install(self, certificates: Path) -> None:
        for name in ("server.pem", "server.key"):
            shutil.copy(certificates / name, self.live / name)

    def rotate_certificate(self) -> str:
        self.install(self.sets[1])
        return "certificate rotated (new files, a second CA)"

    def swap_model_folder(self) -> str:
        self.model.rename(self.model.with_name("model.old"))
        shutil.copytree(self.source, self.model)
        return "model folder swapped (renamed away, a fresh copy in its place)"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, default=ROOT / "exported/default")
    parser.add_argument("--duration", type=float, default=600.0)
    parser.add_argument("--warmup", type=float, default=60.0)
    parser.add_argument("--window", type=float, default=30.0, help="seconds of one front end's traffic")
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--profile", default="mix:90:10-30:100-300")
    parser.add_argument("--out", type=Path, help="a Markdown report")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        soak = Soak(Path(scratch), args.model)
        http_port = free_port()
        tls = ["--tls-cert", str(soak.live / "server.pem"), "--tls-key", str(soak.live / "server.key")]
        process, port, metrics_port = start_subprocess_server(soak.model, *tls, "--http-port", str(http_port))
        try:
            lines = run(args, soak, {"grpc": port, "http": http_port}, metrics_port)
        finally:
            process.terminate()
            process.wait(30)
    report = "\n".join(lines) + "\n"
    print(report)
    if args.out:
        args.out.write_text(report)
    return 0 if "errors 0 " in lines[-1] else 1


def run(args, soak: Soak, ports: dict[str, int], metrics_port: int) -> list[str]:
    profile = loadtest.Profile(
        args.profile, spm.SentencePieceProcessor(model_file=str(soak.source / "sentencepiece.model"))
    )
    events = [(args.duration / 3, soak.rotate_certificate), (2 * args.duration / 3, soak.swap_model_folder)]
    samples: list[tuple[float, float]] = []
    lines = [
        "# Soak",
        "",
        f"`python {' '.join(sys.argv)}`, {time.strftime('%Y-%m-%d')}; machine: {describe_cpu()}; "
        f"{args.concurrency} closed-loop clients on the same cores, {args.window:.0f} s of gRPC then of HTTPS in turn.",
        "",
        "| t s | front end | requests | errors | resident MiB | event |",
        "|---|---|---|---|---|---|",
    ]
    errors_total, start, window = 0, time.monotonic(), 0
    while time.monotonic() - start < args.duration:
        event = ""
        if events and time.monotonic() - start >= events[0][0]:
            event = events.pop(0)[1]()
        api = ("grpc", "http")[window % 2]
        flags = ["--api", api, "--target", f"127.0.0.1:{ports[api]}", "--tls-ca", str(soak.bundle), "--metrics", ""]
        load = loadtest.parse_args([*flags, "--requests", str(10**9), "--duration", str(args.window)])
        results = asyncio.run(loadtest.drive(load, profile, args.concurrency, 0.0)).results
        samples.append((time.monotonic() - start, rss(metrics_port)))
        errors = sum(r.code != "OK" for r in results)
        errors_total += errors
        lines.append(
            f"| {samples[-1][0]:.0f} | {api} | {len(results)} | {errors} | {samples[-1][1] / 2**20:.1f} | {event} |"
        )
        print(lines[-1], flush=True)
        window += 1
    steady = [(t, m) for t, m in samples if t >= args.warmup]
    if len(steady) < 2:
        return [*lines, "", f"too short to measure growth; raise --duration; errors {errors_total} in all."]
    slope = statistics.linear_regression([t for t, _ in steady], [m for _, m in steady]).slope
    lines += [
        "",
        f"Resident memory after the {args.warmup:.0f} s warm-up: {slope * 3600 / 2**20:+.1f} MiB/hour "
        f"(from {steady[0][1] / 2**20:.1f} to {steady[-1][1] / 2**20:.1f} MiB); errors {errors_total} in all.",
    ]
    return lines


if __name__ == "__main__":
    sys.exit(main())
