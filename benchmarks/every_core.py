"""Every core busy: the server under closed-loop load in a matrix of cells, against the engine alone (not a test).

    python benchmarks/every_core.py --data ../shared/data/multi30k --side base=/tmp/base --out benchmarks/every_core.md

Cells: 1 or 16 test_2016_flickr sentences per request (16: documents of 16 lines), 4 or 32 gRPC clients, greedy
or beam 4. Each side (this checkout, and each ``--side LABEL=DIR[:FLAGS]``: another checkout, e.g. ``git
worktree add /tmp/base COMMIT``, with server flags of its own) serves both default models with the cache and the
runaway guard off (both change the work); the sides alternate within each repeat, and each repeat starts every
side's server afresh and runs every cell on it in turn. Per cell: requests/s, sentences/s, p99 latency and the
server's cores busy (its CPU seconds per second, from its metrics, so the clients' CPU is not counted: they
share the machine), the load generator's own (its CPU over the run) and the whole machine's (over the run's
middle: the server, the load generator and the kernel's network work together), medians of ``--repeats``; per
side its resident memory idle (after the warm-up) and after the cells (once idle IDLE_S). The load generator is
``translate-loadtest`` of this checkout for every side.

``--servers LABEL=N`` makes a side N server processes on ports of their own (the cell's clients split evenly, one
load generator each, their requests/s and CPU summed, p99 the larger of theirs, resident memory as the processes'
proportional share, so the libraries they map in common count once): the ceiling of a design without a shared
interpreter lock.

``--engine-alone`` adds the engine without a server: ``translate-file`` on the same sentences with as many in a
batch as the cell has in flight (clients × sentences per request), beam and variant as the cell's (the variant
this checkout's server loads with its ``--flags`` and environment), with its best of 1 worker on every core or
one worker per core (medians of the repeats): the ceiling the server is held to.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from itertools import product
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from runtime.cpu import describe_cpu  # noqa: E402
from server.config import parse_config  # noqa: E402

CELLS = list(product((1, 16), (4, 32), (1, 4)))  # sentences per request, clients, beam
IDLE_S = 2.5  # resident memory "after the cells" is read once the server has idled this long
MACHINE_SKIP_S = 3.0  # the machine's cores busy are read from this far into a run (the generator starts meanwhile)


@dataclass
class Side:
    label: str
    tree: Path
    flags: list[str]
    servers: int = 1
    cells: dict[tuple, list[dict]] = field(default_factory=dict)
    idle_mib: list[float] = field(default_factory=list)
    after_mib: list[float] = field(default_factory=list)


def parse_side(text: str) -> Side:
    label, _, rest = text.partition("=")
    tree, _, flags = rest.partition(":")
    return Side(label, Path(tree).resolve(), shlex.split(flags))


def rss_mib(pids: list[int]) -> float:
    """Resident memory: one process's RSS, several processes' PSS summed (shared pages split among them)."""
    if len(pids) == 1:
        return psutil.Process(pids[0]).memory_info().rss / 2**20
    return sum(psutil.Process(pid).memory_full_info().pss for pid in pids) / 2**20


def start(side: Side, port: int) -> subprocess.Popen:
    python = side.tree / ".venv" / "bin" / "python"
    flags = ["--host", "127.0.0.1", "--port", str(port), "--http-port", str(port + 2), "--metrics-port", str(port + 1)]
    flags += ["--cache-mib", "0", "--max-repeats", "0", "--access-log", "false", *side.flags]
    process = subprocess.Popen(
        [str(python), "-m", "server", *flags],
        cwd=side.tree,
        env={**os.environ, "PYTHONPATH": str(side.tree)},  # its own code, whatever the virtualenv installs
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port + 2}/health", timeout=1).read()
            time.sleep(1.0)  # settled
            return process
        except OSError:
            if process.poll() is not None:
                raise RuntimeError(f"{side.label}'s server exited with {process.returncode}") from None
            time.sleep(0.5)
    process.kill()
    raise RuntimeError(f"{side.label}'s server did not start")


def load(ports: list[int], profile: str, clients: int, beam: int, seconds: float, tokenizer: Path) -> dict:
    """One closed-loop run, the clients split evenly over the servers at ``ports`` (a load generator each); a
    server's cores busy over it from its process_cpu_seconds_total (its own CPU, scraped as the run starts and
    ends); the machine's over the run's middle (the generators' start-up and end left out)."""
    with tempfile.TemporaryDirectory() as out:
        generators = []
        for i, port in enumerate(ports):
            command = [sys.executable, "-m", "client.loadtest", "--target", f"127.0.0.1:{port}"]
            command += ["--metrics", f"http://127.0.0.1:{port + 1}/metrics", "--tokenizer", str(tokenizer)]
            command += ["--profile", profile, "--concurrency", str(clients // len(ports)), "--beam", str(beam)]
            command += ["--duration", str(seconds), "--requests", "1000000", "--out", f"{out}/{i}"]
            generators.append(subprocess.Popen(command, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE))
        time.sleep(MACHINE_SKIP_S)
        psutil.cpu_percent()  # from here: the machine's busy share (all but idle and I/O wait) until the next call
        time.sleep(max(1.0, seconds - MACHINE_SKIP_S))
        machine = psutil.cpu_percent() / 100 * psutil.cpu_count()
        for generator in generators:
            _, errors = generator.communicate()
            if generator.returncode:
                raise RuntimeError(f"the load generator failed: {errors.decode()[-2000:]}")
        runs = [json.loads((Path(out) / str(i) / "report.json").read_text())["runs"][0] for i in range(len(ports))]
    return {
        "rps": sum(run["requests_per_second"] for run in runs),
        "p99": max(run["latency"]["p99"] for run in runs),
        "busy": sum(run["server_cores_busy"]["all"] for run in runs),
        "client": sum(run["client_cores_busy"] for run in runs),
        "machine": machine,
        "errors": sum(run["requests"] - run["answered"] for run in runs),
    }


def engine_alone(source: Path, sentences: int, beam: int, variant: str, repeats: int) -> dict:
    """translate-file's sentences/s at a batch of ``sentences``, its best of two thread layouts."""
    cores = len(os.sched_getaffinity(0))
    best = {}
    for workers in sorted({1, cores}):
        rates = []
        for _ in range(repeats):
            command = [sys.executable, "-m", "runtime.translate_file", "--model", str(ROOT / "exported" / "default")]
            command += ["--variant", variant, "--beam", str(beam), "--batch-size", str(sentences)]
            command += ["--workers", str(workers)]
            command += ["--intra-op-threads", str(cores), "--max-repeats", "0", "--stats"]
            done = subprocess.run(command, cwd=ROOT, stdin=source.open("rb"), capture_output=True, check=True)
            stats = json.loads(done.stderr.decode().strip().splitlines()[-1])
            rates.append(stats["sentences"] / stats["seconds"])
        best[workers] = statistics.median(rates)
    workers = max(best, key=best.__getitem__)
    return {"sentences_per_second": best[workers], "workers": workers}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, required=True, help="the multi30k folder (test_2016_flickr.en.gz)")
    parser.add_argument("--side", action="append", default=[], help="LABEL=DIR[:FLAGS], another server to compare")
    parser.add_argument("--flags", default="", help="server flags of this checkout's side")
    parser.add_argument("--servers", action="append", default=[], help="LABEL=N: that side runs N server processes")
    parser.add_argument("--label", default="this", help="this checkout's side's label")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=12.0, help="each cell's run")
    parser.add_argument("--engine-alone", action="store_true")
    parser.add_argument("--cells", default="", help="only these cells, e.g. 16x32x4,1x4x1 (sentences x clients x beam)")
    parser.add_argument("--port", type=int, default=52051)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    sides = [Side(args.label, ROOT, shlex.split(args.flags)), *map(parse_side, args.side)]
    for text in args.servers:
        label, _, count = text.partition("=")
        next(side for side in sides if side.label == label).servers = int(count)
    if args.cells:
        CELLS[:] = [tuple(int(n) for n in cell.split("x")) for cell in args.cells.split(",")]
    source = args.data / "test_2016_flickr.en.gz"
    tokenizer = ROOT / "exported" / "default" / "sentencepiece.model"
    with tempfile.NamedTemporaryFile("w", suffix=".en", delete=False) as plain, gzip.open(source, "rt") as text:
        plain.write(text.read())
    profiles = {1: f"file:{source}", 16: f"corpus:{source}:0:doc:16-16:0"}
    for repeat in range(args.repeats):
        order = sides if repeat % 2 == 0 else sides[::-1]
        for side in order:
            ports = [args.port + 10 * i for i in range(side.servers)]
            processes = [start(side, port) for port in ports]
            pids = [process.pid for process in processes]
            try:
                side.idle_mib.append(rss_mib(pids))
                for sentences, clients, beam in CELLS:
                    result = load(ports, profiles[sentences], clients, beam, args.seconds, tokenizer)
                    result["sps"] = result["rps"] * sentences
                    side.cells.setdefault((sentences, clients, beam), []).append(result)
                    print(side.label, repeat, sentences, clients, beam, result, flush=True)
                time.sleep(IDLE_S)
                side.after_mib.append(rss_mib(pids))
            finally:
                for process in processes:
                    process.terminate()
                for process in processes:
                    process.wait(30)
    alone, variant = {}, parse_config(sides[0].flags, os.environ).engine.variant  # what this side's server loads
    if args.engine_alone:
        for sentences, clients, beam in CELLS:
            key = (sentences * clients, beam)
            if key not in alone:
                alone[key] = engine_alone(Path(plain.name), sentences * clients, beam, variant, args.repeats)
                print("engine alone", key, alone[key], flush=True)
    os.unlink(plain.name)
    args.out.write_text(report(sides, alone, variant, args))
    return 0


def servers(side: Side) -> str:
    return f" ({side.servers} server processes, the clients split evenly)" if side.servers > 1 else ""


def report(sides: list[Side], alone: dict, variant: str, args: argparse.Namespace) -> str:
    median = statistics.median
    lines = [
        "# Every core busy: the server against the engine alone",
        "",
        f"command: `python benchmarks/every_core.py {shlex.join(sys.argv[1:])}`",
        f"machine: {describe_cpu()}; the load generator shares it. Medians of {args.repeats}, "
        f"{args.seconds:.0f} s per cell, sides alternating; cache and runaway guard off.",
        "",
        "Sides: " + "; ".join(f"**{s.label}**: {s.tree} {shlex.join(s.flags)}".rstrip() + servers(s) for s in sides),
        "",
        "| sentences/request | clients | beam | side | requests/s | sentences/s | p99 s | cores busy | load generator "
        "cores busy | machine cores busy | errors |" + (" sentences/s / engine alone |" if alone else ""),
        "|---|---|---|---|---|---|---|---|---|---|---|" + ("---|" if alone else ""),
    ]
    for cell in CELLS:
        sentences, clients, beam = cell
        for side in sides:
            runs = side.cells[cell]
            sps = median(r["sps"] for r in runs)
            row = (
                f"| {sentences} | {clients} | {beam} | {side.label} | {median(r['rps'] for r in runs):.1f} | "
                f"{sps:.1f} | {median(r['p99'] for r in runs):.3f} | {median(r['busy'] for r in runs):.2f} | "
                f"{median(r.get('client', 0.0) for r in runs):.2f} | {median(r['machine'] for r in runs):.2f} | "
                f"{sum(r['errors'] for r in runs)} |"
            )
            if alone:
                engine = alone[(sentences * clients, beam)]
                row += f" {sps / engine['sentences_per_second']:.2f} |"
            lines.append(row)
    if len(sides) > 1:
        lines += ["", f"Ratios to **{sides[-1].label}** (requests/s; p99):", ""]
        lines += ["| sentences/request | clients | beam | " + " | ".join(s.label for s in sides[:-1]) + " |"]
        lines += ["|---|---|---|" + "---|" * (len(sides) - 1)]
        for cell in CELLS:
            base = sides[-1].cells[cell]
            ratios = []
            for side in sides[:-1]:
                runs = side.cells[cell]
                rps = median(r["rps"] for r in runs) / median(r["rps"] for r in base)
                p99 = median(r["p99"] for r in runs) / median(r["p99"] for r in base)
                ratios.append(f"{rps:.2f}; {p99:.2f}")
            lines.append(f"| {cell[0]} | {cell[1]} | {cell[2]} | " + " | ".join(ratios) + " |")
    lines += ["", "| side | resident MiB idle | after the cells |", "|---|---|---|"]
    for side in sides:
        lines.append(f"| {side.label} | {median(side.idle_mib):.0f} | {median(side.after_mib):.0f} |")
    if alone:
        lines += ["", f"Engine alone (translate-file, the default model, variant {variant}):", ""]
        lines += ["| sentences in a batch | beam | sentences/s | workers |", "|---|---|---|---|"]
        for (batch, beam), engine in sorted(alone.items()):
            lines.append(f"| {batch} | {beam} | {engine['sentences_per_second']:.1f} | {engine['workers']} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
