"""Server variants side by side on one traffic mix of the scheduler matrix (not a test).

    python benchmarks/scheduler_variants.py --data ../shared/data/multi30k \\
        --variant static=--scheduler,static --variant continuous=--scheduler,continuous \\
        --variant before=@../before:--scheduler,continuous --long doc:10-40 --short 80 --loads 0.7,0.9

A variant is NAME=[@CHECKOUT:]FLAGS: the server of this checkout (or of CHECKOUT, e.g. a `git worktree` of an
older commit) with the comma-separated FLAGS. For each repeat, in alternating order, each variant's capacity
(closed loop of benchmarks/scheduler_matrix.py's 32 clients) is measured, then each load: an open-loop run at
that share of the *first* variant's capacity (measured in the same repeat). Medians of --repeats. The mix is
one cell of the matrix (--short, --long, --cache, --models, --beam); each run starts from an empty cache when
the cache is on. Each load run also reads the server process's CPU seconds (all its threads, /proc): every
variant is sent the same requests, so they compare the work each spends on them. Writes the table to --out
(Markdown), with the CPU's model and flags.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import sentencepiece as spm

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.scheduler_matrix import CACHE_MIB, MODELS, PAIRS, Cell, run_load, search_name  # noqa: E402
from benchmarks.service_overhead import cpu_seconds  # noqa: E402
from common.corpus import MULTI30K  # noqa: E402
from runtime.cpu import describe_cpu  # noqa: E402
from testkit.servers import start_subprocess_server  # noqa: E402

METRICS = ("requests_per_s", "window_per_s", "short_p50", "short_p99", "long_p99", "errors", "cpu_s")


@dataclass(frozen=True)
class Variant:
    name: str
    checkout: Path | None  # None: this one
    flags: tuple[str, ...]

    @classmethod
    def parse(cls, text: str) -> Variant:
        """NAME=[@CHECKOUT:]FLAGS, FLAGS comma-separated (a trailing comma: an empty value, e.g. --lanes,)."""
        name, sep, rest = text.partition("=")
        if not sep or not name:
            raise argparse.ArgumentTypeError(f"{text!r}: a variant is NAME=[@CHECKOUT:]FLAGS")
        checkout = None
        if rest.startswith("@"):
            where, _, rest = rest[1:].partition(":")
            checkout = Path(where).resolve()
        return cls(name, checkout, tuple(rest.split(",")) if rest else ())


class Server:
    """One variant's server, started afresh on demand (an empty translation cache)."""

    def __init__(self, variant: Variant, cell: Cell) -> None:
        self.variant, self.cell = variant, cell
        self.process = None
        self.port = 0

    def start(self) -> int:
        self.stop()
        first, *others = MODELS[: self.cell.models]
        models = [flag for model in others for flag in ("--model", str(model))]
        cache = ["--cache-mib", "0" if self.cell.cache == "off" else str(CACHE_MIB)]
        cwd = self.variant.checkout
        self.process, self.port, _ = start_subprocess_server(first, *models, *cache, *self.variant.flags, cwd=cwd)
        return self.port

    def ready(self) -> int:
        """The port of a running server: started once when the cache is off, afresh each time it is on."""
        return self.start() if self.process is None or self.cell.cache != "off" else self.port

    def stop(self) -> None:
        if self.process is not None:
            self.process.terminate()
            self.process.wait(30)
            self.process = None


def measure(variants: list[Variant], cell: Cell, loads: list[float], args) -> dict[str, dict]:
    """Per variant: "capacity" (req/s) and, per load, the median of each METRICS over the repeats."""
    tokenizers = {
        languages: spm.SentencePieceProcessor(model_file=str(model / "sentencepiece.model"))
        for languages, model in zip(PAIRS, MODELS, strict=True)
    }
    servers = {v.name: Server(v, cell) for v in variants}
    runs: dict[str, dict] = {v.name: {"capacity": [], **{load: [] for load in loads}} for v in variants}
    try:
        for repeat in range(args.repeats):
            order = variants if repeat % 2 == 0 else variants[::-1]
            capacity = {}
            for v in order:
                result = run_load(servers[v.name].ready(), cell, args.corpus, tokenizers, 0, args.capacity_seconds, 0)
                capacity[v.name] = result["requests_per_s"]
                runs[v.name]["capacity"].append(capacity[v.name])
            for load in loads:
                rate = load * capacity[variants[0].name]
                for v in order:
                    port = servers[v.name].ready()
                    cpu = cpu_seconds(servers[v.name].process.pid)
                    result = run_load(port, cell, args.corpus, tokenizers, rate, args.seconds, repeat + 1)
                    cpu = cpu_seconds(servers[v.name].process.pid) - cpu
                    runs[v.name][load].append(result | {"rate": rate, "cpu_s": cpu})
            print(f"repeat {repeat + 1}: capacity {capacity}", file=sys.stderr, flush=True)
    finally:
        for server in servers.values():
            server.stop()
    return {
        name: {
            "capacity": statistics.median(by["capacity"]),
            "capacities": by["capacity"],
            **{load: {k: statistics.median(r[k] for r in by[load]) for k in (*METRICS, "rate")} for load in loads},
        }
        for name, by in runs.items()
    }


def report(measured: dict[str, dict], variants: list[Variant], cell: Cell, loads: list[float], args) -> list[str]:
    first = variants[0].name
    lines = [
        f"command: `python benchmarks/scheduler_variants.py {' '.join(sys.argv[1:])}`",
        f"machine: {describe_cpu()}",
        f"mix: {cell.models} model(s), cache {cell.cache}, {search_name(cell.beam)}, {cell.short}% single "
        f"sentences, the rest {cell.long}; capacity: closed loop for {args.capacity_seconds:.0f} s; loads: open "
        f"loop for {args.seconds:.0f} s at a share of {first}'s capacity; medians of {args.repeats}, variants "
        "alternating",
        "",
        "| variant | server | capacity req/s (each repeat) | / " + first + " |",
        "|---|---|---|---|",
    ]
    for v in variants:
        m = measured[v.name]
        where = f"{v.checkout.name}: " if v.checkout else ""
        each = ", ".join(f"{c:.1f}" for c in m["capacities"])
        lines.append(
            f"| {v.name} | {where}`{' '.join(v.flags)}` | {m['capacity']:.1f} ({each}) "
            f"| {m['capacity'] / measured[first]['capacity']:.2f} |"
        )
    lines += [
        "",
        "throughput: all answered / time to the last answer; in window: answered while requests were still being "
        "sent / the run's seconds (not charged for the long requests left at the end of a short run); server "
        "CPU: the server process's CPU seconds over the run (the same requests for every variant)",
        "",
        "| load | offered req/s | variant | throughput req/s | in window req/s | short p50 s | short p99 s "
        f"| long p99 s | errors | server CPU s | short p99 / {first} | throughput / {first} | in window / {first} "
        f"| server CPU / {first} |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for load in loads:
        base = measured[first][load]
        for v in variants:
            r = measured[v.name][load]
            lines.append(
                f"| {load:.0%} | {r['rate']:.1f} | {v.name} | {r['requests_per_s']:.2f} | {r['window_per_s']:.2f} "
                f"| {r['short_p50']:.3f} | {r['short_p99']:.3f} | {r['long_p99']:.3f} | {r['errors']:.0f} "
                f"| {r['cpu_s']:.1f} | {r['short_p99'] / base['short_p99']:.2f} "
                f"| {r['requests_per_s'] / base['requests_per_s']:.2f} "
                f"| {r['window_per_s'] / base['window_per_s']:.2f} "
                f"| {r['cpu_s'] / base['cpu_s']:.2f} |"
            )
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, default=MULTI30K)
    parser.add_argument("--split", default="train")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "scheduler_variants.md")
    parser.add_argument("--variant", type=Variant.parse, action="append", required=True)
    parser.add_argument("--short", type=int, default=80)
    parser.add_argument("--long", default="doc:10-40")
    parser.add_argument("--cache", default="off")
    parser.add_argument("--models", type=int, default=1)
    parser.add_argument("--beam", type=int, default=1)
    parser.add_argument("--loads", type=lambda t: [float(x) for x in t.split(",") if x], default=[0.7, 0.9])
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--capacity-seconds", type=float, default=12.0)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    args.corpus = args.data / args.split
    if not all(Path(f"{args.corpus}.{lang}.gz").exists() for lang in ("en", "de")):
        parser.error(f"no corpus at {args.data} ({args.split}.en.gz and {args.split}.de.gz)")
    cell = Cell(args.models, args.cache, args.beam, args.long, args.short, 0.0)
    started = time.monotonic()
    measured = measure(args.variant, cell, args.loads, args)
    lines = report(measured, args.variant, cell, args.loads, args)
    lines[2] += f"; {time.monotonic() - started:.0f} s in all"
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
