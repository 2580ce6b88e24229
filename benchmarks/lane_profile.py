"""Where a lane's time goes under load (not a test): the server as it ships (both default models, the cache and
the runaway guard off) under closed-loop gRPC clients of single test_2016_flickr sentences, sampled by py-spy;
each sample of a lane's thread (idle ones left out) goes to the first of ``PARTS`` whose pattern a frame of its
stack matches, innermost first, so the share of the lanes' busy time outside ONNX Runtime's runs is the sum of all
parts but the first.

    python benchmarks/lane_profile.py --data ../shared/data/multi30k --clients 32 --beam 1 --seconds 20
"""

from __future__ import annotations

import argparse
import collections
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from every_core import Side, load, start  # noqa: E402

from runtime.cpu import describe_cpu  # noqa: E402

# A lane's sample is in ONNX Runtime's run when its innermost Python frame is at a line that calls one (py-spy
# shows no native frames): ``Session.run``, ``run_with_iobinding``, or a call of ours to ``.run(``.
RUN_CALL = re.compile(r"\.run\(|run_with_iobinding\(")
# Else its part is the first whose pattern a frame matches, innermost first.
PARTS = [
    ("KV-cache moves", r"\((?:.*/)?runtime/(caches|source_cache)\.py"),
    ("search and stops", r"\((?:.*/)?runtime/(search|stops)\.py"),
    ("rows and feeds", r"\((?:.*/)?runtime/(compact_rows|slotted_rows|layout|batch|binding|bucket_buffers)\.py"),
    ("ONNX Runtime's binding (Python)", r"onnxruntime/"),
    ("engine and backend", r"\((?:.*/)?runtime/(engine|backend|step_graphs|plan)\.py"),
    ("scheduler and answers", r"\((?:.*/)?server/"),
]
RUNS = "ONNX Runtime's runs"
FRAME = re.compile(r"\((.+):(\d+)\)$")


def _source_line(path: str, line: int, cache: dict[str, list[str]]) -> str:
    if path not in cache:
        roots = (ROOT, Path(re.__file__).parent, *map(Path, sys.path))
        found = [root / path for root in roots if (root / path).is_file()]
        cache[path] = found[0].read_text().splitlines() if found else []
    lines = cache[path]
    return lines[line - 1] if 0 < line <= len(lines) else ""


def lane_parts(raw: Path) -> collections.Counter[str]:
    """Samples of the lanes' threads (named "inference-...") by part, from py-spy's raw output with --threads."""
    patterns = [(name, re.compile(pattern)) for name, pattern in PARTS]
    counts: collections.Counter[str] = collections.Counter()
    sources: dict[str, list[str]] = {}
    for text in raw.read_text().splitlines():
        stack, _, count = text.rpartition(" ")
        if not count.isdigit() or "inference-" not in stack.split(";", 1)[0]:
            continue
        frames = stack.split(";")[1:]
        leaf = FRAME.search(frames[-1]) if frames else None
        if leaf and RUN_CALL.search(_source_line(leaf[1], int(leaf[2]), sources)):
            counts[RUNS] += int(count)
            continue
        part = next((name for frame in reversed(frames) for name, p in patterns if p.search(frame)), "other")
        counts[part] += int(count)
    return counts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, required=True, help="the multi30k folder (test_2016_flickr.en.gz)")
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--beam", type=int, default=1)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--rate", type=int, default=200, help="py-spy's samples per second")
    parser.add_argument("--flags", default="", help="more server flags")
    parser.add_argument("--port", type=int, default=52061)
    parser.add_argument("--raw", type=Path, help="keep py-spy's raw samples here")
    args = parser.parse_args(argv)
    spy = Path(sys.executable).with_name("py-spy")
    source = args.data / "test_2016_flickr.en.gz"
    server = start(Side("this", ROOT, args.flags.split()), args.port)
    try:
        with tempfile.TemporaryDirectory() as folder:
            raw = Path(folder) / "raw.txt"
            command = [str(spy), "record", "--pid", str(server.pid), "--duration", str(int(args.seconds) - 4)]
            command += ["--rate", str(args.rate), "--format", "raw", "--threads", "--nonblocking", "--output", str(raw)]
            tokenizer = ROOT / "exported" / "default" / "sentencepiece.model"
            sampler = None

            def sample() -> None:
                nonlocal sampler
                time.sleep(3.0)  # the clients start meanwhile
                sampler = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

            starter = threading.Thread(target=sample)
            starter.start()
            result = load([args.port], f"file:{source}", args.clients, args.beam, args.seconds, tokenizer)
            starter.join()
            sampler.wait()
            counts = lane_parts(raw)
            if args.raw:
                shutil.copy(raw, args.raw)
    finally:
        server.terminate()
        server.wait(30)
    total = sum(counts.values())
    print(f"machine: {describe_cpu()}")
    rate, p99 = result["rps"], result["p99"] * 1000
    print(f"{args.clients} clients, beam {args.beam}: {rate:.0f} requests/s, p99 {p99:.0f} ms")
    print("| part | share of the lanes' busy samples |\n|---|---|")
    for name in [RUNS, *(name for name, _ in PARTS), "other"]:
        print(f"| {name} | {counts[name] / max(total, 1):.1%} |")
    print(f"| **outside ONNX Runtime's runs** | **{1 - counts[RUNS] / max(total, 1):.1%}** |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
