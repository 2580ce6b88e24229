"""The front door alone (not a test): the server's CPU per request around a null engine, by stage.

The server runs as it ships (``python -m server``'s code, the real scheduler, lanes, translations, both front
doors, metrics and access log) over a null engine (``NullEngine``): each model's tokenizer is real, but a sentence
is "translated" at its first step into its own ids, so no ONNX Runtime runs and what is measured is everything
around the engine. Closed-loop clients in this process send one request shape at a time, each for ``--seconds``,
alternating over ``--repeats``:

- ``grpc``: gRPC Translate of one test_2016_flickr sentence; ``grpc16``: of 16 sentences;
- ``json`` and ``form``: HTTP ``/translate`` of one sentence, as JSON and as a form.

The server process's CPU (``/proc``) over its requests is the CPU per request; ``--profile`` also samples the
server with py-spy and splits that CPU by stage (``STAGES``: the innermost frame of ours, or of a library, that a
sample is in):

    python benchmarks/front_door.py --data ../shared/data/multi30k --profile --out benchmarks/front_door.md
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from common.corpus import MULTI30K, corpus_path, read_lines  # noqa: E402
from runtime.batch import Joined  # noqa: E402
from runtime.cpu import describe_cpu  # noqa: E402
from runtime.engine import ModelText  # noqa: E402
from runtime.manifest import read_manifest  # noqa: E402
from runtime.memory import MemoryModel  # noqa: E402
from runtime.model_config import ModelConfig  # noqa: E402
from runtime.search import Hypothesis, default_max_output  # noqa: E402
from runtime.tokenizer import Tokenizer  # noqa: E402

SHAPES = ("grpc", "json", "form", "grpc16")
OUTSIDE = "outside the interpreter lock (gRPC's core, the kernel, C code that releases it)"
CLIENT_TIMEOUT_S = 30.0
# Where a sample's time goes: the innermost frame whose file matches a stage's pattern names the stage (first match
# in this order, so a stage of ours wins over the library that called it)
STAGES = [
    ("segmentation", r"server/documents/text\.py|server/documents/casing\.py|sentencex"),
    ("tokenize / detokenize", r"runtime/tokenizer\.py|sentencepiece"),
    ("cache", r"server/cache\.py"),
    ("answer building", r"server/answers\.py|server/documents/formatting\.py"),
    ("metrics", r"server/operations/metrics\.py|prometheus_client"),
    ("access log", r"server/operations/access\.py|logging/"),
    ("trace", r"server/operations/tracing\.py|opentelemetry"),
    ("job and hand-off", r"server/scheduling/|front_door\.py"),
    (
        "door and translations",
        r"server/doors/door\.py|server/translations\.py|server/sentences\.py|server/models\.py|server/options\.py",
    ),
    ("gRPC handler", r"server/doors/service\.py|proto/"),
    ("HTTP handler and parsing", r"server/doors/http[a-z_]*\.py"),
    ("gRPC library", r"grpc/"),
    ("aiohttp library", r"aiohttp/|multidict|yarl"),
    ("threads and wake-ups", r"threading\.py|concurrent/futures|queue\.py"),
    ("event loop", r"asyncio/|uvloop"),
]


# --- the null engine -------------------------------------------------------------------------------------


@dataclass
class NullEncoded:
    sources: list[list[int]]
    seconds: float = 0.0


@dataclass
class NullBatch:
    """Every source is done at its first step, "translated" into its own ids."""

    sources: dict[Hashable, list[int]] = field(default_factory=dict)
    cache_bytes: int = 0
    cross_bytes: int = 0

    @property
    def rows(self) -> int:
        return len(self.sources)

    def __len__(self) -> int:
        return len(self.sources)

    def add(self, keys, encoded: NullEncoded, beams, max_lengths) -> Joined:
        for key, ids in zip(keys, encoded.sources, strict=True):
            self.sources[key] = ids
        return Joined(0.0, sum(map(len, encoded.sources)), sum(map(len, encoded.sources)))

    def step(self) -> list[tuple[Hashable, Hypothesis]]:
        done = [(key, Hypothesis(list(ids), -0.1, "eos")) for key, ids in self.sources.items()]
        self.sources.clear()
        return done

    def remove(self, key: Hashable) -> None:
        self.sources.pop(key, None)


class NullEngine(ModelText):
    """A model folder's tokenizer and names, no sessions (``server.interface.Engine``)."""

    provider, variant = "cpu", "null"

    def __init__(self, folder: Path) -> None:
        manifest = read_manifest(folder, verify=False)
        self.tokenizer = Tokenizer.load(folder, manifest["tokenizer"])
        self.name, self.version = manifest["name"], "null"
        self.source_language, self.target_language = manifest["source_language"], manifest["target_language"]
        config = ModelConfig.from_dict(manifest["model_config"])
        self.memory = MemoryModel(config, 4, -(-config.d_model // config.n_heads // 8) * 8)

    def warmup(self) -> None:
        pass

    def align(self, pairs, kept=()):  # noqa: ANN001, ANN201 (no markup or glossary is sent here)
        raise NotImplementedError("the null engine aligns nothing")

    @staticmethod
    def max_length(source_tokens: int, cap: int) -> int:
        return default_max_output(source_tokens, cap)

    def encode(self, sources: Sequence[Sequence[int]]) -> NullEncoded:
        return NullEncoded([list(source) for source in sources])

    def new_batch(self) -> NullBatch:
        return NullBatch()


def serve(argv: list[str]) -> int:
    """``python -m server`` with every model on a null engine."""
    from server import __main__ as server_main
    from server import app

    app.serving_engines = lambda config: [NullEngine(folder) for folder in config.model]
    return server_main.main(argv)


# --- the clients -----------------------------------------------------------------------------------------


async def drive(shape: str, ports: tuple[int, int], texts: list[str], clients: int, seconds: float) -> int:
    """Closed-loop clients sending ``shape`` requests for ``seconds``; the requests answered."""
    import aiohttp
    import grpc

    from proto import translate_pb2, translate_pb2_grpc

    grpc_port, http_port = ports
    answered = 0
    stop = time.monotonic() + seconds
    per_request = 16 if shape == "grpc16" else 1
    async with grpc.aio.insecure_channel(f"127.0.0.1:{grpc_port}") as channel, aiohttp.ClientSession() as session:
        stub = translate_pb2_grpc.TranslatorStub(channel)
        url = f"http://127.0.0.1:{http_port}/translate"

        async def client(number: int) -> None:
            nonlocal answered
            i = number * 7919
            while time.monotonic() < stop:
                chosen = [texts[(i + j) % len(texts)] for j in range(per_request)]
                i += per_request
                if shape in ("grpc", "grpc16"):
                    request = translate_pb2.TranslateRequest(texts=chosen)
                    await stub.Translate(request, timeout=CLIENT_TIMEOUT_S)
                else:
                    fields = {"q": chosen[0], "source": "en", "target": "de"}
                    body = {"json": fields} if shape == "json" else {"data": fields}
                    async with session.post(url, timeout=aiohttp.ClientTimeout(CLIENT_TIMEOUT_S), **body) as r:
                        assert r.status == 200, await r.text()
                        await r.read()
                answered += 1

        await asyncio.gather(*(client(n) for n in range(clients)))
    return answered


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def switches(pid: int) -> int:
    """Context switches of all the process's threads so far: each a thread that waited and was woken (voluntary)
    or was preempted."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            status = (task / "status").read_text()
        except OSError:  # the thread ended meanwhile
            continue
        total += sum(int(n) for n in re.findall(r"ctxt_switches:\s+(\d+)", status))
    return total


def start(model: list[Path], extra: list[str]) -> tuple[subprocess.Popen, tuple[int, int]]:
    models = [flag for folder in model for flag in ("--model", str(folder))]
    from testkit.servers import free_port

    command = [sys.executable, __file__, "serve", *models, "--host", "127.0.0.1", "--port", "0", "--http-port"]
    command += [
        str(free_port()),
        "--metrics-port",
        "0",
        "--cache-mib",
        "0",
        "--warmup",
        "false",
        "--grace-seconds",
        "0",
        *extra,
    ]
    process = subprocess.Popen(command, stderr=subprocess.PIPE, text=True, cwd=ROOT)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        line = process.stderr.readline()
        found = re.search(r"gRPC on \S+:(\d+), HTTP API on \S+:(\d+)", line)
        if found:
            import threading

            threading.Thread(target=process.stderr.read, daemon=True).start()
            return process, (int(found[1]), int(found[2]))
        if process.poll() is not None:
            break
    process.kill()
    raise RuntimeError("the null-engine server did not start")


def profiled(pid: int, seconds: float, rate: int) -> subprocess.Popen | None:
    """py-spy sampling the server for ``seconds`` (raw stacks to a file), where py-spy is installed: only the
    thread that holds the interpreter lock (``--gil``), so a sample is Python at work, not a thread waiting."""
    spy = Path(sys.executable).with_name("py-spy")
    if not spy.exists():
        return None
    descriptor, out = tempfile.mkstemp(suffix=".txt")
    os.close(descriptor)
    command = [str(spy), "record", "--pid", str(pid), "--duration", str(int(seconds)), "--rate", str(rate)]
    command += ["--format", "raw", "--output", out, "--nonblocking", "--gil"]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    process.out = out  # type: ignore[attr-defined]
    return process


def stage_samples(raw: Path) -> dict[str, int]:
    """Samples in each stage (STAGES), from py-spy's raw output: ``thread;frame;frame;... count``."""
    patterns = [(name, re.compile(pattern)) for name, pattern in STAGES]
    counts: collections.Counter[str] = collections.Counter()
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not count.isdigit():
            continue
        frames = stack.split(";")[1:]  # the first is the thread's name
        stage = next(
            (name for frame in reversed(frames) for name, pattern in patterns if pattern.search(frame)), "other"
        )
        counts[stage] += int(count)
    return dict(counts)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["serve"]:
        return serve(argv[1:])
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, action="append", help="a model folder (default: the server's two)")
    parser.add_argument("--data", type=Path, default=MULTI30K)
    parser.add_argument("--shapes", default=",".join(SHAPES))
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--profile", action="store_true", help="split the CPU by stage (py-spy)")
    parser.add_argument("--rate", type=int, default=250, help="py-spy's samples per second")
    parser.add_argument("--out", type=Path, help="the report (Markdown); --json beside it")
    parser.add_argument("--server-args", default="", help="more flags for the server, e.g. '--batch-gap-ms 0'")
    args = parser.parse_args(argv)
    from server.config import DEFAULT_MODELS

    models = args.model or list(DEFAULT_MODELS)  # the server's own: both default models
    texts = read_lines(corpus_path(args.data, "test_2016_flickr", "en"))
    shapes = args.shapes.split(",")
    process, ports = start(models, args.server_args.split())
    results: dict[str, list[dict]] = {shape: [] for shape in shapes}
    try:
        asyncio.run(drive("grpc", ports, texts, 2, 1.0))  # warm: connections, first requests
        for repeat in range(args.repeats):
            for shape in shapes if repeat % 2 == 0 else shapes[::-1]:
                spy = profiled(process.pid, args.seconds, args.rate) if args.profile else None
                machine, before, switched = time.process_time(), cpu_seconds(process.pid), switches(process.pid)
                started = time.monotonic()
                answered = asyncio.run(drive(shape, ports, texts, args.clients, args.seconds))
                wall = time.monotonic() - started
                server, switched = cpu_seconds(process.pid) - before, switches(process.pid) - switched
                stages = {}
                if spy is not None:
                    spy.wait()
                    samples = stage_samples(Path(spy.out))
                    Path(spy.out).unlink(missing_ok=True)
                    # a sample stands for 1/rate s of the lock held; the rest of the server's CPU is outside it
                    stages = {name: 1000 * n / args.rate / max(answered, 1) for name, n in samples.items()}
                    held = sum(stages.values())
                    stages[OUTSIDE] = max(0.0, 1000 * server / max(answered, 1) - held)
                results[shape].append(
                    {
                        "requests_per_s": answered / wall,
                        "server_ms_per_request": 1000 * server / max(answered, 1),
                        "client_ms_per_request": 1000 * (time.process_time() - machine) / max(answered, 1),
                        "switches_per_request": switched / max(answered, 1),
                        "stages": stages,  # server CPU ms per request by stage
                    }
                )
                print(shape, json.dumps(results[shape][-1]), flush=True)
    finally:
        process.terminate()
        process.wait(30)
    report = markdown(results, args, argv)
    print(report)
    if args.out:
        args.out.write_text(report)
        args.out.with_suffix(".json").write_text(json.dumps(results, indent=1))
    return 0


def markdown(results: dict[str, list[dict]], args, argv: list[str]) -> str:
    def median(shape: str, key: str) -> float:
        return statistics.median(r[key] for r in results[shape])

    lines = [
        "# The front door alone: server CPU per request around a null engine",
        "",
        f"command: `python benchmarks/front_door.py {' '.join(argv)}`",
        f"machine: {describe_cpu()}; {args.clients} closed-loop clients in the benchmark's process (on the same "
        f"cores), {args.seconds:.0f} s per shape, medians of {args.repeats}.",
        "",
        "| request | requests/s | server CPU ms per request | server threads' context switches per request | "
        "clients' CPU ms per request |",
        "|---|---|---|---|---|",
    ]
    for shape in results:
        lines.append(
            f"| {shape} | {median(shape, 'requests_per_s'):,.0f} | {median(shape, 'server_ms_per_request'):.3f} | "
            f"{median(shape, 'switches_per_request'):.1f} | {median(shape, 'client_ms_per_request'):.3f} |"
        )
    if any(r["stages"] for rs in results.values() for r in rs):
        names = [*(name for name, _ in STAGES), "other", OUTSIDE]
        lines += ["", "Server CPU ms per request by stage (py-spy --gil: the samples in each stage at its rate; the "]
        lines[-1] += "rest of the process's CPU is outside the interpreter lock):"
        lines += ["", "| stage | " + " | ".join(results) + " |", "|---" * (len(results) + 1) + "|"]
        for name in names:
            cells = [
                f"{statistics.median(r['stages'].get(name, 0.0) for r in results[shape]):.3f}" for shape in results
            ]
            lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
