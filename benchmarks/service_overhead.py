"""What the service adds to the engine, in CPU: the server process's CPU seconds per sentence under 32
closed-loop gRPC clients (one test_2016_flickr sentence per request; read from /proc, so the clients' CPU
is not counted) against the CPU seconds per sentence of translating the same sentences offline with
`translate-file`'s path and defaults (batches of 32, its workers; model loading excluded). The two
alternate within each repeat (not a test):

    python benchmarks/service_overhead.py --data ../shared/data/multi30k --out benchmarks/service_overhead.md

More rows split the gap between them (``--no-split`` leaves them out): the same clients on the serving
core in this process (``Translations``, the scheduler, its lanes and the engine, as the server builds them,
but no gRPC, so no access log either: this process's CPU while they run), and the gRPC floor: a server of the same
proto without a model (benchmarks/grpc_floor.py) that answers each request after the time the real server's
requests took (clients / its requests per second), so that it serves at the same rate, at the same
concurrency. What the server costs over the core and the floor together is ours to cut; the core against
offline is the price of continuous batching (batches of the rows in flight, encoder calls as they arrive). A
third row takes part of that price apart: translate-file's path on the same batches of 32 in the order the
texts arrive instead of sorted by length (the server cannot sort the rows in flight). ``--floor-sync-threads N``
adds the floor served by grpcio's synchronous server on N threads, against the asyncio one the server uses.

``--base DIR`` (another checkout, e.g. ``git worktree add /tmp/base COMMIT``) also serves the same export
from that checkout's code, in the same alternation, and reports this checkout's server against it: CPU per
sentence, requests per second and p99 latency (a change's regression check).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import sentencepiece as spm

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from client import loadtest, loadtest_report  # noqa: E402
from common.corpus import MULTI30K, read_lines  # noqa: E402
from runtime.backend import OrtBackend  # noqa: E402
from runtime.cpu import describe_cpu  # noqa: E402
from runtime.offline import translate_ids, translate_in_batches  # noqa: E402
from runtime.options import EngineSettings  # noqa: E402
from runtime.translate_file import parallelism, runtime_options  # noqa: E402
from server.app import serving_engines  # noqa: E402
from server.config import DEFAULT_MODEL_DIR, parse_config  # noqa: E402
from server.operations.metrics import Metrics  # noqa: E402
from server.options import TranslateOptions  # noqa: E402
from server.scheduling.jobs import decode_options  # noqa: E402
from server.scheduling.scheduler import Scheduler  # noqa: E402
from server.translations import Translations  # noqa: E402
from testkit.servers import start_subprocess_server  # noqa: E402


def cpu_seconds(pid: int, thread: int | None = None) -> float:
    """User + system CPU of a process and all its threads (/proc/PID/stat, clock ticks), or of one of its
    threads (/proc/PID/task/TID/stat)."""
    path = f"/proc/{pid}/stat" if thread is None else f"/proc/{pid}/task/{thread}/stat"
    fields = Path(path).read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def threads_cpu(pid: int) -> collections.Counter:
    """CPU seconds of the process's threads by OS name (lanes name theirs, and the ONNX Runtime threads they
    start inherit it; gRPC's core names its own); the main thread as "main" (the event loop)."""
    by_name: collections.Counter = collections.Counter()
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            name = "main" if int(task.name) == pid else (task / "comm").read_text().strip()
            by_name[name] += cpu_seconds(pid, int(task.name))
        except (FileNotFoundError, ProcessLookupError):  # a thread that ended meanwhile
            continue
    return by_name


def served(port: int, pid: int, source: Path, tokenizer, sentences: int, clients: int, seed: int) -> dict:
    """The server's CPU seconds per sentence, requests per second and p99 latency under the closed loop."""
    args = loadtest.bounded(port, sentences)
    before, threads_before = cpu_seconds(pid), threads_cpu(pid)
    run = asyncio.run(loadtest.drive(args, loadtest.Profile(f"file:{source}", tokenizer, seed), clients, 0.0))
    ok = [r for r in run.results if r.code == "OK"]
    assert len(ok) == sentences, f"{sentences - len(ok)} requests failed"
    threads = threads_cpu(pid) - threads_before
    return {
        "cpu": (cpu_seconds(pid) - before) / len(ok),
        "main": threads["main"] / len(ok),  # the event loop's thread
        **{f"thread {name}": seconds / len(ok) for name, seconds in threads.items() if name != "main"},
        "rps": len(ok) / run.seconds,
        "p99": loadtest_report.percentile([r.latency for r in ok], 0.99),
    }


class Core:
    """The serving core in this process, built as server.app builds it (same flags), without gRPC."""

    def __init__(self, flags: list[str]) -> None:
        self.config = parse_config([*flags, "--provider", "cpu", "--cache-mib", "0"], {})
        (self.engine,) = serving_engines(self.config)
        self.scheduler = Scheduler([self.engine], self.config, Metrics())
        self.translations = Translations(self.scheduler, self.config, self.scheduler.metrics)
        self.scheduler.start()

    def cpu(self, texts: list[str], clients: int) -> float:
        """This process's CPU seconds per sentence while ``clients`` tasks each translate one text at a time
        (the texts in order, as the load generator's file profile sends them)."""
        config, pending = self.config, iter(texts)

        async def client() -> None:
            for text in pending:
                translated = await self.translations.translate(
                    self.engine, [text], TranslateOptions(decode_options(config))
                )
                assert len(translated) == 1, f"{len(translated)} translations for one text"

        async def drive() -> None:
            await asyncio.gather(*(client() for _ in range(clients)))

        started = time.process_time()
        asyncio.run(drive())
        return (time.process_time() - started) / len(texts)

    def stop(self) -> None:
        self.scheduler.stop(30)


def floor(delay_s: float, source: Path, tokenizer, sentences: int, clients: int, sync_threads: int = 0) -> dict:
    """benchmarks/grpc_floor.py under the same load, answering after ``delay_s`` (on grpcio's synchronous server
    with ``sync_threads``)."""
    script = Path(__file__).with_name("grpc_floor.py")
    sync = ["--sync-threads", str(sync_threads)] if sync_threads else []
    process = subprocess.Popen(
        [sys.executable, str(script), "--delay-s", str(delay_s), *sync], stderr=subprocess.PIPE, text=True
    )
    try:
        port = int(process.stderr.readline().split()[-1])
        return served(port, process.pid, source, tokenizer, sentences, clients, 0)
    finally:
        process.terminate()
        process.wait(30)


class OrtClock:
    """Thread CPU seconds spent inside ONNX Runtime's runs in this process while it is entered, on the
    threads that call them (every session's ``run`` and ``run_with_iobinding``): all of a run's CPU when its
    session has one intra-op thread, as translate-file's and the server's first lane's have on 2 cores."""

    NAMES = ("run", "run_with_iobinding")

    def __init__(self) -> None:
        self.seconds = 0.0
        self.lock = threading.Lock()
        self.originals: dict[str, Any] = {}

    def __enter__(self) -> OrtClock:
        from onnxruntime.capi import onnxruntime_inference_collection as collection

        for name in self.NAMES:
            original = self.originals[name] = getattr(collection.Session, name)

            def timed(session, *args, original=original, **kwargs):
                started = time.thread_time()
                try:
                    return original(session, *args, **kwargs)
                finally:
                    with self.lock:
                        self.seconds += time.thread_time() - started

            setattr(collection.Session, name, timed)
        return self

    def __exit__(self, *exc) -> None:
        from onnxruntime.capi import onnxruntime_inference_collection as collection

        for name, original in self.originals.items():
            setattr(collection.Session, name, original)


def offline(model: OrtBackend, texts: list[str], batch: int, workers: int, by_length: bool = True) -> float:
    """CPU seconds per sentence of translate-file's translation (its defaults: batches of 32, ``workers``);
    ``by_length=False``: the same batches in the order the texts come (arrival order, as the server sees them),
    not sorted by length."""
    translate_batch = lambda ids: translate_ids(model, ids, 1, 256, ())  # noqa: E731 (--max-repeats 0, as served)
    started = time.process_time()
    translate_in_batches(model.tokenizer, texts, translate_batch, batch, workers, by_length)
    return (time.process_time() - started) / len(texts)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, default=DEFAULT_MODEL_DIR)
    parser.add_argument("--variant", default="fp32")
    parser.add_argument("--data", type=Path, default=MULTI30K)
    parser.add_argument("--sentences", type=int, default=1000)
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path)
    parser.add_argument(
        "--no-split",
        dest="split",
        action="store_false",
        help="leave out the arrival-order, serving core and gRPC floor rows",
    )
    parser.add_argument("--base", type=Path, help="another checkout whose server is measured alongside")
    parser.add_argument(
        "--floor-sync-threads",
        type=int,
        default=0,
        help="also measure the gRPC floor on grpcio's synchronous server with a pool of this many threads",
    )
    parser.add_argument(
        "--server-flag",
        action="append",
        default=[],
        help="a flag for this checkout's server only (repeat; e.g. --server-flag=--intra-op-threads=1 with "
        "--base . to measure a setting against the defaults)",
    )
    args = parser.parse_args(argv)
    source = args.data / "test_2016_flickr.en.gz"
    tokenizer = spm.SentencePieceProcessor(model_file=str(args.model / "sentencepiece.model"))
    # The sentences the load generator sends, in order (its file profile cycles through the file).
    texts = read_lines(source)[: args.sentences]
    workers, threads = parallelism(0, 0, "cpu", len(os.sched_getaffinity(0)))
    model = OrtBackend(
        args.model.resolve(),
        runtime_options(EngineSettings(variant=args.variant, provider="cpu", intra_op_threads=threads)),
    )  # translate-file's default
    flags = ("--variant", args.variant, "--max-repeats", "0")
    servers = {"server": start_subprocess_server(args.model.resolve(), *flags, *args.server_flag)[:2]}
    if args.base:
        servers["base"] = start_subprocess_server(args.model.resolve(), *flags, cwd=args.base)[:2]
    core = Core(["--model", str(args.model.resolve()), *flags, *args.server_flag]) if args.split else None
    kinds = [*servers, "offline", *(["arrival order", "core", "floor"] if args.split else [])]
    if args.split and args.floor_sync_threads:
        kinds.append("sync floor")
    results: dict[str, list] = {kind: [] for kind in kinds}
    with OrtClock() as ort_clock:
        try:
            for repeat in range(args.repeats):
                kinds = list(results)
                for kind in kinds if repeat % 2 == 0 else kinds[::-1]:
                    in_ort = ort_clock.seconds
                    if kind == "offline":
                        results[kind].append({"cpu": offline(model, texts, 32, workers)})
                    elif kind == "arrival order":
                        results[kind].append({"cpu": offline(model, texts, 32, workers, by_length=False)})
                    elif kind == "core":
                        results[kind].append({"cpu": core.cpu(texts, args.clients)})
                    elif kind in ("floor", "sync floor"):  # as long as the server's requests took in its latest
                        rps = results["server"][-1]["rps"]  # run (the first repeat runs the server first)
                        sync = args.floor_sync_threads if kind == "sync floor" else 0
                        results[kind].append(
                            floor(args.clients / rps, source, tokenizer, args.sentences, args.clients, sync)
                        )
                    else:
                        process, port = servers[kind]
                        results[kind].append(
                            served(port, process.pid, source, tokenizer, args.sentences, args.clients, 0)
                        )
                    if kind in ("offline", "arrival order", "core"):  # in this process: its runs are counted
                        results[kind][-1]["ort"] = (ort_clock.seconds - in_ort) / len(texts)
                    print(f"{kind}: {results[kind][-1]}", file=sys.stderr)
        finally:
            if core is not None:
                core.stop()
            for process, _ in servers.values():
                process.terminate()
                process.wait(30)
    median = {k: {m: statistics.median(r.get(m, 0.0) for r in runs) for m in runs[0]} for k, runs in results.items()}
    server, engine, main = median["server"]["cpu"], median["offline"]["cpu"], median["server"]["main"]
    lines = [
        f"command: python {' '.join(sys.argv)}",
        f"machine: {describe_cpu()}; {args.variant}; medians of {args.repeats}, alternating",
        "",
        "| path | CPU ms per sentence |",
        "|---|---|",
        f"| server, {args.clients} closed-loop gRPC clients, 1 sentence per request | {server * 1e3:.2f} |",
        f"| of which the main thread (asyncio: gRPC, tokenizing, detokenizing) | {main * 1e3:.2f} |",
        f"| of which the other threads (inference, ONNX Runtime, gRPC's core) | {(server - main) * 1e3:.2f} |",
        *(
            f"| threads named {name.removeprefix('thread ')!r} | {seconds * 1e3:.2f} |"
            for name, seconds in sorted(median["server"].items(), key=lambda item: -item[1])
            if name.startswith("thread ") and seconds * 1e3 >= 0.01
        ),
        f"| translate-file, batches of 32, {workers} workers of {threads} thread(s) (its defaults) | "
        f"{engine * 1e3:.2f} |",
        f"| of which inside ONNX Runtime's runs | {median['offline']['ort'] * 1e3:.2f} |",
        f"| server / offline | {server / engine:.2f} |",
    ]
    if args.split:
        in_core, grpc_floor, arrival = median["core"]["cpu"], median["floor"]["cpu"], median["arrival order"]["cpu"]
        lines += [
            f"| translate-file's path on the same batches in arrival order (not sorted by length) | "
            f"{arrival * 1e3:.2f} |",
            f"| serving core in one process, the same {args.clients} clients, no gRPC | {in_core * 1e3:.2f} |",
            f"| of which inside ONNX Runtime's runs (on the threads that call them) | "
            f"{median['core']['ort'] * 1e3:.2f} |",
            f"| gRPC floor: a model-less server of the same proto, answering after the server's latency "
            f"({median['floor']['rps']:.0f} requests/s) | {grpc_floor * 1e3:.2f} |",
            f"| core / offline | {in_core / engine:.2f} |",
            f"| of which arrival order (arrival order / offline) | {arrival / engine:.2f} |",
            f"| and the rest of the core (core / arrival order) | {in_core / arrival:.2f} |",
            f"| (core + gRPC floor) / offline | {(in_core + grpc_floor) / engine:.2f} |",
            f"| (the core's ONNX Runtime runs + gRPC floor) / offline | "
            f"{(median['core']['ort'] + grpc_floor) / engine:.2f} |",
        ]
    if "sync floor" in median:
        sync = median["sync floor"]
        lines.append(
            f"| the gRPC floor on grpcio's synchronous server, {args.floor_sync_threads} threads "
            f"({sync['rps']:.0f} requests/s) | {sync['cpu'] * 1e3:.2f} |"
        )
    if args.base:
        base = median["base"]
        lines += [
            "",
            f"Against the server of {args.base} (same export, same load, alternating):",
            "",
            "| | this checkout | base | this / base |",
            "|---|---|---|---|",
            f"| server CPU ms per sentence | {server * 1e3:.2f} | {base['cpu'] * 1e3:.2f} | "
            f"{server / base['cpu']:.2f} |",
            f"| requests/s | {median['server']['rps']:.1f} | {base['rps']:.1f} | "
            f"{median['server']['rps'] / base['rps']:.2f} |",
            f"| p99 latency s | {median['server']['p99']:.3f} | {base['p99']:.3f} | "
            f"{median['server']['p99'] / base['p99']:.2f} |",
            f"| of the CPU, the main thread's ms | {main * 1e3:.2f} | {base['main'] * 1e3:.2f} | "
            f"{main / base['main']:.2f} |",
            *(
                f"| of the CPU, threads named {name.removeprefix('thread ')!r} | {seconds * 1e3:.2f} | "
                f"{base[name] * 1e3:.2f} | {seconds / base[name]:.2f} |"
                for name, seconds in sorted(median["server"].items(), key=lambda item: -item[1])
                if name.startswith("thread ") and base.get(name, 0.0) * 1e3 >= 0.01
            ),
        ]
    report = "\n".join(lines) + "\n"
    print(report)
    if args.out:
        args.out.write_text(report)


if __name__ == "__main__":
    main()
